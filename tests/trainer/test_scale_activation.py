"""Activation checkpointing per transformer block: the same losses, the blocks really recomputed."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer import cli, metrics, model
from trainer.config import AUTO_CHECKPOINT_PARAMS, TrainConfig
from trainer.loop import train
from trainer.model_spec import model_config

STEPS = 2


def _run(corpus_dir: Path, out: Path, setting: str, **extra: Any) -> list[dict[str, Any]]:
    cfg = TrainConfig(
        preset="tiny",
        device="cpu",
        compile="none",
        data=str(corpus_dir),
        max_steps=STEPS,
        micro_batch=2,
        log_every=1,
        metrics=str(out),
        activation_checkpointing=setting,
        **extra,
    )
    train(cfg)
    return metrics.read(out)


def _counting_blocks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records, for each call of a block's forward, whether autograd was recording: the
    recomputation in backward runs with gradients on, like the first forward, so the calls are
    counted rather than told apart."""
    calls: list[bool] = []
    forward: Callable[..., torch.Tensor] = model.Block.forward

    def counted(self: model.Block, *args: Any) -> torch.Tensor:
        calls.append(torch.is_grad_enabled())
        return forward(self, *args)

    monkeypatch.setattr(model.Block, "forward", counted)
    return calls


def test_checkpointed_blocks_run_again_in_backward_with_the_same_losses(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _counting_blocks(monkeypatch)
    plain = _run(corpus_dir, tmp_path / "off.jsonl", "off", grad_accum=2)
    layers = model_config(TrainConfig()).n_layer
    assert len(calls) == STEPS * 2 * layers  # one forward per block and micro-step
    calls.clear()
    checkpointed = _run(corpus_dir, tmp_path / "on.jsonl", "on", grad_accum=2)
    assert len(calls) == 2 * STEPS * 2 * layers  # and once more in each backward
    for a, b in zip(plain, checkpointed, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-6)


def test_auto_checkpoints_models_above_the_threshold() -> None:
    auto = TrainConfig()
    assert not auto.checkpoints_blocks(AUTO_CHECKPOINT_PARAMS)
    assert auto.checkpoints_blocks(AUTO_CHECKPOINT_PARAMS + 1)
    assert TrainConfig(activation_checkpointing="on").checkpoints_blocks(10)
    assert not TrainConfig(activation_checkpointing="off").checkpoints_blocks(10**10)
    args = cli._parser().parse_args(["run", "--data", "d", "--activation-checkpointing", "on"])
    assert cli.train_config(args).activation_checkpointing == "on"
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["run", "--data", "d", "--activation-checkpointing", "yes"])


def test_an_unknown_setting_is_refused(corpus_dir: Path) -> None:
    cfg = TrainConfig(data=str(corpus_dir), activation_checkpointing="always")
    with pytest.raises(
        ValueError,
        match=re.escape("activation_checkpointing 'always' is not one of on, off, auto"),
    ):
        cfg.validate()
