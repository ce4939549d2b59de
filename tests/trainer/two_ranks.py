"""The suite's one two-rank launch (tests/trainer/two_rank_worker.py, two warm ranks with
torchrun's rank variables, tests/warm.py): the data each scenario reads, the jobs, and each job's
per-rank results for the tests that assert on them.

The trainer reads only those variables (trainer/parallel.py), so torchrun's agent adds nothing
these tests look at; torchrun itself launches ranks in the entrypoint's and node validation's
tests (tests/trainer/test_entrypoint_precompile.py, test_validate_node.py, test_launch.py) and in
the preempted two-rank example (tests/examples/example_runs.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tiny_tokenizer

from tests import warm
from trainer import data, tokenizing

WORKER = Path(__file__).with_name("two_rank_worker.py")
# The pytest marker that keeps every test of the launch on one xdist worker (--dist loadgroup),
# so that the session fixture runs once.
GROUP = "two_ranks"
STEPS = 6  # tests/trainer/test_distributed.py's runs
TOPICS = ["the cat sat on a mat", "a dog ran far away and back", "good morning sun", "what is two"]


def write_numbered(root: Path) -> Path:
    """Two shards of consecutive integers, so a window's content shows where it came from."""
    data.write_dataset(
        root,
        [np.arange(3000, dtype=np.int64)],
        vocab_size=70_000,
        tokenizer="test",
        shard_tokens=2000,
    )
    return root


def write_chat(root: Path) -> Path:
    """Conversations with masked prompts and a held-out tail of 20%."""
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(120):
        messages = [
            {"role": "user", "content": TOPICS[i % 4]},
            {"role": "assistant", "content": TOPICS[(i * 3 + 1) % 4]},
        ]
        lines.append(json.dumps({"messages": messages}) + "\n")
    (root / "chat.jsonl").write_text("".join(lines))
    tokenizing.prepare(
        root / "data",
        tiny_tokenizer.build(root / "tok"),
        root / "chat.jsonl",
        "chat",
        eval_fraction=0.2,
    )
    return root / "data"


@dataclass(frozen=True)
class TwoRanks:
    """The launch's inputs and outputs: ``root/JOB`` holds each job's files."""

    root: Path
    corpus: Path
    corrupt: Path
    numbered: Path
    short: Path
    chat: Path
    interactions: Path
    done: list[subprocess.CompletedProcess[str]]

    def results(self, job: str) -> list[dict[str, Any]]:
        """Rank 0's and rank 1's results of ``job``; an AssertionError naming why if either
        rank failed it or never got to it."""
        ranks = []
        for rank in (0, 1):
            path = self.root / job / f"rank-{rank}.json"
            ended = self.done[rank]
            launch = f"it exited {ended.returncode}:\n{ended.stderr[-6000:]}"
            assert path.is_file(), f"rank {rank} never finished job {job}; {launch}"
            result: dict[str, Any] = json.loads(path.read_text())
            assert "failed" not in result, f"rank {rank} failed job {job}:\n{result['failed']}"
            ranks.append(result)
        return ranks


def _tiny_run(corpus: Path, out: Path, parallel: str) -> list[str]:
    """tests/trainer/test_distributed.py's `trn-train run` on two ranks."""
    return [
        *["run", "--preset", "tiny", "--device", "cpu", "--compile", "none"],
        *["--data", str(corpus), "--max-steps", str(STEPS), "--micro-batch", "4"],
        *["--log-every", "1", "--parallel", parallel, "--metrics", str(out / "m.jsonl")],
        *["--checkpoint-dir", str(out / "ck")],
    ]


def _compiled(corpus: Path, out: Path, parallel: str) -> dict[str, Any]:
    return {
        "preset": "tiny",
        "device": "cpu",
        "compile": "aot_eager",
        "fail_on_recompile": True,
        "data": str(corpus),
        "max_steps": STEPS,
        "micro_batch": 4,
        "log_every": 1,
        "parallel": parallel,
        "metrics": str(out / "m.jsonl"),
        "peak_flops": 1e11,
    }


def _eval_run(chat: Path, out: Path) -> list[str]:
    """tests/trainer/test_eval.py's two FSDP ranks of 2 rows."""
    return [
        *["run", "--preset", "tiny", "--device", "cpu", "--compile", "none"],
        *["--data", str(chat), "--max-steps", "4", "--micro-batch", "2", "--seed", "7"],
        *["--eval-every", "2", "--eval-batches", "3", "--parallel", "fsdp"],
        *["--log-every", "1", "--metrics", str(out / "two.jsonl")],
    ]


def write_interactions(root: Path) -> Path:
    """tests/trainer/test_recommend_data.py's preference structure, 40 users of 10
    interactions, prepared with a user and an item feature and the latest 10% held out."""
    from test_recommend_data import interactions, write_jsonl

    from trainer.recommend import data as rec_data

    root.mkdir(parents=True, exist_ok=True)
    source = write_jsonl(root / "i.jsonl", interactions(users=40, items=60, per_user=10))
    features = {"user_features": ["region"], "item_features": ["category"], "history": 3}
    rec_data.prepare(root / "data", source, **features)
    return root / "data"


def _recommend_run(data: Path, out: Path, shard: str) -> list[str]:
    """A two-tower run on two ranks, its tables split across them or not."""
    return [
        *["run", "--task", "recommend", "--device", "cpu", "--compile", "none"],
        *["--data", str(data), "--max-steps", "6", "--micro-batch", "8", "--embedding-dim", "8"],
        *["--log-every", "1", "--eval-every", "3", "--shard-embeddings", shard],
        *["--metrics", str(out / "m.jsonl"), "--checkpoint-dir", str(out / "ck")],
    ]


def jobs(two: TwoRanks) -> dict[str, dict[str, Any]]:
    root = two.root
    return {
        "ddp": {"kind": "cli", "argv": _tiny_run(two.corpus, root / "ddp", "ddp")},
        "fsdp": {"kind": "cli", "argv": _tiny_run(two.corpus, root / "fsdp", "fsdp")},
        "verify": {"kind": "open_per_node", "roots": [str(two.corpus), str(two.corrupt)]},
        "short": {"kind": "open_per_rank", "roots": [str(two.numbered), str(two.short)]},
        "eval-fsdp": {"kind": "cli", "argv": _eval_run(two.chat, root / "eval-fsdp")},
        "compiled-ddp": {
            "kind": "train_and_count",
            "config": _compiled(two.corpus, root / "compiled-ddp", "ddp"),
        },
        "recommend-shards": {"kind": "recommend_shards"},
        "recommend-ddp": {
            "kind": "cli",
            "argv": _recommend_run(two.interactions, root / "recommend-ddp", "off"),
        },
        "recommend-split": {
            "kind": "cli",
            "argv": _recommend_run(two.interactions, root / "recommend-split", "on"),
        },
        "recommend-split-resumed": {
            "kind": "cli_resumed",
            "argv": [
                *_recommend_run(two.interactions, root / "recommend-split-resumed", "on"),
                *["--checkpoint-every", "3"],
            ],
            "killed_at": 3,
        },
        "compiled-fsdp": {
            "kind": "train_and_count",
            "config": _compiled(two.corpus, root / "compiled-fsdp", "fsdp"),
        },
    }


def launch(root: Path, corpus: Path, env: dict[str, str]) -> TwoRanks:
    """Writes each scenario's data under ``root`` and runs every job in one launch of two ranks."""
    corrupt = root / "corrupt"
    shutil.copytree(corpus, corrupt)
    shard = corrupt / "shard_00000.bin"
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0xFF
    shard.write_bytes(bytes(raw))
    numbered = write_numbered(root / "numbered")
    short = root / "short"
    shutil.copytree(numbered, short)
    truncated = short / "shard_00001.bin"
    truncated.write_bytes(truncated.read_bytes()[:-2])
    chat = write_chat(root / "chat")
    interactions = write_interactions(root / "interactions")
    two = TwoRanks(root, corpus, corrupt, numbered, short, chat, interactions, [])
    listed = {name: {**job, "out": str(root / name)} for name, job in jobs(two).items()}
    (root / "jobs.json").write_text(json.dumps(listed))
    argv = [sys.executable, str(WORKER), str(root / "jobs.json")]
    done = warm.run_ranks(argv, env=env, world=2, cwd=root, timeout=600)
    return TwoRanks(root, corpus, corrupt, numbered, short, chat, interactions, done)
