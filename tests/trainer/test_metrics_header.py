"""The run header: the first record of a run's metrics, which ``trnctl compare`` reads."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch

from trainer import metrics
from trainer.config import TrainConfig, preset
from trainer.loop import train
from trainer.model import GPT


def _config(corpus_dir: Path, tmp_path: Path, **overrides: object) -> TrainConfig:
    options: dict[str, object] = {
        "preset": "tiny",
        "device": "cpu",
        "compile": "none",
        "data": str(corpus_dir),
        "max_steps": 4,
        "log_every": 2,
        "micro_batch": 3,
        "metrics": str(tmp_path / "m.jsonl"),
        "peak_flops": 2e11,
    }
    options.update(overrides)
    return TrainConfig(**options)  # type: ignore[arg-type]


def test_a_cpu_run_opens_its_metrics_with_the_run_header(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRN_INSTANCE_TYPE", "trn2.48xlarge")
    before = datetime.now(UTC)
    train(_config(corpus_dir, tmp_path))
    after = datetime.now(UTC)

    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    started_at = datetime.fromisoformat(header.pop("started_at"))
    assert started_at.utcoffset() is not None and before <= started_at <= after
    tiny = preset("tiny").model
    with torch.device("meta"):
        flops_per_token = GPT(tiny).flops_per_token()
    assert header == {
        "kind": "run",
        "instance_type": "trn2.48xlarge",
        "nodes": 1,
        "world_size": 1,
        "device": "cpu",
        "precision": "fp32",
        "model": "tiny",
        "global_batch_tokens": tiny.seq_len * 3,
        "seq_len": tiny.seq_len,
        "flops_per_token": flops_per_token,
        "peak_flops_per_rank": 2e11,
        "settings": {
            "lr": 3e-3,
            "weight_decay": 0.1,
            "lora": None,
            "frozen_dtype": None,
            "compile": "none",
        },
    }
    records = metrics.read(tmp_path / "m.jsonl")
    assert [r["step"] for r in records] == [2, 4]
    # The header's figures are the ones the records' MFU is computed from.
    for record in records:
        expected = record["tokens_per_s"] * flops_per_token / 2e11
        assert record["mfu"] == pytest.approx(expected)
    elapsed = [r["elapsed_s"] for r in records]
    assert 0 < elapsed[0] < elapsed[1] <= (after - started_at).total_seconds()


def test_a_local_run_has_no_instance_type_and_a_resume_writes_a_second_header(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRN_INSTANCE_TYPE", raising=False)
    checkpoints = str(tmp_path / "ck")
    train(_config(corpus_dir, tmp_path, max_steps=2, checkpoint_dir=checkpoints))
    train(_config(corpus_dir, tmp_path, max_steps=2, checkpoint_dir=checkpoints))
    headers = metrics.headers(tmp_path / "m.jsonl")
    assert len(headers) == 2
    assert {h["instance_type"] for h in headers} == {None}
    assert [r["step"] for r in metrics.read(tmp_path / "m.jsonl")] == [2]


def test_a_log_without_a_header_writes_records_as_given(tmp_path: Path) -> None:
    log = metrics.MetricsLog(str(tmp_path / "m.jsonl"), total_steps=1, progress=False)
    log.write({"step": 1, "loss": 2.0})
    log.close()
    assert (tmp_path / "m.jsonl").read_text() == '{"step": 1, "loss": 2.0}\n'
    assert metrics.headers(tmp_path / "m.jsonl") == []
