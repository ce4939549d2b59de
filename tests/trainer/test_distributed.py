"""Two ranks under torchrun (gloo) against one rank accumulating over the same global batch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainer import metrics
from trainer.config import TrainConfig
from trainer.loop import train

STEPS = 6


@pytest.fixture(scope="module")
def one_rank(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    out = tmp_path_factory.mktemp("one-rank") / "m.jsonl"
    cfg = TrainConfig(
        preset="tiny",
        device="cpu",
        compile="none",
        data=str(corpus_dir),
        max_steps=STEPS,
        micro_batch=4,
        grad_accum=2,
        log_every=1,
        metrics=str(out),
        peak_flops=1e11,
    )
    train(cfg)
    return {r["step"]: r["loss"] for r in metrics.read(out)}


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_match_one_rank(
    parallel: str,
    corpus_dir: Path,
    tmp_path: Path,
    trainer_env: dict[str, str],
    one_rank: dict[int, float],
) -> None:
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
    ]
    args = [
        "-m",
        "trainer",
        "run",
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--compile",
        "none",
        "--data",
        str(corpus_dir),
        "--max-steps",
        str(STEPS),
        "--micro-batch",
        "4",
        "--log-every",
        "1",
        "--parallel",
        parallel,
        "--metrics",
        str(tmp_path / "m.jsonl"),
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    ]
    done = subprocess.run(
        [*torchrun, *args],
        env=trainer_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    two = {r["step"]: r["loss"] for r in metrics.read(tmp_path / "m.jsonl")}
    assert two.keys() == one_rank.keys()
    for step, loss in one_rank.items():
        assert two[step] == pytest.approx(loss, rel=1e-5), step
    # The sharded (FSDP) or replicated (DDP) state is gathered into one full checkpoint.
    assert (tmp_path / "ck" / f"step_{STEPS:08d}" / "meta.json").is_file()
