"""Checkpoint save, resume and load times of the tiny and small presets: merges
bench/results.json["checkpoint"].

For each preset, a model that took one AdamW step (so that the optimizer has its moments) is
saved into a local directory, resumed into another model and optimizer, and loaded whole for an
export (``load(parts=("model",))``), each ``--rounds`` times in turn after one untimed round
(imports, first calls); the figures are the medians in seconds, with the checkpoint's bytes on
disk (``tiny_save_s``, ..., ``small_bytes``). One process, one thread for torch (a rank's share
of a node), no goals: the figures are compared across changes of the checkpoint format (issue
32).

Usage: python bench/checkpoint_bench.py [--results bench/results.json] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import results_file
import torch

from trainer import optim
from trainer.checkpoint import Checkpointer, LocalStore, name_for
from trainer.config import PRESETS
from trainer.model import GPT


def _trained(preset: str, seed: int) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = GPT(PRESETS[preset].model)
    opt = optim.build(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    idx = torch.randint(0, 256, (1, PRESETS[preset].model.seq_len))
    model(idx, idx).backward()
    opt.step()
    return model, opt


def _round(
    checkpointer: Checkpointer,
    step: int,
    saved: tuple[GPT, torch.optim.Optimizer],
    fresh: tuple[GPT, torch.optim.Optimizer],
) -> dict[str, float]:
    """Seconds of one save of ``saved`` at ``step``, its resume into ``fresh`` and its load."""
    start = time.perf_counter()
    name = checkpointer.save(step, *saved)
    saved_at = time.perf_counter()
    checkpointer.resume(name, *fresh)
    resumed_at = time.perf_counter()
    checkpointer.load(name, parts=("model",))
    loaded_at = time.perf_counter()
    return {
        "save_s": saved_at - start,
        "resume_s": resumed_at - saved_at,
        "load_s": loaded_at - resumed_at,
    }


def measure(preset: str, work: Path, rounds: int) -> dict[str, float]:
    """Median seconds of a save, a resume and a load of ``preset``'s state under ``work``, and
    the checkpoint's bytes."""
    saved, fresh = _trained(preset, 0), _trained(preset, 1)
    checkpointer = Checkpointer(LocalStore(work), keep=2)
    _round(checkpointer, 0, saved, fresh)  # imports and first calls
    timed = [_round(checkpointer, step, saved, fresh) for step in range(1, rounds + 1)]
    size = sum(p.stat().st_size for p in (work / name_for(rounds)).rglob("*") if p.is_file())
    return {"bytes": size, **{key: statistics.median(t[key] for t in timed) for key in timed[0]}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(Path(__file__).with_name("results.json")))
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # DCP's note that it runs in one process, each call
    figures: dict[str, float] = {}
    for preset in ("tiny", "small"):
        with tempfile.TemporaryDirectory(prefix="checkpoint-bench-") as tmp:
            measured = measure(preset, Path(tmp), args.rounds)
        figures |= {f"{preset}_{key}": value for key, value in measured.items()}
    result = {
        **figures,
        "rounds": args.rounds,
        "torch": torch.__version__,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    results_file.merge(args.results, "checkpoint", result)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
