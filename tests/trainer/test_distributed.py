"""Two ranks (gloo) against one rank accumulating over the same global batch: the
runs are jobs of the suite's one two-rank launch (tests/trainer/two_ranks.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import two_ranks as two_ranks_launch
from two_ranks import TwoRanks

from trainer import data, metrics
from trainer.config import TrainConfig
from trainer.loop import train

STEPS = two_ranks_launch.STEPS


@pytest.fixture(scope="module")
def one_rank(
    corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, dict[str, Any]]:
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
    return {r["step"]: r for r in metrics.read(out)}


def _assert_same_steps(two: list[dict[str, Any]], one: dict[int, dict[str, Any]]) -> None:
    """Loss and gradient norm of every step as one rank computed them over the same batch: under
    FSDP2 the norm must be the whole model's, not one rank's shards'."""
    assert [r["step"] for r in two] == list(one)
    for record in two:
        reference = one[record["step"]]
        assert record["loss"] == pytest.approx(reference["loss"], rel=1e-5), record["step"]
        assert record["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5), record


@pytest.mark.slow
@pytest.mark.xdist_group(two_ranks_launch.GROUP)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_match_one_rank(
    parallel: str, two_ranks: TwoRanks, one_rank: dict[int, dict[str, Any]]
) -> None:
    """`trn-train run --parallel PARALLEL` on two ranks (tests/trainer/two_ranks.py)."""
    assert [r["exit"] for r in two_ranks.results(parallel)] == [0, 0]
    out = two_ranks.root / parallel
    _assert_same_steps(metrics.read(out / "m.jsonl"), one_rank)
    # The sharded (FSDP) or replicated (DDP) state is gathered into one full checkpoint.
    assert (out / "ck" / f"step_{STEPS:08d}" / "meta.json").is_file()


def _tiny_flops_per_token() -> float:
    """6N + 12 L d T for the tiny preset, N counted by hand: per GPT-2 block 12 d^2 + 13 d
    (qkv, projection, MLP up and down with biases, two LayerNorms), the tied embedding and the
    final LayerNorm; the learned positions are a lookup."""
    layers, d, seq, vocab = 2, 64, 64, 256
    n = layers * (12 * d * d + 13 * d) + vocab * d + 2 * d
    return 6.0 * n + 12.0 * layers * d * seq


@pytest.mark.xdist_group(two_ranks_launch.GROUP)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_compiled_on_two_ranks(
    parallel: str, two_ranks: TwoRanks, one_rank: dict[int, dict[str, Any]]
) -> None:
    """The compiler on, as the presets default (1b: FSDP2, 125m: DDP): under FSDP2 each block
    compiled whole before it is sharded, under DDP the model inside it; no graph break, no
    recompile after the first step, the same losses and norms as one rank. MFU divides the run's
    tokens/s among its ranks, each against its own peak. Each rank counts from a fresh compiler
    state (tests/trainer/two_rank_worker.py)."""
    for counts in two_ranks.results(f"compiled-{parallel}"):
        assert counts["steps"] == STEPS
        assert counts["graph_breaks"] == 0
        # FSDP2: one graph for a block, shared by both blocks; DDP: one for the model.
        assert counts["graphs"] == 1
    records = metrics.read(two_ranks.root / f"compiled-{parallel}" / "m.jsonl")
    _assert_same_steps(records, one_rank)
    for record in records:
        per_rank = record["tokens_per_s"] / 2
        assert record["mfu"] == pytest.approx(per_rank * _tiny_flops_per_token() / 1e11)
        assert record["precision"] == "fp32"


@pytest.mark.xdist_group(two_ranks_launch.GROUP)
def test_the_data_is_verified_once_per_node(two_ranks: TwoRanks) -> None:
    """Two ranks of one node: local rank 0 checks every shard's SHA-256, the other rank none;
    a corrupt shard stops both, local rank 0 naming it."""
    shards = len(json.loads((two_ranks.corpus / data.MANIFEST).read_text())["shards"])
    lines = [line for rank in two_ranks.results("verify") for line in rank["opened"]]
    by = {(line["root"], line["local_rank"]): line for line in lines}
    good, bad = str(two_ranks.corpus), str(two_ranks.corrupt)
    assert by[good, 0]["hashed"] == shards and by[good, 1]["hashed"] == 0
    assert by[good, 0]["tokens"] == by[good, 1]["tokens"] > 0
    assert "shard_00000.bin: checksum mismatch" in by[bad, 0]["error"]
    assert by[bad, 1]["error"] == f"shard {bad}: failed its checks on a node's local rank 0 " + (
        "(see that rank's log)"
    )
    assert by[bad, 1]["hashed"] == 0
