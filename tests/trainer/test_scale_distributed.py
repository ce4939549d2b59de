"""One launch of two FSDP2 ranks (gloo, warm with torchrun's variables: tests/warm.py) against
one rank accumulating over the same global batch, folding the checks of the scale-out path into
it: the weights read on rank 0 alone and broadcast into the shards, the same step-1 loss as
transformers, activation checkpointing under FSDP2, sharded (DCP) checkpoints written by every
rank, resume across a change of world size both ways, and LoRA checkpoints that hold the adapters
only; then a sharded checkpoint exported."""

from __future__ import annotations

import functools
import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hf_tiny
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests import warm
from trainer import checkpoint, cli, data, hf, metrics
from trainer.checkpoint import Checkpointer, LocalStore

STEPS = 4
LORA = ["--lora-rank", "4", "--lora-targets", "q_proj,v_proj,down_proj"]
_run = functools.partial(hf_tiny.run_args, lr="3e-3", max_steps=str(STEPS))

# The argument is a list of `trn-train run` command lines, trained in turn in this one launch:
# the process group stays up between them (under torchrun, a group destroyed and made again in
# one process waits forever on its agent's store). Block.forward is counted so that checkpointed
# blocks show their recomputation.
TRAIN_EACH = """
import json, sys
from pathlib import Path
from trainer import cli, model, parallel

calls = []
forward = model.Block.forward
model.Block.forward = lambda self, *a: calls.append(1) or forward(self, *a)
shutdown, parallel.shutdown = parallel.shutdown, lambda: None
rank = parallel.ranks_from_env().rank
for i, argv in enumerate(json.loads(sys.argv[1])):
    calls.clear()
    assert cli.main(argv) == 0
    Path(f"calls-{i}-rank-{rank}.json").write_text(json.dumps(len(calls)))
shutdown()
"""


def _state(ck: Path, step: int) -> dict[str, Any]:
    """The checkpoint's whole state on CPU, a full or a sharded one."""
    return Checkpointer(LocalStore(ck)).load(checkpoint.name_for(step))


def _close(a: Mapping[str, Any], b: Mapping[str, Any], rtol: float = 1e-4) -> None:
    """The same model and optimizer state: the same keys and, tensor by tensor, the same values
    to ``rtol`` (FP32 sums in another order); the same hyperparameters but ``fused`` (one rank's
    plain tensors take the fused AdamW, FSDP2's DTensors not)."""
    flat_a = dict(torch.utils._pytree.tree_flatten_with_path([a["model"], a["optimizer"]])[0])
    flat_b = dict(torch.utils._pytree.tree_flatten_with_path([b["model"], b["optimizer"]])[0])
    assert flat_a.keys() == flat_b.keys()
    for key, value in flat_a.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(flat_b[key], value, rtol=rtol, atol=1e-6, msg=str(key))
        elif "fused" not in str(key):
            assert flat_b[key] == value, key


def _losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics.read(path)}


def _same_losses(got: dict[int, float], reference: dict[int, float]) -> None:
    assert got
    for step, loss in got.items():
        assert loss == pytest.approx(reference[step], rel=1e-5), step


def _step_zero_windows(corpus: Path) -> torch.Tensor:
    """The global batch of step 0, each window whole (inputs then the last target)."""
    sampler = data.WindowSampler(
        data.open_dataset(corpus, verify=False), seq_len=hf_tiny.SEQ_LEN, micro_batch=4, seed=0
    )
    x, y = sampler.batch(0)
    return torch.cat([x, y[:, -1:]], dim=1)


@pytest.mark.slow
def test_two_fsdp_ranks_load_shard_checkpoint_and_resume_across_world_sizes(
    model_data: Path, tmp_path: Path, trainer_env: dict[str, str]
) -> None:
    theirs = hf_tiny.build("qwen3", head_dim=12, tie_word_embeddings=True)
    source = hf_tiny.save(theirs, tmp_path / "model")
    on = ["--log-every", "1", "--activation-checkpointing", "on"]

    def one(name: str, *extra: str) -> list[str]:
        ck = tmp_path / name
        args = [*_run(source, model_data, ck), *on, "--grad-accum", "2", *extra]
        return [*args, "--metrics", str(tmp_path / f"{name}.jsonl")]

    def two(name: str, *extra: str) -> list[str]:
        ck = tmp_path / name
        args = [*_run(source, model_data, ck), *on, "--parallel", "fsdp", *extra]
        return [*args, "--metrics", str(tmp_path / f"{name}.jsonl")]

    # One rank: the reference runs, checkpointing at step 2 (gathered) for the 2-rank resume.
    assert cli.main(one("ref", "--checkpoint-every", "2")) == 0
    assert cli.main(one("lora-one", *LORA)) == 0
    (tmp_path / "grow").mkdir()
    shutil.copytree(tmp_path / "ref" / "step_00000002", tmp_path / "grow" / "step_00000002")

    (tmp_path / "train.py").write_text(TRAIN_EACH)
    runs = [two("fresh", "--checkpoint-every", "2"), two("grow"), two("lora-two", *LORA)]
    reads = tmp_path / "reads.jsonl"
    done = warm.run_ranks(
        [sys.executable, str(tmp_path / "train.py"), json.dumps(runs)],
        env={**trainer_env, hf.READ_LOG_ENV: str(reads)},
        world=2,
        cwd=tmp_path,
        timeout=240,
    )
    assert [rank.returncode for rank in done] == [0, 0], "".join(
        rank.stdout + rank.stderr[-6000:] for rank in done
    )

    # Rank 0 alone read the safetensors files, in each of the three runs.
    assert [json.loads(line)["rank"] for line in reads.read_text().splitlines()] == [0, 0, 0]
    # Every step as one rank over the same global batch, and step 1 as transformers scores it.
    reference = _losses(tmp_path / "ref.jsonl")
    _same_losses(_losses(tmp_path / "fresh.jsonl"), reference)
    assert reference[1] == pytest.approx(
        hf_tiny.hf_loss(theirs, _step_zero_windows(model_data)), rel=1e-4
    )
    # Checkpointed blocks run twice per micro-step on each rank: forward and recomputation.
    for rank in (0, 1):
        calls = json.loads((tmp_path / f"calls-0-rank-{rank}.json").read_text())
        assert calls == 2 * 2 * STEPS  # two blocks

    # Each rank wrote its own shard; nothing was gathered.
    fresh = tmp_path / "fresh" / checkpoint.name_for(STEPS)
    meta = json.loads((fresh / checkpoint.META).read_text())
    assert meta["format"] == checkpoint.FORMAT and meta["world_size"] == 2
    assert sorted(meta["files"]) == [
        "shards/.metadata",
        "shards/__0_0.distcp",
        "shards/__1_0.distcp",
    ]
    _close(_state(tmp_path / "ref", 2), _state(tmp_path / "fresh", 2))

    # One rank's checkpoint resumed on two ranks: the steps after it, and the state at the end.
    _same_losses(_losses(tmp_path / "grow.jsonl"), reference)
    assert sorted(_losses(tmp_path / "grow.jsonl")) == [3, 4]
    _close(_state(tmp_path / "ref", STEPS), _state(tmp_path / "grow", STEPS))
    # Two ranks' checkpoint resumed on one rank.
    (tmp_path / "shrink").mkdir()
    shutil.copytree(tmp_path / "fresh" / "step_00000002", tmp_path / "shrink" / "step_00000002")
    assert cli.main(one("shrink")) == 0
    _same_losses(_losses(tmp_path / "shrink.jsonl"), reference)
    _close(_state(tmp_path / "ref", STEPS), _state(tmp_path / "shrink", STEPS))

    # LoRA on two ranks: like one rank, and its sharded checkpoint holds the adapters only.
    _same_losses(_losses(tmp_path / "lora-two.jsonl"), _losses(tmp_path / "lora-one.jsonl"))
    adapters = _state(tmp_path / "lora-two", STEPS)
    assert adapters["model"] and all(".lora_" in name for name in adapters["model"])
    assert set(adapters["optimizer"]["state"]) == set(adapters["model"])
    _close(_state(tmp_path / "lora-one", STEPS), adapters)

    # A sharded checkpoint exports like a full one.
    out = tmp_path / "out"
    assert cli.main(["export", "--checkpoint-dir", str(tmp_path / "fresh"), "--out", str(out)]) == 0
    assert AutoModelForCausalLM.from_pretrained(out).config.head_dim == 12
