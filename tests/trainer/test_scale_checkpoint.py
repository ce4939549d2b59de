"""Sharded (torch.distributed.checkpoint) checkpoints in one process: the guarantees of the full
format (checksums, fallback to an older checkpoint, keep-N pruning, S3 with meta.json as the mark
of completion) hold for them too. Two ranks writing them: test_scale_distributed.py."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
import torch
from moto import mock_aws

from trainer import checkpoint, optim
from trainer.checkpoint import Checkpointer, CorruptCheckpointWarning, LocalStore, S3Store, Store
from trainer.config import PRESETS
from trainer.model import GPT


def _trained(seed: int) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = GPT(PRESETS["tiny"].model)
    opt = optim.build(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    idx = torch.randint(0, 256, (2, 64))
    model(idx, idx).backward()
    opt.step()
    return model, opt


def _save_sharded(store: Store, steps: list[int], keep: int = 3) -> tuple[Checkpointer, GPT]:
    checkpointer = Checkpointer(store, keep=keep)
    model, opt = _trained(0)
    for step in steps:
        checkpointer.save(step, model, opt, sharded=True, run={"seed": 0})
    return checkpointer, model


def _resumed_equal(checkpointer: Checkpointer, name: str, model: GPT, step: int) -> None:
    fresh, fresh_opt = _trained(1)
    assert checkpointer.resume(name, fresh, fresh_opt) == step
    for a, b in zip(fresh.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert fresh_opt.state_dict()["state"][0]["exp_avg"].abs().sum() > 0


def test_sharded_checkpoints_are_checksummed_pruned_and_skipped_when_corrupt(
    tmp_path: Path,
) -> None:
    checkpointer, model = _save_sharded(LocalStore(tmp_path), [1, 2, 3, 4], keep=2)
    assert checkpointer.store.names() == ["step_00000003", "step_00000004"]
    newest = tmp_path / "step_00000004"
    meta = json.loads((newest / checkpoint.META).read_text())
    assert meta["format"] == checkpoint.FORMAT and meta["run"] == {"seed": 0}
    assert sorted(meta["files"]) == ["shards/.metadata", "shards/__0_0.distcp"]
    shard = newest / "shards" / "__0_0.distcp"
    assert meta["files"]["shards/__0_0.distcp"]["bytes"] == shard.stat().st_size
    assert not list(tmp_path.glob(".staging-*"))
    _resumed_equal(checkpointer, "step_00000004", model, 4)

    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))
    with pytest.warns(
        CorruptCheckpointWarning, match="step_00000004: shards/__0_0.distcp fails its size or CRC"
    ):
        assert checkpointer.newest_valid() == "step_00000003"


@mock_aws
def test_sharded_checkpoints_on_s3(tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    store = S3Store("s3://ckpt/run", client=s3, node_cache=tmp_path / "node")
    checkpointer, model = _save_sharded(store, [1, 2, 3], keep=2)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="ckpt")["Contents"])
    assert keys == [
        f"run/step_0000000{step}/{file}"
        for step in (2, 3)
        for file in ("meta.json", "shards/.metadata", "shards/__0_0.distcp")
    ]
    assert checkpointer.newest_valid() == "step_00000003"
    _resumed_equal(checkpointer, "step_00000003", model, 3)
    assert len(list((tmp_path / "node").rglob("*.distcp"))) == 1  # one node copy, read twice
    store.drop_local_copies()
    assert not (tmp_path / "node").exists()

    # Shards whose meta.json never arrived (a save killed midway) are removed, not resumed.
    s3.delete_object(Bucket="ckpt", Key="run/step_00000003/meta.json")
    assert checkpointer.remove_stale() == ["step_00000003"]
    assert checkpointer.newest_valid() == "step_00000002"
