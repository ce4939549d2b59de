"""``trn-train report``: loss and throughput of a metrics file, drawn with matplotlib."""

from __future__ import annotations

from pathlib import Path

from trainer import metrics


def plot(metrics_path: str | Path, out: str | Path) -> Path:
    """Draws loss and tokens/s against step into ``out`` (PNG, or any format matplotlib infers
    from the suffix) and returns it.

    Raises:
        ValueError: the metrics file has no records.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    records = metrics.read(metrics_path)
    if not records:
        raise ValueError(f"metrics file {metrics_path} has no records")
    steps = [r["step"] for r in records]
    fig, (ax_loss, ax_tput) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax_loss.plot(steps, [r["loss"] for r in records])
    ax_loss.set_ylabel("loss")
    ax_tput.plot(steps, [r["tokens_per_s"] for r in records])
    ax_tput.set_ylabel("tokens/s")
    ax_tput.set_xlabel("step")
    fig.suptitle(Path(metrics_path).name)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out)
    plt.close(fig)
    return out
