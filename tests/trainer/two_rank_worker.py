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


def recommend_shards(job: dict[str, Any], ranks: parallel.Ranks) -> dict[str, Any]:
    """A two-tower model with row-sharded tables, eager (``split``) and compiled whole as the
    loop compiles a step (``compiled``: aot_eager, one graph), against the unsharded one drawn
    from the same seed, each rank on its own rows of one batch (one of rank 1's empty): the
    losses, the item and user vectors, and the gradients after DDP's mean over ranks (done here
    by hand on every gradient the sharded tables leave to it, a sharded table's under its
    table's ``.weight``), saved as ``rank-N.pt``."""
    import torch.distributed as dist

    from trainer.recommend import sharding
    from trainer.recommend.model import TwoTower, TwoTowerConfig

    cfg = TwoTowerConfig(7, 11, (3,), (2,), history=2, dim=8, temperature=0.1)
    features, counts = (torch.arange(11) % 3).unsqueeze(1), torch.arange(1, 12)
    torch.manual_seed(0)
    full = TwoTower(cfg, features, counts)
    torch.manual_seed(0)
    split = TwoTower(cfg, features, counts, sharding.sharded_tables())
    torch.manual_seed(0)
    compiled = TwoTower(cfg, features, counts, sharding.sharded_tables())
    torch._dynamo.reset()
    step = torch.compile(compiled, backend="aot_eager", fullgraph=True, dynamic=False)
    generator = torch.Generator().manual_seed(1)
    columns = [7, 11, 12, 12, 4]  # user, item, history + 1 (two), region + 1
    rows = torch.stack([torch.randint(0, n, (12,), generator=generator) for n in columns], 1)
    mine = rows[6 * ranks.rank : 6 * (ranks.rank + 1)]
    real = torch.tensor([True] * 5 + [ranks.rank == 0])
    saved: dict[str, Any] = {}
    for label, model, forward in (
        ("full", full, full),
        ("split", split, split),
        ("compiled", compiled, step),
    ):
        loss = forward(mine, real)
        loss.backward()
        sharded = set(sharding.sharded_parameter_names(model))
        grads = {}
        for name, p in model.named_parameters():
            grad = p.grad.clone()
            if name in sharded:
                name = f"{name.rsplit('.', 1)[0]}.weight"
            else:
                dist.all_reduce(grad)
                grad /= ranks.world_size
            grads[name] = grad
        with torch.no_grad():
            vectors = {"users": model.users(mine), "items": model.items(torch.arange(11))}
        saved[label] = {"loss": loss.detach(), "grads": grads, **vectors}
    ranges = {
        name: [m.start, m.stop]
        for name, m in split.named_modules()
        if isinstance(m, sharding.RowShardedEmbedding)
    }
    torch.save({**saved, "ranges": ranges}, Path(job["out"], f"rank-{ranks.rank}.pt"))
    return {"ranges": ranges}


def cli_resumed(job: dict[str, Any], ranks: parallel.Ranks) -> dict[str, Any]:
    """``trn-train ARGV`` run to its end, its last checkpoint kept aside as ``straight``; then
    as if killed after step ``killed_at``'s checkpoint (the later ones removed) and run again,
    which resumes there and writes the last one anew."""
    import shutil

    import torch.distributed as dist

    first = cli.main(job["argv"])
    ck = Path(job["argv"][job["argv"].index("--checkpoint-dir") + 1])
    if ranks.is_main:
        last = sorted(ck.glob("step_*"))[-1]
        shutil.copytree(last, Path(job["out"], "straight", last.name))
        for later in ck.glob("step_*"):
            if int(later.name.removeprefix("step_")) > job["killed_at"]:
                shutil.rmtree(later)
    dist.barrier()
    return {"exit": [first, cli.main(job["argv"])]}


KINDS: dict[str, Callable[[dict[str, Any], parallel.Ranks], dict[str, Any]]] = {
    "recommend_shards": recommend_shards,
    "cli_resumed": cli_resumed,
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
