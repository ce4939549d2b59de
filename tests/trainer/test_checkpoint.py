import ast
import json
import os
import struct
import subprocess
import sys
import tracemalloc
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch
import torch_save_checkpoint
from moto import mock_aws
from torch import nn
from torch.distributed.checkpoint import CheckpointException

from tests import warm
from tests.conftest import ROOT
from tests.s3_writes import S3Writes, Stopped
from trainer import checkpoint, optim
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


# The data file of a checkpoint one process wrote (torch.distributed.checkpoint's name).
SHARD = "shards/__0_0.distcp"


def _save_steps(store: Store, steps: list[int], keep: int = 3) -> tuple[Checkpointer, GPT]:
    checkpointer = Checkpointer(store, keep=keep)
    model, opt = _trained(0)
    for step in steps:
        checkpointer.save(step, model, opt)
    return checkpointer, model


def test_round_trip_restores_model_optimizer_and_step(tmp_path: Path) -> None:
    checkpointer, model = _save_steps(LocalStore(tmp_path), [5])
    name = checkpointer.newest_valid()
    assert name == "step_00000005"
    fresh, fresh_opt = _trained(1)
    assert not _same(fresh, model)
    assert checkpointer.resume(name, fresh, fresh_opt) == 5
    assert _same(fresh, model)
    assert set(fresh_opt.state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}


def _mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """Address ranges of this process that map ``path`` (Linux /proc/self/maps)."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path.resolve()):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def test_load_reads_the_whole_state_from_the_checkpoint_alone(tmp_path: Path) -> None:
    """Without a model to shape it (an export): the state as it was saved, the optimizer's
    parameter groups (lists in the state) included, or the parts asked for alone."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    checkpointer, model = _save_steps(LocalStore(tmp_path), [5])
    model, opt = _trained(0)
    options = StateDictOptions(full_state_dict=True)

    state = checkpointer.load("step_00000005")

    assert sorted(state) == ["model", "optimizer", "rng", "step"] and state["step"] == 5
    expected = get_optimizer_state_dict(model, opt, options=options)
    assert state["optimizer"]["param_groups"] == expected["param_groups"]
    assert sorted(state["optimizer"]["state"]) == sorted(expected["state"])
    for fqn, moments in expected["state"].items():
        for key, value in moments.items():
            assert torch.equal(state["optimizer"]["state"][fqn][key], value), (fqn, key)
    for fqn, value in get_model_state_dict(model, options=options).items():
        assert torch.equal(state["model"][fqn], value), fqn
    assert sorted(checkpointer.load("step_00000005", parts=("model",))) == ["model", "step"]


def _mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """Address ranges of this process that map ``path`` (Linux /proc/self/maps)."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path.resolve()):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def test_an_earlier_trainers_torch_save_checkpoint_resumes_and_loads_mapped(
    tmp_path: Path,
) -> None:
    """A checkpoint of the format before DCP (state.pt) is verified, resumed and loaded (every
    tensor in a memory map of state.pt, which the ranks of a node share); the next save writes
    the one format."""
    model, opt = _trained(0)
    folder = torch_save_checkpoint.write(tmp_path, 5, model, opt, run={"seed": 0})
    checkpointer = Checkpointer(LocalStore(tmp_path))
    assert checkpointer.newest_valid() == "step_00000005"
    assert checkpointer.format_of("step_00000005") == checkpoint.FORMAT_TORCH_SAVE
    assert checkpointer.run_of("step_00000005") == {"seed": 0}

    fresh, fresh_opt = _trained(1)
    assert checkpointer.resume("step_00000005", fresh, fresh_opt) == 5
    assert _same(fresh, model)
    assert set(fresh_opt.state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}

    state = checkpointer.load("step_00000005")
    ranges = _mapped_ranges(folder / "state.pt")
    tensors = [*state["model"].values(), state["rng"]]
    tensors += [t for s in state["optimizer"]["state"].values() for t in s.values()]
    assert ranges
    assert all(any(a <= t.data_ptr() < b for a, b in ranges) for t in tensors if t.numel())

    raw = bytearray((folder / "state.pt").read_bytes())
    raw[len(raw) // 2] ^= 0x01
    (folder / "state.pt").write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"step_00000005: state.pt fails .*CRC-32"):
        checkpointer.verify("step_00000005")

    checkpointer.save(6, fresh, fresh_opt)
    assert checkpointer.format_of("step_00000006") == checkpoint.FORMAT
    assert not (tmp_path / "step_00000006" / "state.pt").exists()


def test_a_checkpoint_of_a_format_it_does_not_read_is_refused_naming_it(tmp_path: Path) -> None:
    checkpointer, _ = _save_steps(LocalStore(tmp_path), [1, 2])
    meta_path = tmp_path / "step_00000002" / checkpoint.META
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(meta | {"format": "trn-train-checkpoint-dcp-v9"}))
    refused = (
        r"checkpoint step_00000002: format 'trn-train-checkpoint-dcp-v9' is not one this trainer "
        r"reads \('trn-train-checkpoint-dcp-v1', or 'trn-train-checkpoint-v1' from earlier "
        r"trainers\); a newer trainer wrote it"
    )
    fresh, fresh_opt = _trained(1)
    for read in (
        lambda: checkpointer.verify("step_00000002"),
        lambda: checkpointer.load("step_00000002", verify=False),
        lambda: checkpointer.resume("step_00000002", fresh, fresh_opt, verify=False),
    ):
        with pytest.raises(CheckpointError, match=refused):
            read()
    with pytest.warns(CorruptCheckpointWarning, match=f"skipping {refused}"):
        assert checkpointer.newest_valid() == "step_00000001"


def _big(tmp_path: Path) -> tuple[Checkpointer, nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(2048, 2048, bias=False)  # 16 MiB of weights, 16 MiB of momentum
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 2048)).sum().backward()
    opt.step()
    checkpointer = Checkpointer(LocalStore(tmp_path))
    checkpointer.save(1, model, opt)
    return checkpointer, model, opt


def test_checking_and_resuming_stream_the_file(tmp_path: Path) -> None:
    """The CRC is read a chunk at a time and DCP reads into the model's own tensors, so the
    Python heap never holds the checkpoint (tracemalloc sees bytes objects, not tensors)."""
    checkpointer, model, _ = _big(tmp_path)
    size = sum(p.stat().st_size for p in (tmp_path / "step_00000001").rglob("*") if p.is_file())
    fresh = nn.Linear(2048, 2048, bias=False)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)

    tracemalloc.start()
    try:
        name = checkpointer.newest_valid()
        assert name is not None
        step = checkpointer.resume(name, fresh, fresh_opt)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert step == 1
    assert torch.equal(fresh.weight, model.weight)
    assert peak < size // 2, f"peak {peak} bytes for a {size}-byte checkpoint"


@pytest.mark.parametrize("sharded", [False, True])
def test_every_file_is_synced_before_the_checkpoint_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sharded: bool
) -> None:
    """DCP writes without syncing; each file meta.json lists, and their folder, reach the disk
    before the staging directory is renamed into place."""
    events: list[str] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        events.append(f"sync {os.readlink(f'/proc/self/fd/{fd}')}")
        real_fsync(fd)

    def rename(src: str | Path, dst: str | Path) -> None:
        events.append(f"rename {src}")
        real_rename(src, dst)

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    monkeypatch.setattr(checkpoint.os, "rename", rename)
    model, opt = _trained(0)
    Checkpointer(LocalStore(tmp_path)).save(1, model, opt, sharded=sharded)

    published = next(
        i
        for i, e in enumerate(events)
        if e.startswith("rename ") and ".staging-" in e.rsplit("/", 1)[-1]
    )
    staged = events[published].removeprefix("rename ")
    meta = json.loads((tmp_path / "step_00000001" / checkpoint.META).read_text())
    for file in [*meta["files"], checkpoint.SHARDS, checkpoint.META]:
        assert f"sync {staged}/{file}" in events[:published], file


def test_keeps_the_last_n(tmp_path: Path) -> None:
    checkpointer, _ = _save_steps(LocalStore(tmp_path), [1, 2, 3, 4], keep=2)
    assert checkpointer.store.names() == ["step_00000003", "step_00000004"]


def test_corrupt_newest_falls_back_to_previous_with_a_warning(tmp_path: Path) -> None:
    checkpointer, _ = _save_steps(LocalStore(tmp_path), [10, 20])
    state = tmp_path / "step_00000020" / SHARD
    raw = bytearray(state.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    state.write_bytes(bytes(raw))
    with pytest.warns(CorruptCheckpointWarning, match="step_00000020.*CRC-32"):
        name = checkpointer.newest_valid()
    assert name == "step_00000010"
    assert checkpointer.load(name)["step"] == 10
    with pytest.raises(CheckpointError, match=r"step_00000020.*CRC-32"):
        checkpointer.load("step_00000020")
    # A rank that loads what the main rank verified checks format and size only.
    assert checkpointer.load("step_00000010", verify=False)["step"] == 10


class _Unwritable(LocalStore):
    """A store whose staging directory is a file: DCP fails to write into it."""

    def staging(self) -> Path:
        staged = self.root / "staged"
        staged.write_text("a file where the staging directory would be")
        return staged


def _byteorder_record_crcs(shards: bytes) -> set[int]:
    """The CRC-32 fields of the central-directory entries (signature PK\\x01\\x02: CRC at byte 16,
    name length at 28, name at 46) of the ``byteorder`` record every torch.save archive in
    ``shards`` holds."""
    crcs, at = set(), shards.find(b"PK\x01\x02")
    while at != -1:
        (size,) = struct.unpack_from("<H", shards, at + 28)
        if shards[at + 46 : at + 46 + size].endswith(b"/byteorder"):
            crcs.add(struct.unpack_from("<I", shards, at + 16)[0])
        at = shards.find(b"PK\x01\x02", at + 4)
    return crcs


@pytest.mark.parametrize("before", [True, False])
def test_a_save_leaves_torch_saves_record_crc_option_as_it_found_it(
    tmp_path: Path, before: bool
) -> None:
    """A save turns torch.save's CRC of each zip record off while DCP writes (meta.json's CRC
    of each file covers the bytes); the process-wide option is put back afterwards, also when
    the save fails."""
    model, opt = _trained(0)
    torch.serialization.set_crc32_options(before)
    try:
        Checkpointer(LocalStore(tmp_path / "ok")).save(1, model, opt)
        assert torch.serialization.get_crc32_options() is before
        shards = b"".join(p.read_bytes() for p in sorted((tmp_path / "ok").rglob("*.distcp")))
        assert _byteorder_record_crcs(shards) == {0}  # on, it would be CRC-32(b"little")
        with pytest.raises(CheckpointException, match="Not a directory"):
            Checkpointer(_Unwritable(tmp_path / "failing")).save(1, model, opt)
        assert torch.serialization.get_crc32_options() is before
    finally:
        torch.serialization.set_crc32_options(True)


def test_unfinished_checkpoint_is_invisible(tmp_path: Path) -> None:
    checkpointer, _ = _save_steps(LocalStore(tmp_path), [1])
    (tmp_path / ".staging-crashed").mkdir()
    (tmp_path / "step_00000002").mkdir()  # no meta.json: never completed
    assert checkpointer.store.names() == ["step_00000001"]


def test_truncated_checkpoint_raises_naming_it(tmp_path: Path) -> None:
    checkpointer, _ = _save_steps(LocalStore(tmp_path), [3])
    state = tmp_path / "step_00000003" / SHARD
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="checkpoint step_00000003"):
        checkpointer.verify("step_00000003")
    with pytest.raises(CheckpointError, match="checkpoint step_00000003"):
        checkpointer.load("step_00000003", verify=False)


def test_stale_staging_is_removed_when_the_writer_starts(tmp_path: Path) -> None:
    checkpointer, _ = _save_steps(LocalStore(tmp_path), [1])
    crashed = tmp_path / ".staging-crashed"
    crashed.mkdir()
    (crashed / "state.pt").write_bytes(b"x" * 4096)  # a save killed midway

    removed = checkpointer.remove_stale()

    assert removed == [".staging-crashed"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001"]
    assert checkpointer.store.names() == ["step_00000001"]


def test_saving_again_at_a_step_replaces_the_checkpoint(tmp_path: Path) -> None:
    checkpointer = Checkpointer(LocalStore(tmp_path))
    first, first_opt = _trained(0)
    second, second_opt = _trained(1)
    checkpointer.save(5, first, first_opt)

    checkpointer.save(5, second, second_opt)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000005"]
    fresh, fresh_opt = _trained(2)
    checkpointer.resume("step_00000005", fresh, fresh_opt)
    assert _same(fresh, second)


def test_a_kill_while_replacing_a_checkpoint_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replacing step_5 never deletes the old step_5 before the new one is in place: killed
    between the two renames, the next start puts the old one back."""
    checkpointer = Checkpointer(LocalStore(tmp_path))
    first, first_opt = _trained(0)
    second, second_opt = _trained(1)
    checkpointer.save(5, first, first_opt)
    real_rename = os.rename

    def killed_moving_the_new_one_in(src: str | Path, dst: str | Path) -> None:
        if Path(src).name.startswith(".staging-"):
            raise KeyboardInterrupt("killed")
        real_rename(src, dst)

    monkeypatch.setattr(checkpoint.os, "rename", killed_moving_the_new_one_in)
    with pytest.raises(KeyboardInterrupt):
        checkpointer.save(5, second, second_opt)
    monkeypatch.setattr(checkpoint.os, "rename", real_rename)

    restarted = Checkpointer(LocalStore(tmp_path))
    restarted.remove_stale()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000005"]
    assert restarted.newest_valid() == "step_00000005"
    fresh, fresh_opt = _trained(2)
    restarted.resume("step_00000005", fresh, fresh_opt)
    assert _same(fresh, first)


@mock_aws
def test_s3_store_round_trip_and_pruning() -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    checkpointer, model = _save_steps(S3Store("s3://ckpt/run-1/", client=s3), [1, 2, 3, 4], keep=2)
    assert checkpointer.store.names() == ["step_00000003", "step_00000004"]
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="ckpt")["Contents"])
    assert keys[0] == "run-1/step_00000003/meta.json"
    name = checkpointer.newest_valid()
    assert name == "step_00000004"
    fresh, fresh_opt = _trained(1)
    assert checkpointer.resume(name, fresh, fresh_opt) == 4
    assert _same(fresh, model)
    assert checkpointer.store.remove_stale() == []


@mock_aws
def test_s3_store_removes_a_state_whose_upload_was_killed() -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    checkpointer, _ = _save_steps(S3Store("s3://ckpt/run-1", client=s3), [1])
    s3.put_object(Bucket="ckpt", Key=f"run-1/step_00000002/{SHARD}", Body=b"partial")

    assert checkpointer.remove_stale() == ["step_00000002"]

    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="ckpt")["Contents"])
    assert keys == [
        f"run-1/step_00000001/{file}" for file in ("meta.json", "shards/.metadata", SHARD)
    ]


def _model_files(root: Path) -> tuple[Path, ...]:
    """Two small files a run from a model directory carries in each checkpoint."""
    root.mkdir()
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "tokenizer.json").write_text("{}")
    return (root / "config.json", root / "tokenizer.json")


def _listed(meta: dict[str, Any]) -> list[str]:
    """Every file ``meta`` (a meta.json) vouches for, as paths in the checkpoint."""
    return list(meta["files"]) + [
        f"{checkpoint.MODEL_FILES}/{f}" for f in meta.get("model_files", [])
    ]


@mock_aws
@pytest.mark.parametrize("sharded", [False, True])
def test_s3_uploads_meta_json_after_every_file_it_lists(tmp_path: Path, sharded: bool) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    checkpointer = Checkpointer(
        S3Store("s3://ckpt/run", client=s3), model_files=_model_files(tmp_path / "model")
    )
    model, opt = _trained(0)
    writes = S3Writes(s3)

    checkpointer.save(3, model, opt, sharded=sharded)

    meta = json.loads(
        s3.get_object(Bucket="ckpt", Key="run/step_00000003/meta.json")["Body"].read()
    )
    listed = [f"run/step_00000003/{file}" for file in _listed(meta)]
    assert len(listed) == 4
    assert sorted(writes.puts[:-1]) == sorted(listed)
    assert writes.puts[-1] == "run/step_00000003/meta.json"


@mock_aws
@pytest.mark.parametrize("stop_at", [1, 2, 3, 5])
def test_a_save_stopped_between_two_uploads_is_never_resumed_nor_kept(
    tmp_path: Path, stop_at: int
) -> None:
    """Stopped before its first or second model file, its state's first file or its meta.json
    reached S3, checkpoint 2 is not among the checkpoints, the next start removes what it left
    and resumes step 1."""
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    files = _model_files(tmp_path / "model")
    store = S3Store("s3://ckpt/run", client=s3, node_cache=tmp_path / "node")
    model, opt = _trained(0)
    Checkpointer(store, model_files=files).save(1, model, opt)
    writes = S3Writes(s3, stop_at=stop_at)
    other, other_opt = _trained(1)
    with pytest.raises(Stopped):
        Checkpointer(store, model_files=files).save(2, other, other_opt)
    writes.close()
    assert len(writes.puts) == stop_at - 1

    restarted = Checkpointer(S3Store("s3://ckpt/run", client=s3, node_cache=tmp_path / "n2"))
    assert restarted.store.names() == ["step_00000001"]
    assert restarted.remove_stale() == (["step_00000002"] if writes.puts else [])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptCheckpointWarning)
        assert restarted.newest_valid() == "step_00000001"
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="ckpt")["Contents"]}
    assert not any(key.startswith("run/step_00000002/") for key in keys)
    fresh, fresh_opt = _trained(2)
    assert restarted.resume("step_00000001", fresh, fresh_opt) == 1
    assert _same(fresh, model)


@mock_aws
def test_a_save_again_at_a_step_stopped_midway_leaves_no_meta_json_vouching_for_it(
    tmp_path: Path,
) -> None:
    """A run resumed from step 1 saves step 2 again over an earlier step 2; stopped after the
    new state's first file is up, the earlier meta.json must not still stand for a mix of the
    two."""
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    store = S3Store("s3://ckpt/run", client=s3, node_cache=tmp_path / "node")
    _save_steps(store, [1, 2])
    writes = S3Writes(s3, stop_at=2)  # the new state's first file is written, no more
    other, other_opt = _trained(1)
    with pytest.raises(Stopped):
        Checkpointer(store).save(2, other, other_opt)
    writes.close()

    assert writes.log == [
        ("delete", "run/step_00000002/meta.json"),
        ("put", "run/step_00000002/shards/.metadata"),
    ]
    restarted = Checkpointer(S3Store("s3://ckpt/run", client=s3, node_cache=tmp_path / "n2"))
    assert restarted.store.names() == ["step_00000001"]
    assert restarted.remove_stale() == ["step_00000002"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptCheckpointWarning)
        assert restarted.newest_valid() == "step_00000001"


RUN = {
    "preset": "tiny",
    "seed": 0,
    "global_batch": 16,
    "peak_lr": 3e-3,
    "min_lr_ratio": 0.1,
    "warmup_steps": 0,
    "max_steps": 10,
    "data_manifest_sha256": "ab" * 32,
}


def test_the_run_configuration_is_saved_and_a_changed_one_refused(tmp_path: Path) -> None:
    checkpointer = Checkpointer(LocalStore(tmp_path))
    model, opt = _trained(0)
    checkpointer.save(4, model, opt, run=RUN)
    saved = checkpointer.run_of("step_00000004")
    assert saved == RUN

    checkpoint.check_resume("step_00000004", saved, dict(RUN))  # the same run resumes
    changed = RUN | {"global_batch": 32, "data_manifest_sha256": "cd" * 32}
    with pytest.raises(
        checkpoint.RunConfigError,
        match=r"refusing to resume from checkpoint step_00000004: .*global_batch 16 in the "
        r"checkpoint, 32 now; data_manifest_sha256 'abab.*' in the checkpoint, 'cdcd.*' now",
    ):
        checkpoint.check_resume("step_00000004", saved, changed)
    # A checkpoint from before runs were recorded resumes as it did.
    checkpointer.save(5, model, opt)
    assert checkpointer.run_of("step_00000005") is None
    checkpoint.check_resume("step_00000005", None, changed)


def test_a_resume_with_another_seed_or_dataset_is_refused(corpus_dir: Path, tmp_path: Path) -> None:
    from trainer.config import TrainConfig
    from trainer.data import prepare_corpus
    from trainer.loop import train

    cfg = TrainConfig(
        preset="tiny",
        device="cpu",
        compile="none",
        data=str(corpus_dir),
        max_steps=2,
        checkpoint_dir=str(tmp_path / "ck"),
    )
    train(cfg)
    with pytest.raises(checkpoint.RunConfigError, match=r"seed 0 in the checkpoint, 7 now"):
        train(replace(cfg, seed=7))
    other = tmp_path / "other-shards"
    prepare_corpus(other, shard_tokens=1 << 15)
    with pytest.raises(checkpoint.RunConfigError, match=r"data_manifest_sha256 '[0-9a-f]{64}'"):
        train(replace(cfg, data=str(other)))


RESUME_ON_A_NODE = """
import json, os, sys
from pathlib import Path

import boto3
import torch

from trainer import checkpoint, optim, parallel
from trainer.config import PRESETS
from trainer.model import GPT

out, endpoint, run = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
node_cache = out / f"node-{os.environ['GROUP_RANK']}-disk"
ranks = parallel.ranks_from_env()
parallel.init(ranks, "gloo")
control = parallel.control_group(ranks)
s3 = boto3.client(
    "s3",
    endpoint_url=endpoint,
    region_name="us-east-1",
    aws_access_key_id="moto",
    aws_secret_access_key="moto",
)
state_gets = []
s3.meta.events.register(
    "before-parameter-build.s3.GetObject",
    lambda params, **_: state_gets.append(1) if params["Key"].endswith(".distcp") else None,
)
store = checkpoint.S3Store("s3://ckpt/run", client=s3, node_cache=node_cache)
torch.manual_seed(100 + ranks.rank)
model = GPT(PRESETS["tiny"].model)
opt = optim.build(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
step = checkpoint.resume_newest(
    checkpoint.Checkpointer(store), model, opt, run=run, ranks=ranks, group=control
)
weights = sum(float(p.detach().double().sum()) for p in model.parameters())
(out / f"rank-{ranks.rank}.json").write_text(
    json.dumps({"step": step, "state_gets": len(state_gets), "weights": weights})
)
parallel.shutdown()
"""


@pytest.mark.slow
def test_resuming_from_s3_downloads_the_state_once_per_node(
    tmp_path: Path, trainer_env: dict[str, str]
) -> None:
    """Two nodes of two ranks (gloo) resume from a moto S3 server: each node downloads the state
    once (the main rank's CRC check included), its ranks share that copy, every rank restores
    the same weights, and the node copies are gone afterwards."""
    pytest.importorskip("flask", reason="moto's ThreadedMotoServer needs moto[server]")
    from moto.server import ThreadedMotoServer

    port = warm.free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="moto",
            aws_secret_access_key="moto",
        )
        s3.create_bucket(Bucket="ckpt")
        model, opt = _trained(0)
        Checkpointer(S3Store("s3://ckpt/run", client=s3)).save(7, model, opt, run=RUN)
        (tmp_path / "resume.py").write_text(RESUME_ON_A_NODE)
        # The four ranks as torchrun starts them: node 0 holds ranks 0 and 1, node 1 ranks 2
        # and 3; each rank finds its node's disk from GROUP_RANK.
        done = warm.run_ranks(
            [sys.executable, str(tmp_path / "resume.py"), str(tmp_path), endpoint, json.dumps(RUN)],
            env=trainer_env,
            world=4,
            per_node=2,
            cwd=tmp_path,
            timeout=180,
        )
    finally:
        server.stop()

    assert [rank.returncode for rank in done] == [0, 0, 0, 0], "\n".join(
        f"{rank.stdout}{rank.stderr}" for rank in done
    )
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    assert [r["step"] for r in ranks] == [7, 7, 7, 7]
    gets = [r["state_gets"] for r in ranks]
    assert [gets[0] + gets[1], gets[2] + gets[3]] == [1, 1], gets
    expected = sum(float(p.detach().double().sum()) for p in model.parameters())
    assert all(r["weights"] == pytest.approx(expected, rel=1e-12) for r in ranks)
    assert not (tmp_path / "node-0-disk").exists() and not (tmp_path / "node-1-disk").exists()


LAZY_CHECKPOINT_LIBRARY = """
import sys
from pathlib import Path

import torch

from trainer import checkpoint, cli, loop
from trainer.model import GPT
from trainer.config import PRESETS

def loaded():
    return sorted(m for m in sys.modules if m.startswith("torch.distributed.checkpoint"))

assert loaded() == [], loaded()
model = GPT(PRESETS["tiny"].model)
opt = torch.optim.AdamW(model.parameters())
checkpointer = checkpoint.Checkpointer(checkpoint.LocalStore(Path(sys.argv[1])))
checkpointer.save(3, model, opt)
assert loaded(), "saved without torch.distributed.checkpoint"
assert checkpointer.resume(checkpointer.newest_valid(), model, opt) == 3
"""


@pytest.mark.slow
def test_the_checkpoint_library_is_imported_when_a_checkpoint_is_written(
    tmp_path: Path, trainer_env: dict[str, str]
) -> None:
    """Importing torch.distributed.checkpoint takes a second or more; a trainer process that
    writes no checkpoint (``trn-train run`` without ``--checkpoint-dir``, every other command)
    does not pay it, and one that does still writes and resumes."""
    done = subprocess.run(
        [sys.executable, "-c", LAZY_CHECKPOINT_LIBRARY, str(tmp_path)],
        env=trainer_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]


def test_the_trainer_uses_no_private_name_of_torch_distributed_checkpoint() -> None:
    """Every name the trainer imports from DCP is public (no leading underscore in the module
    path or the name): private ones change between torch releases without notice."""
    private = []
    for path in sorted((ROOT / "training_image" / "trainer").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module):
                continue
            if node.module.startswith("torch.distributed.checkpoint"):
                parts = [*node.module.split("."), *(alias.name for alias in node.names)]
                private += [f"{path.name}: {node.module}: {p}" for p in parts if p.startswith("_")]
    assert private == []
