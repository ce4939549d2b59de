"""The default warm-up keeps a short run of the `small` preset stable (issue 36: a 3-step warm-up
let the loss climb above the uniform guess, ln 256, and then recover)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainer import metrics
from trainer.config import PRESETS, WARMUP_FLOOR, TrainConfig
from trainer.loop import train

STEPS_AFTER_WARMUP = 4


@pytest.mark.slow
def test_small_never_climbs_above_the_uniform_guess_after_the_default_warmup(
    corpus_dir: Path, tmp_path: Path
) -> None:
    """A run of the floor plus a few steps, every step logged: its warm-up is the floor (10% of
    the run would be 2 steps), and no later step's loss reaches ln(vocabulary)."""
    cfg = TrainConfig(
        preset="small",
        device="cpu",
        compile="none",
        data=str(corpus_dir),
        max_steps=WARMUP_FLOOR + STEPS_AFTER_WARMUP,
        log_every=1,
        metrics=str(tmp_path / "m.jsonl"),
        peak_flops=1e11,
    )
    assert cfg.warmup == WARMUP_FLOOR
    train(cfg)
    after = [r["loss"] for r in metrics.read(tmp_path / "m.jsonl") if r["step"] > cfg.warmup]
    assert len(after) == STEPS_AFTER_WARMUP
    assert max(after) < math.log(PRESETS["small"].model.vocab_size)
