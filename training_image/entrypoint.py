#!/usr/bin/env python3
"""The image's ENTRYPOINT: sets the job environment and runs torchrun (see trainer.launch).

``entrypoint.py [trainer run flags...]`` runs the platform's trainer. ``entrypoint.py --exec
[--workdir DIR] -- COMMAND [ARGS...]`` (``trnctl job submit -- COMMAND``) runs your own command
instead, with what the trainer gets: the same checks, node environment (rendezvous from
Kubeflow's ``PET_*``, EFA; on a trn node the compiler flags and the keyed compile cache, on a GPU
node of the ``cuda-torch`` runtime NCCL's EFA settings) and SIGTERM handling.

On SIGTERM (preemption, drain, the end of a Capacity Block) the signal goes to torchrun's
workers when the command is torchrun, as for the trainer (torchrun signalled itself gives them a
fixed shutdown timeout and then exits 1), else to the command. Whatever is still running
``TRN_SHUTDOWN_TIMEOUT_S`` seconds later (the pod's grace period less a margin; default 30) is
killed, so the entrypoint exits before the kubelet's SIGKILL, and it exits non-zero after a
SIGTERM (143 when the command exited 0) so the job counts as interrupted, never as Succeeded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from types import FrameType

from trainer import launch
from trainer.launch import main

EXEC_FLAG = "--exec"
WORKDIR_FLAG = "--workdir"
CHECKPOINT_DIR_ENV = "TRN_CHECKPOINT_DIR"
USAGE = f"usage: entrypoint.py {EXEC_FLAG} [{WORKDIR_FLAG} DIR] -- COMMAND [ARGS...]"


def parse_exec(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(workdir, command)`` from the arguments after ``--exec``.

    Raises:
        ValueError: anything but ``[--workdir DIR] -- COMMAND...``, naming what was wrong.
    """
    rest = list(argv)
    workdir = None
    if rest[:1] == [WORKDIR_FLAG]:
        if len(rest) < 2 or rest[1] == "--":
            raise ValueError(f"{WORKDIR_FLAG} needs a directory; {USAGE}")
        workdir, rest = rest[1], rest[2:]
    if rest[:1] != ["--"]:
        raise ValueError(f"expected -- before the command, got {rest[:1] or 'nothing'}; {USAGE}")
    if len(rest) < 2:
        raise ValueError(f"no command after --; {USAGE}")
    return workdir, rest[1:]


def is_torchrun(command: Sequence[str]) -> bool:
    """Whether ``command`` starts torchrun: the ``torchrun`` script, or ``python -m
    torch.distributed.run``."""
    if PurePath(command[0]).name == "torchrun":
        return True
    return PurePath(command[0]).name.startswith("python") and list(command[1:3]) == [
        "-m",
        "torch.distributed.run",
    ]


def _targets(child: subprocess.Popen[bytes], torchrun: bool) -> list[int]:
    workers = launch.worker_pids(child.pid) if torchrun else []
    return workers or [child.pid]


def run_forwarding_sigterm(
    command: Sequence[str], env: Mapping[str, str], *, cwd: str | None = None
) -> int:
    """Runs ``command`` in its own process group and returns :func:`trainer.launch.exit_status`
    of it. A SIGTERM goes to torchrun's workers (``command`` is torchrun) or to the command;
    ``TRN_SHUTDOWN_TIMEOUT_S`` seconds after the first one, the group is killed."""
    grace = float(env.get("TRN_SHUTDOWN_TIMEOUT_S", launch.DEFAULT_SHUTDOWN_TIMEOUT_S))
    torchrun = is_torchrun(command)
    child = subprocess.Popen(list(command), env=dict(env), cwd=cwd, start_new_session=True)
    terminated = threading.Event()

    def kill_group() -> None:
        with contextlib.suppress(ProcessLookupError):  # the group has exited meanwhile
            os.killpg(child.pid, signal.SIGKILL)

    timer = threading.Timer(grace, kill_group)
    timer.daemon = True

    def forward(signum: int, frame: FrameType | None) -> None:
        if not terminated.is_set():
            terminated.set()
            timer.start()
        for pid in _targets(child, torchrun):
            with contextlib.suppress(ProcessLookupError):  # exited since the listing
                os.kill(pid, signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
        timer.cancel()
    return launch.exit_status(code, terminated=terminated.is_set())


def exec_main(argv: Sequence[str]) -> int:
    """``--exec [--workdir DIR] -- COMMAND...``: the trainer's checks and environment
    (:func:`trainer.launch.node_environment`), then ``COMMAND`` in ``DIR`` (default: the current
    directory). Exit 2 for bad arguments, an image that cannot run on this node, compiler flags
    that contradict the node or the compile cache, or a missing ``DIR``; else the command's
    status (see :func:`run_forwarding_sigterm`)."""
    try:
        workdir, command = parse_exec(argv)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    problem = launch.node_problem(os.environ)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if workdir is not None and not Path(workdir).is_dir():
        print(
            f"error: working directory {workdir} does not exist (staged code is under "
            "/datasets/code/NAME: trnctl code stage DIR NAME --env E)",
            file=sys.stderr,
        )
        return 2
    try:
        env = launch.node_environment(os.environ)
    except ValueError as error:  # flags that contradict the node or the compile cache
        print(f"error: {error}", file=sys.stderr)
        return 2
    if env.get(CHECKPOINT_DIR_ENV):
        Path(env[CHECKPOINT_DIR_ENV]).mkdir(parents=True, exist_ok=True)
    return run_forwarding_sigterm(command, env, cwd=workdir)


def entry(argv: Sequence[str]) -> int:
    """``--exec ...`` runs a command (:func:`exec_main`); anything else is the trainer's run
    (:func:`trainer.launch.main`)."""
    if argv[:1] == [EXEC_FLAG]:
        return exec_main(argv[1:])
    return main(list(argv))


if __name__ == "__main__":
    raise SystemExit(entry(sys.argv[1:]))
