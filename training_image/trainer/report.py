"""``trn-train report``: loss (train and eval) and throughput of a metrics file, drawn with
matplotlib."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer import metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def title(metrics_path: str | Path, records: list[dict[str, Any]]) -> str:
    """The file's name and the precision of its run (of its last record: a resumed run writes
    later records with its own), e.g. ``m.jsonl (bf16 matmult auto-cast)``; the name alone
    for records written before the trainer logged its precision."""
    name = Path(metrics_path).name
    precision = records[-1].get("precision") if records else None
    return f"{name} ({precision})" if precision else name


def figure(metrics_path: str | Path) -> Figure:
    """Loss (labelled ``train``, and ``eval`` when the file has eval records) and tokens/s
    against step, titled by :func:`title`.

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
    ax_loss.plot(steps, [r["loss"] for r in records], label="train")
    evals = [r for r in metrics.read(metrics_path, metrics.EVAL) if r["eval_loss"] is not None]
    if evals:
        ax_loss.plot(
            [r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="eval"
        )
        ax_loss.legend()
    ax_loss.set_ylabel("loss")
    ax_tput.plot(steps, [r["tokens_per_s"] for r in records])
    ax_tput.set_ylabel("tokens/s")
    ax_tput.set_xlabel("step")
    fig.suptitle(title(metrics_path, records))
    fig.tight_layout()
    return fig


def plot(metrics_path: str | Path, out: str | Path) -> Path:
    """Saves :func:`figure` into ``out`` (PNG, or any format matplotlib infers from the suffix)
    and returns it.

    Raises:
        ValueError: the metrics file has no records.
    """
    import matplotlib.pyplot as plt

    fig = figure(metrics_path)
    out = Path(out)
    fig.savefig(out)
    plt.close(fig)
    return out
