"""One run of each example as a platform job runs it (the fixtures in tests/examples/conftest.py),
shared by the tests that assert on it: they carry ``pytest.mark.xdist_group(SHARED)``, so that
one xdist worker runs them and each example runs once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import warm

ROOT = Path(__file__).resolve().parents[2]
PLAIN = ROOT / "examples" / "plain_pytorch" / "train.py"
HF = ROOT / "examples" / "hf_trainer" / "train.py"
ENTRYPOINT = ROOT / "training_image" / "entrypoint.py"
TINY = ["--device", "cpu", "--batch-size", "4", "--seq-len", "32", "--log-every", "5"]
STEPS = 30
SHARED = "example_runs"
# What a job's pod sets, which a test's own environment must not leak into a run.
PLATFORM_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "TRN_CHECKPOINT_DIR",
    "TRN_METRICS_FILE",
    "TRN_INSTANCE_TYPE",
    "TRN_GPU_INSTANCE_TYPE",
)


@dataclass(frozen=True)
class ExampleRun:
    """A finished run: its working directory, where the platform told it to checkpoint and write
    metrics, and the JSON lines it printed (one per logged step)."""

    cwd: Path
    checkpoints: Path
    metrics: Path
    logged: list[dict[str, Any]]


def example_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PLATFORM_VARIABLES}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def run_example(argv: list[str], env: dict[str, str], cwd: Path) -> list[dict[str, Any]]:
    """Runs a script to completion, warm (tests/warm.py); its JSON lines (one per logged
    step)."""
    done = warm.run(argv, env=env, cwd=cwd, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    # The Trainer prints its own log dicts too (Python reprs, single-quoted).
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"')]


def platform_run(root: Path, script: Path, *args: str, **extra: str) -> ExampleRun:
    root.mkdir(parents=True)
    checkpoints = root / "fsx" / "checkpoints" / "mine"
    metrics = root / "metrics" / "run" / "metrics.jsonl"
    env = example_env(TRN_CHECKPOINT_DIR=str(checkpoints), TRN_METRICS_FILE=str(metrics), **extra)
    logged = run_example([sys.executable, str(script), *TINY, *args], env, root)
    return ExampleRun(root, checkpoints, metrics, logged)


@dataclass(frozen=True)
class PreemptedRun:
    """A run stopped by a SIGTERM: the JSON lines it printed before the signal, its exit
    status, its checkpoint directory and what it printed after the signal."""

    logged: list[dict[str, Any]]
    returncode: int
    checkpoints: Path
    rest: str


def preempted_ddp_run(root: Path, steps_before: int) -> PreemptedRun:
    """The plain example on two DDP ranks under torchrun, through the image's entrypoint as
    `trnctl job submit -- torchrun train.py` runs it, checkpointing where the platform says;
    a SIGTERM (a preemption) once it has logged step ``steps_before``."""
    root.mkdir(parents=True)
    checkpoints = root / "checkpoints"
    env = example_env(
        TRN_CHECKPOINT_DIR=str(checkpoints),
        TORCH_NEURONX_NEFF_CACHE_DIR=str(root / "neff"),
        PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    )
    argv = [sys.executable, str(ENTRYPOINT), "--exec", "--", "torchrun", "--standalone"]
    argv += ["--nproc-per-node=2", str(PLAIN), *TINY, "--steps", "100000"]
    entry = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, cwd=root)
    assert entry.stdout is not None
    logged: list[dict[str, Any]] = []
    while not logged or logged[-1]["step"] < steps_before:
        line = entry.stdout.readline()
        if not line:  # ended before the signal: the tests see its status
            break
        logged.append(json.loads(line))
    entry.send_signal(signal.SIGTERM)
    rest, _ = entry.communicate(timeout=120)
    return PreemptedRun(logged, entry.returncode, checkpoints, rest)
