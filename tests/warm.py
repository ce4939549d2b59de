"""Python processes for the tests, started warm: forked from a server that has imported torch
once (the standard library's forkserver with preloaded modules) rather than a new interpreter that
imports it again. A trainer, example or rank process spends about 4.5 of its 7 CPU-seconds
importing torch and torch._dynamo; the suite starts dozens of them on two cores.

A test gets what ``subprocess`` gives it for ``python -m MODULE ARGS``, ``python -c CODE ARGS``
or ``python SCRIPT ARGS``: the arguments, environment and working directory it asked for, the
``sys.path`` a new interpreter would have there, stdout and stderr (one stream or two), an exit
status with negative signal numbers, a pid to signal, atexit handlers run at exit. What differs
from a new interpreter: the modules in :data:`PRELOAD` are imported before the run's environment
is set, so a run may not set what they read at import otherwise than the server
(:data:`AT_IMPORT`: one OpenMP thread, as the suite's trainer runs have), and a test of which
modules a command imports needs ``subprocess``.
"""

from __future__ import annotations

import atexit
import io
import json
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# What every warm run imports first anyway: torch, and torch._dynamo, which torch imports on a
# model's first step even without compiling. This module too: the runs' entry point.
PRELOAD = ["numpy", "torch", "torch._dynamo", __name__]
THREADS = "1"
# Variables the preloaded modules or their native libraries read at import (OpenMP, torch's
# logging, Dynamo's and Inductor's configuration): a run must see the server's values, which it
# inherits, not others. But for Inductor's cache directory, which torch reads when it compiles
# and sets in the test process itself.
AT_IMPORT = ("OMP_", "MKL_", "KMP_", "TORCH", "PYTORCH_")
READ_AT_RUN = {"TORCHINDUCTOR_CACHE_DIR"}


@dataclass(frozen=True)
class _Request:
    """One run as the server's child needs it: ``argv`` without the interpreter."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    sys_path: tuple[str, ...]
    stdout: str
    stderr: str | None  # None: into stdout


def _stream(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False), encoding="utf-8", line_buffering=True
    )


def _redirect(request: _Request) -> None:
    out = os.open(request.stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(out, 1)
    os.close(out)
    if request.stderr is None:
        os.dup2(1, 2)
    else:
        err = os.open(request.stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(err, 2)
        os.close(err)
    sys.stdout, sys.stderr = _stream(1), _stream(2)
    sys.stdout.reconfigure(write_through=True)
    sys.stderr.reconfigure(write_through=True, errors="backslashreplace")


def _exit_status(code: object) -> int:
    """The status a new interpreter exits with for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _execute(request: _Request) -> int:
    first, *rest = request.argv
    try:
        if first == "-m":
            module, *args = rest
            sys.argv = ["-m", *args]
            sys.path[:] = [request.cwd, *request.sys_path]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        elif first == "-c":
            code, *args = rest
            sys.argv = ["-c", *args]
            sys.path[:] = ["", *request.sys_path]
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = [first, *rest]
            sys.path[:] = [os.path.dirname(os.path.realpath(first)), *request.sys_path]
            runpy.run_path(first, run_name="__main__")
    except SystemExit as exit:
        return _exit_status(exit.code)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _child(request: _Request) -> None:
    """The server's child: becomes the run, then exits as an interpreter would."""
    os.environ.clear()
    os.environ.update(request.env)
    os.chdir(request.cwd)
    _redirect(request)
    status = _execute(request)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


_SERVER_ENV: dict[str, str] = {}


def _context() -> multiprocessing.context.ForkServerContext:
    """The forkserver context, its server started with PRELOAD imported and one OpenMP thread."""
    context = multiprocessing.get_context("forkserver")
    if _SERVER_ENV:
        return context
    context.set_forkserver_preload(PRELOAD)
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = THREADS
    try:
        multiprocessing.forkserver.ensure_running()
        _SERVER_ENV.update(os.environ)
    finally:
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    return context


def _read_at_import(env: Mapping[str, str]) -> list[str]:
    """The variables of AT_IMPORT that ``env`` sets otherwise than the server."""
    _context()
    names = {name for name in [*env, *_SERVER_ENV] if name.startswith(AT_IMPORT)} - READ_AT_RUN
    return sorted(name for name in names if env.get(name) != _SERVER_ENV.get(name))


_FRESH_PATHS: dict[str, tuple[str, ...]] = {}


def _fresh_sys_path(env: Mapping[str, str], cwd: str) -> tuple[str, ...]:
    """``sys.path`` after its first entry in a new interpreter with ``env``'s PYTHONPATH."""
    key = env.get("PYTHONPATH", "")
    if key not in _FRESH_PATHS:
        printed = subprocess.run(
            [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
            env={**env, "PYTHONPATH": key}
            if key
            else {k: v for k, v in env.items() if k != "PYTHONPATH"},
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        _FRESH_PATHS[key] = tuple(json.loads(printed))
    return _FRESH_PATHS[key]


class Started:
    """A warm run, with the parts of ``subprocess.Popen`` the tests use."""

    def __init__(self, argv: Sequence[str], request: _Request, scratch: str) -> None:
        self.args = list(argv)
        self._request = request
        self._scratch = scratch
        weakref.finalize(self, shutil.rmtree, scratch, ignore_errors=True)
        self._process = _context().Process(target=_child, args=(request,), name="warm")
        self._process.start()
        self.pid: int = self._process.pid  # type: ignore[assignment]
        self._output: tuple[str, str | None] | None = None

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """Waits for the exit; (stdout, stderr), stderr None when it went into stdout."""
        self.wait(timeout)
        if self._output is None:
            stderr = self._request.stderr
            self._output = (
                Path(self._request.stdout).read_text(errors="replace"),
                None if stderr is None else Path(stderr).read_text(errors="replace"),
            )
            shutil.rmtree(self._scratch, ignore_errors=True)
        return self._output

    def send_signal(self, signal: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal)

    def kill(self) -> None:
        self._process.kill()


def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None = None,
    stderr_into_stdout: bool = False,
) -> Started:
    """Starts ``argv`` (``[sys.executable, "-m", MODULE, ...]``, ``[sys.executable, "-c", CODE,
    ...]`` or ``[sys.executable, SCRIPT, ...]``) warm. ValueError for another program, or an
    environment whose AT_IMPORT variables differ from the server's (OMP_NUM_THREADS=1)."""
    if not argv or argv[0] != sys.executable or len(argv) < 2:
        raise ValueError(f"warm runs start this interpreter with a script, -m or -c: {argv!r}")
    if differ := _read_at_import(env):
        raise ValueError(f"warm runs inherit what torch reads at import; the run sets {differ}")
    workdir = os.path.abspath(cwd or os.getcwd())
    scratch = tempfile.mkdtemp(prefix="warm-")
    request = _Request(
        argv=tuple(argv[1:]),
        env=dict(env),
        cwd=workdir,
        sys_path=_fresh_sys_path(env, workdir),
        stdout=os.path.join(scratch, "stdout"),
        stderr=None if stderr_into_stdout else os.path.join(scratch, "stderr"),
    )
    return Started(argv, request, scratch)


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None = None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=timeout)``, warm: killed
    and TimeoutExpired after ``timeout`` seconds."""
    started = start(argv, env=env, cwd=cwd)
    try:
        stdout, stderr = started.communicate(timeout)
    except subprocess.TimeoutExpired:
        started.kill()
        started.wait()
        raise
    return subprocess.CompletedProcess(started.args, started.wait(), stdout, stderr)


def free_port() -> int:
    """A TCP port nothing on 127.0.0.1 listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def rank_env(
    env: Mapping[str, str], *, rank: int, world: int, per_node: int, port: int
) -> dict[str, str]:
    """``env`` with the variables torchrun gives worker ``rank`` of ``world`` (``per_node`` on
    each node, the rendezvous store on 127.0.0.1:``port``)."""
    return {
        **env,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world),
        "RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(per_node),
        "LOCAL_RANK": str(rank % per_node),
        "GROUP_RANK": str(rank // per_node),
    }


def run_ranks(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    world: int,
    per_node: int | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float,
) -> list[subprocess.CompletedProcess[str]]:
    """Every rank of ``argv`` at once, warm, with torchrun's variables (:func:`rank_env`): what
    torchrun's workers see, without its agents, which add two torch processes and nothing the
    tests look at. A rank still running after ``timeout`` seconds is killed with the rest (a rank
    that died leaves the others waiting in a collective); its status is then -9."""
    port = free_port()
    layout = {"world": world, "per_node": per_node or world, "port": port}
    started = [start(argv, env=rank_env(env, rank=r, **layout), cwd=cwd) for r in range(world)]
    deadline = time.monotonic() + timeout
    try:
        for rank in started:
            rank.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for rank in started:
            rank.kill()
    outputs = [rank.communicate() for rank in started]
    return [
        subprocess.CompletedProcess(rank.args, rank.wait(), out, err)
        for rank, (out, err) in zip(started, outputs, strict=True)
    ]
