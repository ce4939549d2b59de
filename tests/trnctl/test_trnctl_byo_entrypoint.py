"""The image's entrypoint in its --exec mode (what `trnctl job submit -- COMMAND` runs): the
command gets the trainer's job environment and working directory, and a SIGTERM reaches it (or
torchrun's workers) with a grace period. Real processes, real signals, real torchrun."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENTRYPOINT = Path(__file__).resolve().parents[2] / "training_image" / "entrypoint.py"
PREEMPTED_EXIT = 128 + signal.SIGTERM  # trainer.launch.PREEMPTED_EXIT

# Prints its working directory and environment as JSON.
SHOW = "import json, os; print(json.dumps({'cwd': os.getcwd(), 'env': dict(os.environ)}))"
# A training script that checkpoints on SIGTERM: marks itself ready, then on the signal writes a
# checkpoint after a moment and exits with argv[2]. It also starts a child (a data loader
# worker, say) that ignores SIGTERM: the signal must reach the script, not its children.
SCRIPT = """
import os, signal, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[1])
loader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
def stop(signum, frame):
    time.sleep(0.5)
    (out / f"checkpoint-{os.getpid()}").touch()
    loader.kill()
    sys.exit(int(sys.argv[2]))
signal.signal(signal.SIGTERM, stop)
(out / f"ready-{os.getpid()}").touch()
while True:
    time.sleep(0.05)
"""
# Ignores SIGTERM: only the grace period's SIGKILL ends it.
STUBBORN = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, signal.SIG_IGN)
(Path(sys.argv[1]) / "ready-0").touch()
while True:
    time.sleep(0.05)
"""


def job_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A CPU job environment: no torchrun variables from outside, the compile cache and the
    checkpoint directory under ``tmp_path``, torchrun on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "neff"),
        TRN_CHECKPOINT_DIR=str(tmp_path / "fsx" / "checkpoints" / "mine"),
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        **extra,
    )
    return env


def entrypoint(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ENTRYPOINT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_command_gets_the_job_environment_in_its_working_directory(tmp_path: Path) -> None:
    workdir = tmp_path / "datasets" / "code" / "mine"
    workdir.mkdir(parents=True)
    env = job_env(
        tmp_path,
        PET_NNODES="2",
        PET_NODE_RANK="1",
        PET_MASTER_ADDR="run-mine-node-0-0.run-mine",
        PET_MASTER_PORT="29400",
        PET_NPROC_PER_NODE="64",
    )

    done = entrypoint(
        "--exec", "--workdir", str(workdir), "--", sys.executable, "-c", SHOW, env=env
    )

    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["cwd"] == str(workdir)
    seen = shown["env"]
    # The rendezvous Kubeflow hands every node, under the names scripts read too.
    assert (seen["NNODES"], seen["NODE_RANK"], seen["MASTER_PORT"]) == ("2", "1", "29400")
    assert seen["MASTER_ADDR"] == "run-mine-node-0-0.run-mine"
    assert seen["PET_NPROC_PER_NODE"] == "64"  # torchrun's own default for --nproc-per-node
    # EFA and the compiler, as for the trainer; the compile cache keyed by compiler and flags.
    assert (seen["FI_PROVIDER"], seen["FI_EFA_USE_DEVICE_RDMA"]) == ("efa", "1")
    assert "--model-type transformer" in seen["NEURON_CC_FLAGS"]
    assert seen["TORCH_NEURONX_NEFF_CACHE_DIR"].startswith(f"{tmp_path / 'neff'}/neuronx-cc-")
    assert Path(seen["TORCH_NEURONX_NEFF_CACHE_DIR"]).is_dir()
    assert "compile cache: TORCH_NEURONX_NEFF_CACHE_DIR=" in done.stderr
    # The checkpoint directory exists before the command starts.
    assert Path(seen["TRN_CHECKPOINT_DIR"]).is_dir()


def test_the_command_status_is_the_entrypoint_status(tmp_path: Path) -> None:
    done = entrypoint(
        "--exec", "--", sys.executable, "-c", "raise SystemExit(7)", env=job_env(tmp_path)
    )
    assert done.returncode == 7


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--exec"], r"expected -- before the command, got nothing"),
        (["--exec", "python"], r"expected -- before the command, got \['python'\]"),
        (["--exec", "--"], r"no command after --"),
        (["--exec", "--workdir", "--", "x"], r"--workdir needs a directory"),
        (["--exec", "--workdir", "/no/such/dir", "--", "x"], r"working directory /no/such/dir "),
    ],
)
def test_bad_exec_arguments_stop_with_a_message(
    tmp_path: Path, args: list[str], message: str
) -> None:
    done = entrypoint(*args, env=job_env(tmp_path))

    assert done.returncode == 2
    assert re.search(message, done.stderr), done.stderr


def test_a_stack_that_cannot_run_on_the_instance_type_is_refused(tmp_path: Path) -> None:
    env = job_env(tmp_path, NEURON_STACK="native", TRN_INSTANCE_TYPE="trn1.32xlarge")

    done = entrypoint("--exec", "--", sys.executable, "-c", "pass", env=env)

    assert done.returncode == 2
    assert "trn1.32xlarge" in done.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"NEURON_CC_FLAGS": "--cache_dir=/tmp/mine"},
            "NEURON_CC_FLAGS sets --cache_dir=/tmp/mine",
        ),
        (
            {"NEURON_CC_FLAGS": "--logical-nc-config=1", "NEURON_LOGICAL_NC_CONFIG": "2"},
            "NEURON_CC_FLAGS sets --logical-nc-config 1 but NEURON_LOGICAL_NC_CONFIG is 2",
        ),
    ],
)
def test_flags_the_node_cannot_take_are_one_line_and_exit_2(
    tmp_path: Path, extra: dict[str, str], message: str
) -> None:
    env = job_env(tmp_path, NEURON_STACK="xla", TRN_INSTANCE_TYPE="trn1.32xlarge", **extra)

    done = entrypoint("--exec", "--", sys.executable, "-c", "pass", env=env)

    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {message}"), done.stderr
    assert "Traceback" not in done.stderr


def under_sigterm(command: list[str], out: Path, ready: int, **extra: str) -> tuple[int, float]:
    """Runs ``entrypoint.py --exec -- command``, SIGTERMs it once ``ready`` processes have
    marked themselves ready; its exit status and the seconds from the signal to its exit."""
    entry = subprocess.Popen(
        [sys.executable, str(ENTRYPOINT), "--exec", "--", *command], env=job_env(out, **extra)
    )
    deadline = time.monotonic() + 60
    while len(list(out.glob("ready-*"))) < ready:
        assert entry.poll() is None and time.monotonic() < deadline, "the command did not start"
        time.sleep(0.05)
    signalled = time.monotonic()
    entry.send_signal(signal.SIGTERM)
    code = entry.wait(timeout=60)
    return code, time.monotonic() - signalled


@pytest.mark.parametrize(("script_code", "status"), [(0, PREEMPTED_EXIT), (3, 3)])
def test_sigterm_reaches_the_command_which_checkpoints_and_the_run_ends_interrupted(
    tmp_path: Path, script_code: int, status: int
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    command = [sys.executable, str(tmp_path / "train.py"), str(tmp_path), str(script_code)]

    code, _ = under_sigterm(command, tmp_path, ready=1)

    assert code == status
    assert len(list(tmp_path.glob("checkpoint-*"))) == 1


@pytest.mark.slow
def test_real_torchrun_workers_get_the_sigterm_and_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    command = [
        "torchrun",
        "--standalone",
        "--nproc-per-node=2",
        str(tmp_path / "train.py"),
        str(tmp_path),
        "0",
    ]

    code, _ = under_sigterm(command, tmp_path, ready=2)

    # Both workers wrote their checkpoint and exited 0, so torchrun did too; the pod still
    # fails, as an interrupted run.
    assert code == PREEMPTED_EXIT
    assert len(list(tmp_path.glob("checkpoint-*"))) == 2


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    command = [sys.executable, str(tmp_path / "stubborn.py"), str(tmp_path)]

    code, seconds = under_sigterm(command, tmp_path, ready=1, TRN_SHUTDOWN_TIMEOUT_S="1")

    assert code == 128 + signal.SIGKILL
    assert 1 <= seconds < 10
