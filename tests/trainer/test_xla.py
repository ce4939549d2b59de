"""The legacy PyTorch/XLA backend on its CPU device; needs torch_xla (7 GB, not in default CI)."""

import importlib.util
import os
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.xla,
    pytest.mark.skipif(
        importlib.util.find_spec("torch_xla") is None, reason="torch_xla is not installed"
    ),
]


def test_tiny_trains_on_xla_without_recompiling(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", os.environ.get("PJRT_DEVICE", "CPU"))
    import torch_xla.debug.metrics as xla_metrics

    from trainer import metrics
    from trainer.config import TrainConfig
    from trainer.loop import train

    cfg = TrainConfig(
        preset="tiny",
        device="xla",
        data=str(corpus_dir),
        max_steps=2,
        log_every=1,
        metrics=str(tmp_path / "m.jsonl"),
    )
    train(cfg)
    compiles = xla_metrics.metric_data("CompileTime")[0]
    train(TrainConfig(**{**cfg.__dict__, "max_steps": 6, "metrics": str(tmp_path / "m2.jsonl")}))
    # Steps 3-6 reuse the graphs of steps 1-2: the step graph is traced once, not per step.
    assert xla_metrics.metric_data("CompileTime")[0] == compiles
    assert (
        metrics.read(tmp_path / "m2.jsonl")[-1]["loss"]
        < metrics.read(tmp_path / "m2.jsonl")[0]["loss"]
    )


def test_auto_picks_xla_in_the_xla_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_STACK", "xla")
    from trainer import device

    assert device.select("auto") is device.XlaBackend
