"""The mask stream: format-1 directories still load, the sampler's -100 targets, the loss over
trained targets only, and a step with no trained target."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer import data, metrics
from trainer.checkpoint import Checkpointer, LocalStore
from trainer.config import PRESETS, TrainConfig
from trainer.loop import train
from trainer.model import GPT

IDENTITY = {"tokenizer": "test", "tokenizer_sha256": "0" * 64, "eos_token_id": 0}


def _masked_dataset(out: Path, tokens: np.ndarray, mask: np.ndarray, **kwargs: object) -> Path:
    data.write_split_dataset(
        out,
        [(tokens, mask)],
        vocab_size=256,
        identity=IDENTITY,
        **kwargs,  # type: ignore[arg-type]
    )
    return out


def test_a_format_1_directory_loads_unchanged(tmp_path: Path) -> None:
    """Written byte by byte as format 1 was (header, manifest fields): the same tokens and
    targets as before, no masks, no held-out split."""
    tokens = np.arange(100, dtype="<u2")
    header = data.HEADER.pack(b"TRNSHRD1", 1, 2, tokens.size)
    (tmp_path / "shard_00000.bin").write_bytes(header + tokens.tobytes())
    digest = data._sha256(tmp_path / "shard_00000.bin")
    manifest = {
        "format_version": 1,
        "tokenizer": "bytes-v1",
        "vocab_size": 256,
        "dtype": "uint16",
        "shards": [{"name": "shard_00000.bin", "tokens": 100, "sha256": digest}],
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    dataset = data.open_dataset(tmp_path)
    assert dataset.masks is None and dataset.eval_split is None
    sampler = data.WindowSampler(dataset, seq_len=8, micro_batch=3, seed=1)
    x, y = sampler.batch(0)
    assert torch.equal(y[:, :-1], x[:, 1:]) and int(y.min()) >= 0
    assert sampler.trained_targets(0) == 3 * 8


def test_sampler_sets_minus_100_exactly_where_the_mask_is_0(tmp_path: Path) -> None:
    tokens = np.arange(200) % 250
    mask = (np.arange(200) % 3 == 0).astype(np.uint8)
    dataset = data.open_dataset(_masked_dataset(tmp_path, tokens, mask, eval_fraction=0))
    x, y = data.WindowSampler(dataset, seq_len=16, micro_batch=4, seed=5).batch(2)
    for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
        start = row_x[0]  # token i is i here: the window's offset
        for j, target in enumerate(row_y):
            position = start + 1 + j
            assert target == (position if mask[position] else data.IGNORE_INDEX)


def test_loss_is_the_mean_over_trained_targets(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, 500)
    mask = (rng.random(500) < 0.4).astype(np.uint8)
    dataset = data.open_dataset(_masked_dataset(tmp_path, tokens, mask, eval_fraction=0))
    cfg = PRESETS["tiny"].model
    x, y = data.WindowSampler(dataset, seq_len=cfg.seq_len, micro_batch=4, seed=0).batch(0)
    torch.manual_seed(0)
    model = GPT(cfg)
    captured: list[torch.Tensor] = []
    model.head.register_forward_hook(lambda module, args, out: captured.append(out))
    with torch.no_grad():
        loss = model(x, y)
        # Independently: the model's logits, log-softmax, and the mean over trained targets.
        (logits,) = captured
        log_probs = torch.log_softmax(logits.double(), dim=-1)
        keep = y != data.IGNORE_INDEX
        expected = -log_probs[keep].gather(1, y[keep].unsqueeze(1)).mean()
    assert 0 < int(keep.sum()) < keep.numel()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)


def test_a_step_with_every_target_masked_trains_without_nan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = np.arange(400) % 256
    mask = np.zeros(400, dtype=np.uint8)
    root = _masked_dataset(tmp_path / "d", tokens, mask, eval_fraction=0)
    cfg = TrainConfig(
        preset="tiny",
        device="cpu",
        compile="none",
        data=str(root),
        max_steps=2,
        log_every=1,
        checkpoint_dir=str(tmp_path / "ck"),
    )
    result = train(cfg)
    assert result.last_loss == 0.0
    # A masked stream is conversations prepared before they were kept whole: the run says so.
    assert "is a masked token stream" in capsys.readouterr().err
    state = Checkpointer(LocalStore(tmp_path / "ck")).load("step_00000002")
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_eval_of_batches_without_trained_targets_is_none_not_nan(tmp_path: Path) -> None:
    from trainer import device, parallel
    from trainer.causal_lm import evaluate

    root = _masked_dataset(
        tmp_path, np.arange(300) % 256, np.zeros(300, np.uint8), eval_fraction=0.5
    )
    held_out = data.open_dataset(root).eval_split
    assert held_out is not None
    sampler = data.WindowSampler(held_out, seq_len=64, micro_batch=2, seed=0)
    model = GPT(PRESETS["tiny"].model)
    backend = device.resolve("cpu", compile_backend="none", local_rank=0)
    backend.start()
    ranks = parallel.ranks_from_env()
    assert evaluate(model, sampler, 2, backend, ranks) == (None, 0)


def test_a_mask_that_fails_its_checksum_is_named(tmp_path: Path) -> None:
    root = _masked_dataset(tmp_path, np.arange(50), np.ones(50, dtype=np.uint8), eval_fraction=0)
    raw = bytearray((root / "shard_00000.mask").read_bytes())
    raw[-1] = 0
    (root / "shard_00000.mask").write_bytes(bytes(raw))
    with pytest.raises(data.ShardError, match=r"shard_00000.mask: checksum mismatch"):
        data.open_dataset(root)


def test_a_masked_manifest_without_a_mask_entry_is_refused(tmp_path: Path) -> None:
    root = _masked_dataset(tmp_path, np.arange(50), np.ones(50, dtype=np.uint8), eval_fraction=0)
    manifest = json.loads((root / "manifest.json").read_text())
    del manifest["shards"][0]["mask"]
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(data.ShardError, match=r"shard_00000.bin: the manifest gives it no mask"):
        data.open_dataset(root)


def test_an_unknown_manifest_version_is_refused(tmp_path: Path) -> None:
    root = _masked_dataset(tmp_path, np.arange(50), np.ones(50, dtype=np.uint8), eval_fraction=0)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["format_version"] = 4
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(data.ShardError, match=r"format_version 4 is unknown; this trainer reads"):
        data.open_dataset(root)


def test_step_loss_is_the_mean_over_the_steps_trained_targets(tmp_path: Path) -> None:
    """Two micro-steps with different numbers of trained targets: the logged loss of step 1 is
    the sum of -log p over every trained target of both, over their count (computed here from
    the same initial weights), not the mean of the two micro-batch means."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 256, 2000)
    mask = (rng.random(2000) < 0.3).astype(np.uint8)
    root = _masked_dataset(tmp_path / "d", tokens, mask, eval_fraction=0)
    cfg = TrainConfig(
        preset="tiny",
        device="cpu",
        compile="none",
        data=str(root),
        max_steps=1,
        log_every=1,
        micro_batch=2,
        grad_accum=2,
        seed=4,
        metrics=str(tmp_path / "m.jsonl"),
    )
    train(cfg)
    (record,) = metrics.read(tmp_path / "m.jsonl")

    sampler = data.WindowSampler(
        data.open_dataset(root), seq_len=64, micro_batch=2, seed=4, grad_accum=2
    )
    torch.manual_seed(4)
    model = GPT(PRESETS["tiny"].model)
    captured: list[torch.Tensor] = []
    model.head.register_forward_hook(lambda module, args, out: captured.append(out))
    total, count, means = 0.0, 0, []
    with torch.no_grad():
        for micro in range(2):
            x, y = sampler.batch(0, micro)
            means.append(float(model(x, y)))
            log_probs = torch.log_softmax(captured.pop().double(), dim=-1)
            keep = y != data.IGNORE_INDEX
            total -= float(log_probs[keep].gather(1, y[keep].unsqueeze(1)).sum())
            count += int(keep.sum())
    assert count == sampler.trained_targets(0)
    assert record["loss"] == pytest.approx(total / count, rel=1e-5)
    assert record["loss"] != pytest.approx(sum(means) / 2, rel=1e-5)
