"""One rank of two (gloo) that runs, in turn, every two-rank scenario the trainer tests check: a
launch costs two Python processes with torch, so the suite makes one and each test asserts on its
own scenario's results (tests/trainer/conftest.py, ``two_ranks``).

Usage: ``torchrun --nproc-per-node 2 two_rank_worker.py JOBS.json``, or its two ranks started
with torchrun's variables (tests/trainer/two_ranks.py); JOBS.json maps a job name
to ``{"kind": ..., "out": DIR, ...}``. Each job writes ``DIR/rank-N.json`` on every rank: its
results, or ``{"failed": traceback}``, after which the worker stops (the other rank may be waiting
in a collective). The default process group stays up between jobs: under torchrun, a group
destroyed and made again in one process waits forever on its agent's store.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters

from trainer import cli, data, loop, parallel
from trainer.config import TrainConfig


def run_cli(job: dict[str, Any], ranks: parallel.Ranks) -> dict[str, Any]:
    """``trn-train ARGV`` as ``python -m trainer`` runs it."""
    return {"exit": cli.main(job["argv"])}


def train_and_count(job: dict[str, Any], ranks: parallel.Ranks) -> dict[str, Any]:
    """A compiled run from a fresh compiler state, with its graph and graph-break counts."""
    torch._dynamo.reset()
    counters.clear()
    result = loop.train(TrainConfig(**job["config"]))
    return {
        "steps": result.steps_done,
        "graph_breaks": sum(counters["graph_break"].values()),
        "graphs": counters["stats"]["unique_graphs"],
    }


def open_per_node(job: dict[str, Any], ranks: parallel.Ranks) -> dict[str, Any]:
    """Each root opened with ``verify=True``, counting the shards this rank hashed."""
    hashed: list[str] = []
    real = data._sha256
    data._sha256 = lambda path: hashed.append(path.name) or real(path)  # type: ignore[assignment]
    control = parallel.control_group(ranks)
    results = []
    try:
        for root in job["roots"]:
            hashed.clear()
            try:
                dataset = loop.open_dataset_per_node(root, ranks, control, verify=True)
                result: dict[str, Any] = {"tokens": dataset.num_tokens}
            except data.ShardError as error:
                result = {"error": str(error)}
            result.update(root=root, local_rank=ranks.local_rank, hashed=len(hashed))
            results.append(result)
    finally:
        data._sha256 = real  # type: ignore[assignment]
    return {"opened": results}


def open_per_rank(job: dict[str, Any], ranks: parallel.Ranks) -> dict[str, Any]:
    """Rank N opens ``roots[N]`` without a re-hash, as if each rank's node mounted its own copy."""
    control = parallel.control_group(ranks)
    root = job["roots"][ranks.rank]
    try:
        return {"tokens": loop.open_dataset_per_node(root, ranks, control, verify=False).num_tokens}
    except data.ShardError as error:
        return {"error": str(error)}


KINDS: dict[str, Callable[[dict[str, Any], parallel.Ranks], dict[str, Any]]] = {
    "cli": run_cli,
    "train_and_count": train_and_count,
    "open_per_node": open_per_node,
    "open_per_rank": open_per_rank,
}


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    ranks = parallel.ranks_from_env()
    parallel.init(ranks, "gloo")
    shutdown, parallel.shutdown = parallel.shutdown, lambda: None  # type: ignore[assignment]
    for job in jobs.values():
        out = Path(job["out"], f"rank-{ranks.rank}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            result = KINDS[job["kind"]](job, ranks)
        except BaseException:
            out.write_text(json.dumps({"failed": traceback.format_exc()}))
            raise
        out.write_text(json.dumps(result))
    shutdown()


if __name__ == "__main__":
    main()
