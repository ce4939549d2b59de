from pathlib import Path

import boto3
import pytest
import torch
from moto import mock_aws

from trainer import optim
from trainer.checkpoint import (
    Checkpointer,
    CheckpointError,
    CorruptCheckpointWarning,
    LocalStore,
    S3Store,
    Store,
)
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


def _same(a: GPT, b: GPT) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def _save_steps(store: Store, steps: list[int], keep: int = 3) -> tuple[Checkpointer, GPT]:
    checkpointer = Checkpointer(store, keep=keep)
    model, opt = _trained(0)
    for step in steps:
        checkpointer.save(step, model, opt)
    return checkpointer, model


def test_round_trip_restores_model_optimizer_and_step(tmp_path: Path) -> None:
    checkpointer, model = _save_steps(LocalStore(tmp_path), [5])
    found = checkpointer.newest_valid()
    assert found is not None
    fresh, fresh_opt = _trained(1)
    assert not _same(fresh, model)
    assert Checkpointer.restore(found[1], fresh, fresh_opt) == 5
    assert _same(fresh, model)
    assert set(fresh_opt.state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}


def test_keeps_the_last_n(tmp_path: Path) -> None:
    checkpointer, _ = _save_steps(LocalStore(tmp_path), [1, 2, 3, 4], keep=2)
    assert checkpointer.store.names() == ["step_00000003", "step_00000004"]


def test_corrupt_newest_falls_back_to_previous_with_a_warning(tmp_path: Path) -> None:
    checkpointer, _ = _save_steps(LocalStore(tmp_path), [10, 20])
    state = tmp_path / "step_00000020" / "state.pt"
    raw = bytearray(state.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    state.write_bytes(bytes(raw))
    with pytest.warns(CorruptCheckpointWarning, match="step_00000020.*CRC-32"):
        found = checkpointer.newest_valid()
    assert found is not None and found[0] == "step_00000010" and found[1]["step"] == 10


def test_unfinished_checkpoint_is_invisible(tmp_path: Path) -> None:
    checkpointer, _ = _save_steps(LocalStore(tmp_path), [1])
    (tmp_path / ".staging-crashed").mkdir()
    (tmp_path / "step_00000002").mkdir()  # no meta.json: never completed
    assert checkpointer.store.names() == ["step_00000001"]


def test_truncated_checkpoint_raises_naming_it(tmp_path: Path) -> None:
    checkpointer, _ = _save_steps(LocalStore(tmp_path), [3])
    state = tmp_path / "step_00000003" / "state.pt"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="checkpoint step_00000003"):
        checkpointer.read_valid("step_00000003")


@mock_aws
def test_s3_store_round_trip_and_pruning() -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    checkpointer, model = _save_steps(S3Store("s3://ckpt/run-1/", client=s3), [1, 2, 3, 4], keep=2)
    assert checkpointer.store.names() == ["step_00000003", "step_00000004"]
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="ckpt")["Contents"])
    assert keys[0] == "run-1/step_00000003/meta.json"
    found = checkpointer.newest_valid()
    assert found is not None and found[1]["step"] == 4
    fresh, fresh_opt = _trained(1)
    Checkpointer.restore(found[1], fresh, fresh_opt)
    assert _same(fresh, model)
