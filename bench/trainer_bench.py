"""Trainer benchmarks on this machine's CPU; merges its figures into bench/results.json["trainer"].

The training figures are measured in rounds; in each, every loop runs in a process of its own,
one after the other (which goes first alternates), so that load from other processes falls on
all of them. Every process gets the same clean environment (:func:`clean_env`: paths, locale and
user, nothing that tunes torch, OpenMP or the allocator) and reports the environment it ran
with, recorded beside the figures: no setting of the trainer's can reach a baseline.
Each loop's tokens/s in a round is that of its median step of :data:`MEASURED` (see there).

- trainer_vs_nanogpt_tokens_per_s: the full trainer on ``small`` (``trainer.loop.train``)
  against a nanoGPT-equivalent loop (bench/nanogpt_baseline.py) on the same shape and batch,
  with the choices nanoGPT's train.py makes under ``--bias=True`` (GPT-2's biases, as the
  preset has them; the exact GELU on both sides), both eager fp32; the median of the rounds'
  ratios (goal >= 1.0, asserted: the script exits 1 below it).
- trainer_vs_bare_tokens_per_s: the full trainer (loader, LR schedule, clipping, metrics)
  against a bare PyTorch loop on the same ``small`` model and batch, both eager fp32 (goal >= 0.97).
- cpu_mfu: the trainer's model FLOP/s over the CPU peak the run header uses
  (``trainer.device.cpu_peak_flops``, measured here once and given to every trainer round);
  goal >= 0.60, and above 1.0 is a failed check (the script exits 1): no run exceeds a peak.
- loader_tokens_per_s: one process, random windows, batch 8 x 2048 (goal >= 10M).
- checkpoint_write_vs_dd: checkpoint write bandwidth over ``dd conv=fsync`` of the same size to
  the same directory (goal >= 0.5).

Usage: python bench/trainer_bench.py [--results bench/results.json] [--rounds 7]
(``--side NAME`` runs one loop of a round; the bench starts those processes itself.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import results_file
import torch

from trainer import data, metrics, optim
from trainer.checkpoint import Checkpointer, LocalStore
from trainer.config import PRESETS, TrainConfig
from trainer.device import cpu_peak_flops
from trainer.loop import train
from trainer.model import GPT
from trainer.model_spec import model_config

HERE = Path(__file__).resolve().parent
# Steps per round. Each side's tokens/s is that of its median measured step (the trainer logs
# every step): on a shared machine a burst of other work moves a mean of a few steps by more
# than the few percent being measured, and a median of a dozen hardly.
WARMUP, MEASURED = 3, 12
GOALS = {
    "trainer_vs_nanogpt_tokens_per_s": 1.0,
    "trainer_vs_bare_tokens_per_s": 0.97,
    "cpu_mfu": 0.60,
    "loader_tokens_per_s": 10e6,
    "checkpoint_write_vs_dd": 0.5,
}
# An MFU above 1.0 means the peak is below what a run reaches: a wrong peak, not a fast run.
CEILINGS = {"cpu_mfu": 1.0}
# The figure whose miss of its goal makes the script exit 1 (as does any figure above its
# ceiling). The others are reported: an MFU below its goal on a machine busy with other work
# says more about the machine than about the trainer.
ASSERTED = "trainer_vs_nanogpt_tokens_per_s"
# What a round's processes inherit: where programs, home and temporary files are, the locale and
# the user. Nothing else: no OMP_*/MKL_* thread settings, THP_MEM_ALLOC_ENABLE, MALLOC_*,
# LD_PRELOAD or PYTHON* variable of the shell that started the bench.
CLEAN_ENV_KEYS = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "USER")
# The loops of a round, in the order of even rounds (odd rounds reverse it): the trainer between
# its baselines.
SIDES = ("nanogpt", "trainer", "bare")


def clean_env(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables of :data:`CLEAN_ENV_KEYS` that ``env`` has, and no others."""
    return {k: env[k] for k in CLEAN_ENV_KEYS if k in env}


def side_command(side: str, *, data_dir: Path, tokens: Path, peak: float) -> list[str]:
    """The command of one loop of a round: the trainer or the bare loop through this script's
    ``--side``, the nanoGPT-equivalent loop through its own script (which never imports the
    trainer). Each prints one JSON line (see :func:`run_side`).

    Raises:
        ValueError: ``side`` is not one of :data:`SIDES`.
    """
    if side in ("trainer", "bare"):
        return [
            sys.executable,
            str(Path(__file__).resolve()),
            "--side",
            side,
            "--data",
            str(data_dir),
            "--peak",
            repr(peak),
        ]
    if side not in SIDES:
        raise ValueError(f"side {side!r} is unknown; known: {', '.join(SIDES)}")
    preset = PRESETS["small"]
    m = preset.model
    shape = {
        "layers": m.n_layer,
        "heads": m.n_head,
        "width": m.d_model,
        "seq-len": m.seq_len,
        "vocab": m.vocab_size,
        "batch": preset.micro_batch,
        "warmup-steps": WARMUP,
        "measured-steps": MEASURED,
    }
    flags = [word for name, value in shape.items() for word in (f"--{name}", str(value))]
    return [
        sys.executable,
        str(HERE / "nanogpt_baseline.py"),
        "--tokens",
        str(tokens),
        *flags,
        "--bias",
    ]


def run_side(command: Sequence[str], env: Mapping[str, str]) -> dict[str, Any]:
    """Runs ``command`` with exactly ``env`` (from a neutral working directory) and returns the
    JSON object of its last line of output.

    Raises:
        RuntimeError: the process exited non-zero; the message holds its standard error.
    """
    done = subprocess.run(
        list(command), env=dict(env), capture_output=True, text=True, cwd=tempfile.gettempdir()
    )
    if done.returncode:
        raise RuntimeError(f"{command[1]} exited {done.returncode}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def trainer_round(data_dir: Path, work: Path, peak: float) -> tuple[float, float]:
    """tokens/s of the full trainer's median step after the warm-up (a record a step), and
    that step's MFU."""
    log = work / f"m-{time.monotonic_ns()}.jsonl"
    cfg = TrainConfig(
        preset="small",
        device="cpu",
        compile="none",
        data=str(data_dir),
        max_steps=WARMUP + MEASURED,
        log_every=1,
        metrics=str(log),
        peak_flops=peak,
        progress=False,
    )
    train(cfg)
    steady = [r for r in metrics.read(log) if r["step"] > WARMUP]
    step_s = statistics.median(r["step_time_s"] for r in steady)
    tokens_per_s = cfg.batch_per_rank * model_config(cfg).seq_len / step_s
    return tokens_per_s, statistics.median(r["mfu"] for r in steady)


def bare_round() -> float:
    """tokens/s of the plainest loop's median step over the same model, batch and optimizer."""
    cfg = PRESETS["small"]
    torch.manual_seed(0)
    model = GPT(cfg.model)
    opt = optim.build(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    batches = [torch.randint(0, 256, (cfg.micro_batch, cfg.model.seq_len + 1)) for _ in range(4)]
    step_times: list[float] = []
    for step in range(WARMUP + MEASURED):
        began = time.perf_counter()
        b = batches[step % 4]
        model(b[:, :-1], b[:, 1:]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= WARMUP:
            step_times.append(time.perf_counter() - began)
    return float(cfg.micro_batch * cfg.model.seq_len / statistics.median(step_times))


def side_main(side: str, data_dir: Path, peak: float) -> int:
    """One loop of a round in this process (``--side``): prints ``tokens_per_s`` (and the
    trainer's ``mfu``), ``env`` (this process's whole environment, read after the trainer is
    imported) and ``torch_threads`` as one JSON line."""
    record: dict[str, Any] = {}
    if side == "trainer":
        with tempfile.TemporaryDirectory(prefix="trainer-side-") as tmp:
            record["tokens_per_s"], record["mfu"] = trainer_round(data_dir, Path(tmp), peak)
    else:
        record["tokens_per_s"] = bare_round()
    record.update(env=dict(os.environ), torch_threads=torch.get_num_threads())
    print(json.dumps(record))
    return 0


def loader_tokens_per_s(work: Path, seconds: float = 2.0) -> float:
    rng = np.random.default_rng(0)
    out = work / "loader"
    data.write_dataset(
        out,
        [rng.integers(0, 50304, 32 << 20, dtype=np.uint16)],
        vocab_size=50304,
        tokenizer="random",
        shard_tokens=8 << 20,
    )
    sampler = data.WindowSampler(data.open_dataset(out), seq_len=2048, micro_batch=8, seed=0)
    tokens, step, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        x, _ = sampler.batch(step)
        tokens += x.numel()
        step += 1
    return tokens / (time.perf_counter() - start)


def checkpoint_vs_dd(work: Path, rounds: int = 3) -> dict[str, float]:
    """Median seconds of a checkpoint save (small preset with AdamW state) and of dd writing the
    same number of bytes with fsync, interleaved."""
    model = GPT(PRESETS["small"].model)
    opt = optim.build(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    idx = torch.randint(0, 256, (1, 256))
    model(idx, idx).backward()
    opt.step()
    # keep=rounds: pruning old checkpoints is not part of the write being timed.
    checkpointer = Checkpointer(LocalStore(work / "ckpt"), keep=rounds)
    ckpt_times, dd_times, size = [], [], 0
    for step in range(rounds):
        start = time.perf_counter()
        name = checkpointer.save(step, model, opt)
        ckpt_times.append(time.perf_counter() - start)
        size = sum(p.stat().st_size for p in (work / "ckpt" / name).rglob("*") if p.is_file())
        target = work / "dd.bin"
        done = subprocess.run(
            [
                "dd",
                "if=/dev/zero",
                f"of={target}",
                "bs=1M",
                f"count={max(1, size >> 20)}",
                "conv=fsync",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        # dd's own timing: the process start is not part of the disk's bandwidth.
        timing = re.search(r"copied, ([0-9.e-]+) s", done.stderr)
        if timing is None:
            raise RuntimeError(f"dd printed no timing: {done.stderr!r}")
        dd_times.append(float(timing.group(1)))
        target.unlink()
    ckpt, dd = statistics.median(ckpt_times), statistics.median(dd_times)
    dd_bytes = max(1, size >> 20) << 20
    return {
        "bytes": size,
        "checkpoint_s": ckpt,
        "dd_s": dd,
        "ratio": (size / ckpt) / (dd_bytes / dd),
    }


def cpu_description() -> dict[str, Any]:
    """The CPU the figures were measured on: its model name (``/proc/cpuinfo``), the vector
    instructions torch's kernels use on it (AVX2 or AVX512 on x86), cores and torch threads."""
    cpuinfo = Path("/proc/cpuinfo")
    names = (
        re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M)
        if cpuinfo.exists()
        else []
    )
    return {
        "model": names[0] if names else platform.processor() or platform.machine(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


def check(figures: Mapping[str, float]) -> dict[str, bool]:
    """Whether each figure of :data:`GOALS` meets its goal and stays under its ceiling
    (:data:`CEILINGS`)."""
    return {
        k: figures[k] >= GOALS[k] and figures[k] <= CEILINGS.get(k, float("inf")) for k in GOALS
    }


def failures(figures: Mapping[str, float]) -> list[str]:
    """Why the bench fails, one line each: :data:`ASSERTED` below its goal, and every figure
    above its ceiling; empty when it passes."""
    found = []
    if figures[ASSERTED] < GOALS[ASSERTED]:
        found.append(f"{ASSERTED} {figures[ASSERTED]:.3f} is below its goal {GOALS[ASSERTED]}")
    for name, ceiling in CEILINGS.items():
        if figures[name] > ceiling:
            found.append(f"{name} {figures[name]:.3f} is above {ceiling}: the peak is wrong")
    return found


def training_rounds(work: Path, rounds: int, peak: float) -> dict[str, list[dict[str, Any]]]:
    """Every side's records of ``rounds`` rounds, each in its own process (see the module's
    docstring)."""
    data.prepare_corpus(work / "corpus")
    tokens = work / "train.bin"  # nanoGPT's layout: the corpus as one uint16 array
    np.concatenate(data.open_dataset(work / "corpus").shards).astype(np.uint16).tofile(tokens)
    env = clean_env()
    records: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for round_ in range(rounds):
        for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
            command = side_command(side, data_dir=work / "corpus", tokens=tokens, peak=peak)
            load = os.getloadavg()[0]
            records[side].append({**run_side(command, env), "load_1m": load})
    return records


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(Path(__file__).with_name("results.json")))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--side", choices=["trainer", "bare"], help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--peak", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side:
        return side_main(args.side, args.data, args.peak)
    began = time.perf_counter()

    peak = cpu_peak_flops()
    with tempfile.TemporaryDirectory(prefix="trainer-bench-") as tmp:
        work = Path(tmp)
        records = training_rounds(work, args.rounds, peak)
        loader = loader_tokens_per_s(work)
        ckpt = checkpoint_vs_dd(work)

    rates = {side: [r["tokens_per_s"] for r in records[side]] for side in SIDES}
    per_round = [t / n for t, n in zip(rates["trainer"], rates["nanogpt"], strict=True)]
    small = GPT(PRESETS["small"].model)
    figures = {
        "trainer_vs_nanogpt_tokens_per_s": statistics.median(per_round),
        "trainer_vs_bare_tokens_per_s": statistics.median(rates["trainer"])
        / statistics.median(rates["bare"]),
        "cpu_mfu": statistics.median(r["mfu"] for r in records["trainer"]),
        "loader_tokens_per_s": loader,
        "checkpoint_write_vs_dd": ckpt["ratio"],
    }
    meets_goals = check(figures)
    result = {
        **figures,
        "goals": GOALS,
        "ceilings": CEILINGS,
        "meets_goals": meets_goals,
        "details": {
            **{f"{side}_tokens_per_s": rates[side] for side in SIDES},
            # The spread of the asserted figure: machine load.
            "trainer_vs_nanogpt_per_round": per_round,
            "cpu_fp32_matmul_peak_flops": peak,
            "small_params": small.num_params(),
            "small_flops_per_token": small.flops_per_token(),
            "checkpoint": ckpt,
            # What each side's process ran with (its first round's; every round gets the same).
            "environments": {side: records[side][0]["env"] for side in SIDES},
            "side_torch_threads": {side: records[side][0]["torch_threads"] for side in SIDES},
            "steps_per_round": {"warmup": WARMUP, "measured": MEASURED},
            "cpu": cpu_description(),
            "torch": torch.__version__,
            # The machine's other work: the 1-minute load average as each process started.
            "load_1m_at_start": {side: [r["load_1m"] for r in records[side]] for side in SIDES},
            "wall_s": time.perf_counter() - began,
        },
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    results_file.merge(args.results, "trainer", result)
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}))
    failed = failures(figures)
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
