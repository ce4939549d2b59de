"""Two ranks under torchrun (gloo) against one rank accumulating over the same global batch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainer import data, metrics
from trainer.config import TrainConfig
from trainer.loop import train

STEPS = 6
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


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


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_match_one_rank(
    parallel: str,
    corpus_dir: Path,
    tmp_path: Path,
    trainer_env: dict[str, str],
    one_rank: dict[int, dict[str, Any]],
) -> None:
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
    ]
    args = [
        "-m",
        "trainer",
        "run",
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--compile",
        "none",
        "--data",
        str(corpus_dir),
        "--max-steps",
        str(STEPS),
        "--micro-batch",
        "4",
        "--log-every",
        "1",
        "--parallel",
        parallel,
        "--metrics",
        str(tmp_path / "m.jsonl"),
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    ]
    done = subprocess.run(
        [*torchrun, *args],
        env=trainer_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_same_steps(metrics.read(tmp_path / "m.jsonl"), one_rank)
    # The sharded (FSDP) or replicated (DDP) state is gathered into one full checkpoint.
    assert (tmp_path / "ck" / f"step_{STEPS:08d}" / "meta.json").is_file()


TRAIN_AND_COUNT = """
import json, sys
from pathlib import Path
from torch._dynamo.utils import counters
from trainer import parallel
from trainer.config import TrainConfig
from trainer.loop import train

result = train(TrainConfig(**json.loads(sys.argv[1])))
Path(sys.argv[2], f"rank-{parallel.ranks_from_env().rank}.json").write_text(json.dumps({
    "steps": result.steps_done,
    "graph_breaks": sum(counters["graph_break"].values()),
    "graphs": counters["stats"]["unique_graphs"],
}))
"""


def _tiny_flops_per_token() -> float:
    """6N + 12 L d T for the tiny preset, N counted by hand: per GPT-2 block 12 d^2 + 13 d
    (qkv, projection, MLP up and down with biases, two LayerNorms), the tied embedding and the
    final LayerNorm; the learned positions are a lookup."""
    layers, d, seq, vocab = 2, 64, 64, 256
    n = layers * (12 * d * d + 13 * d) + vocab * d + 2 * d
    return 6.0 * n + 12.0 * layers * d * seq


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_compiled_on_two_ranks(
    parallel: str,
    corpus_dir: Path,
    tmp_path: Path,
    trainer_env: dict[str, str],
    one_rank: dict[int, dict[str, Any]],
) -> None:
    """The compiler on, as the presets default (1b: FSDP2, 125m: DDP): under FSDP2 each block
    compiled whole before it is sharded, under DDP the model inside it; no graph break, no
    recompile after the first step, the same losses and norms as one rank. MFU divides the run's
    tokens/s among its ranks, each against its own peak."""
    (tmp_path / "train.py").write_text(TRAIN_AND_COUNT)
    cfg = {
        "preset": "tiny",
        "device": "cpu",
        "compile": "aot_eager",
        "fail_on_recompile": True,
        "data": str(corpus_dir),
        "max_steps": STEPS,
        "micro_batch": 4,
        "log_every": 1,
        "parallel": parallel,
        "metrics": str(tmp_path / "m.jsonl"),
        "peak_flops": 1e11,
    }
    done = subprocess.run(
        [
            *TORCHRUN,
            str(tmp_path / "train.py"),
            json.dumps(cfg),
            str(tmp_path),
        ],
        env=trainer_env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=tmp_path,
    )

    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    for rank in (0, 1):
        counts = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert counts["steps"] == STEPS
        assert counts["graph_breaks"] == 0
        # FSDP2: one graph for a block, shared by both blocks; DDP: one for the model.
        assert counts["graphs"] == 1
    records = metrics.read(tmp_path / "m.jsonl")
    _assert_same_steps(records, one_rank)
    for record in records:
        per_rank = record["tokens_per_s"] / 2
        assert record["mfu"] == pytest.approx(per_rank * _tiny_flops_per_token() / 1e11)
        assert record["precision"] == "fp32"


OPEN_PER_NODE = """
import json, sys
from pathlib import Path
from trainer import data, loop, parallel

hashed = []
real = data._sha256
data._sha256 = lambda path: hashed.append(path.name) or real(path)
ranks = parallel.ranks_from_env()
parallel.init(ranks, "gloo")
control = parallel.control_group(ranks)
out = Path(sys.argv[1]) / f"rank-{ranks.rank}.jsonl"
for root in sys.argv[2:]:
    hashed.clear()
    try:
        dataset = loop.open_dataset_per_node(root, ranks, control, verify=True)
        result = {"tokens": dataset.num_tokens}
    except data.ShardError as error:
        result = {"error": str(error)}
    result.update(root=root, local_rank=ranks.local_rank, hashed=len(hashed))
    with out.open("a") as f:
        f.write(json.dumps(result) + "\\n")
parallel.shutdown()
"""


def test_the_data_is_verified_once_per_node(
    corpus_dir: Path, tmp_path: Path, trainer_env: dict[str, str]
) -> None:
    """Two ranks of one node: local rank 0 checks every shard's SHA-256, the other rank none;
    a corrupt shard stops both, local rank 0 naming it."""
    corrupt = tmp_path / "corrupt"
    shutil.copytree(corpus_dir, corrupt)
    shard = corrupt / "shard_00000.bin"
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0xFF
    shard.write_bytes(bytes(raw))
    (tmp_path / "open.py").write_text(OPEN_PER_NODE)
    shards = len(json.loads((corpus_dir / data.MANIFEST).read_text())["shards"])

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(tmp_path / "open.py"),
            str(tmp_path),
            str(corpus_dir),
            str(corrupt),
        ],
        env=trainer_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    lines = [
        json.loads(line)
        for rank in (0, 1)
        for line in (tmp_path / f"rank-{rank}.jsonl").read_text().splitlines()
    ]
    by = {(line["root"], line["local_rank"]): line for line in lines}
    good, bad = str(corpus_dir), str(corrupt)
    assert by[good, 0]["hashed"] == shards and by[good, 1]["hashed"] == 0
    assert by[good, 0]["tokens"] == by[good, 1]["tokens"] > 0
    assert "shard_00000.bin: checksum mismatch" in by[bad, 0]["error"]
    assert by[bad, 1]["error"] == f"shard {bad}: failed its checks on a node's local rank 0 " + (
        "(see that rank's log)"
    )
    assert by[bad, 1]["hashed"] == 0
