"""Python processes for the tests, started warm: forked from a server that has imported torch
once (the standard library's forkserver with preloaded modules) rather than a new interpreter that
imports it again. A tiny trainer run, example or rank spends about 6 of its 7 CPU-seconds starting
(importing numpy, torch and torch._dynamo); the suite starts dozens of them on two cores.

A test gets what ``subprocess`` gives it for ``python -m MODULE ARGS``, ``python -c CODE ARGS``
or ``python /ABSOLUTE/SCRIPT ARGS``: the arguments, environment and working directory it asked
for, the ``sys.path`` and ``__main__`` a new interpreter would have there, the multiprocessing
state of a main process, a freshly seeded numpy, stdout and stderr (one stream or two), an exit
status with negative signal numbers, and an interpreter's exit (non-daemon threads joined, atexit
handlers run, unreferenced files closed). What differs from a new interpreter:

- the modules in :data:`PRELOAD` are imported with the server's environment, so a run may not
  set otherwise what they, the interpreter or its native libraries read at start
  (:data:`AT_START`: one OpenMP thread, as the suite's trainer runs have); ValueError if it does;
- the hash seed is the server's, the same in every run; a buffered file that a module other than
  ``__main__`` holds open is not flushed at exit; what the server imported is frozen
  (``gc.freeze``): never collected, so a cycle of it that the run drops stays, and left out of
  ``gc.get_objects()`` and ``gc.get_referrers()``;
- a test of which modules a command imports needs ``subprocess``.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import gc
import importlib.machinery
import io
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.process
import multiprocessing.resource_tracker
import os
import pkgutil
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What every warm run imports first anyway: torch, and torch._dynamo, which torch imports on a
# model's first step even without compiling. This module too: the runs' entry point.
PRELOAD = ["numpy", "torch", "torch._dynamo", __name__]
THREADS = "1"
# Variables read when the interpreter, the preloaded modules or their native libraries start
# (OpenMP and BLAS, torch's logging, Dynamo's and Inductor's configuration, the interpreter's own
# start-up, locale, temporary directory, loader): a run must see the server's values, which it
# inherits, not others.
AT_START = (
    *("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "NPY_", "NUMPY_", "LD_", "LC_", "LANG", "TZ"),
    *("TORCH_LOGS", "TORCH_COMPILE", "TORCH_USE_RTLD_GLOBAL", "TORCHDYNAMO_", "TORCHINDUCTOR_"),
    *("PYTORCH_", "PYTHON", "TMPDIR", "TEMP", "TMP"),
)
# Read when used, not at start: Inductor's cache directory (torch sets it in the test process
# itself when it first compiles), gettext's language list, and what a new interpreter's start-up
# warm runs do themselves.
READ_LATER = {"TORCHINDUCTOR_CACHE_DIR", "LANGUAGE", "PYTHONPATH", "PYTHONUNBUFFERED"}


@dataclass(frozen=True)
class _Request:
    """One run as the server's child needs it: ``argv`` without the interpreter."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    sys_path: tuple[str, ...]
    stdout: str
    stderr: str | None  # None: into stdout


def _stream(fd: int, errors: str) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, write_through=True)


def _redirect(request: _Request) -> None:
    out = os.open(request.stdout, os.O_WRONLY | os.O_APPEND)
    os.dup2(out, 1)
    os.close(out)
    if request.stderr is None:
        os.dup2(1, 2)
    else:
        err = os.open(request.stderr, os.O_WRONLY | os.O_APPEND)
        os.dup2(err, 2)
        os.close(err)
    # torch's log handlers hold sys.__stderr__ from the server's import.
    sys.stdout = sys.__stdout__ = _stream(1, "strict")
    sys.stderr = sys.__stderr__ = _stream(2, "backslashreplace")


def _as_main_process(cwd: str) -> None:
    """Multiprocessing as a new interpreter's main process has it: no start method chosen, no
    parent, not daemonic, named MainProcess, started in ``cwd`` (the fields ``_MainProcess``
    sets; the class itself is deleted after use)."""
    process = multiprocessing.process
    main: Any = process.current_process()
    main._identity, main._name, main._parent_pid, main._popen = (), "MainProcess", None, None
    main._config = {"authkey": process.AuthenticationString(os.urandom(32)), "semprefix": "/mp"}
    process._parent_process = None  # type: ignore[attr-defined]
    process.ORIGINAL_DIR = cwd  # type: ignore[attr-defined]
    multiprocessing.context._default_context._actual_context = None  # type: ignore[attr-defined]
    # The forkserver hands its child the test process's resource tracker; a new interpreter
    # starts its own when it first needs one (its warnings then go to the run's stderr).
    tracker: Any = multiprocessing.resource_tracker._resource_tracker
    if tracker._fd is not None:
        os.close(tracker._fd)
    tracker._fd = tracker._pid = None


def _exit_status(code: object) -> int:
    """The status a new interpreter exits with for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _main_module() -> dict[str, Any]:
    """The ``__main__`` module the interpreter makes before it runs a script, ``-m`` module or
    ``-c`` code; its namespace."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__spec__=None, __loader__=None, __builtins__=builtins)
    sys.modules["__main__"] = main
    return main.__dict__


def _run(request: _Request) -> None:
    """Runs the request in a new ``__main__``, as the interpreter does for each form (the
    script's source compiled with its path, the module through runpy's ``python -m`` entry)."""
    first, *rest = request.argv
    main = _main_module()
    if first == "-m":
        module, *args = rest
        sys.argv = ["-m", *args]
        sys.path[:] = [os.getcwd(), *request.sys_path]
        runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]
    elif first == "-c":
        code, *args = rest
        sys.argv = ["-c", *args]
        sys.path[:] = ["", *request.sys_path]
        exec(compile(code, "<string>", "exec", dont_inherit=True), main)
    elif pkgutil.get_importer(first) is not None:
        # A directory or zip file: its __main__ module, found on sys.path[0] (Modules/main.c asks
        # the path hooks, which take no other file).
        sys.argv = [first, *rest]
        sys.path[:] = [first, *request.sys_path]
        runpy._run_module_as_main("__main__", alter_argv=False)  # type: ignore[attr-defined]
    else:
        sys.argv = [first, *rest]
        sys.path[:] = [os.path.dirname(os.path.realpath(first)), *request.sys_path]
        try:
            source = Path(first).read_bytes()
        except OSError as error:
            print(
                f"{sys.executable}: can't open file {first!r}: [Errno {error.errno}] "
                f"{error.strerror}",
                file=sys.stderr,
            )
            raise SystemExit(2) from None
        loader = importlib.machinery.SourceFileLoader("__main__", first)
        main.update(__file__=first, __cached__=None, __loader__=loader)
        exec(compile(source, first, "exec", dont_inherit=True), main)


def _own(trace: types.TracebackType | None) -> types.TracebackType | None:
    """``trace`` from the run's first frame on: without warm.py's frames that called it."""
    while trace is not None and trace.tb_frame.f_code.co_filename == __file__:
        trace = trace.tb_next
    return trace


def _report(error: BaseException) -> None:
    """What PyErr_Print() does with an uncaught exception: ``sys.last_*`` set, the excepthook
    called, and both exceptions printed if the hook itself raises."""
    trace = _own(error.__traceback__)
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, trace
    try:
        sys.excepthook(type(error), error.with_traceback(trace), trace)
    except BaseException as failed:
        # PyErr_Display prints the exception's own __traceback__, whatever it is passed.
        hook_trace = _own(failed.__traceback__)
        print("Error in sys.excepthook:", file=sys.stderr)
        sys.__excepthook__(type(failed), failed.with_traceback(hook_trace), hook_trace)
        print("\nOriginal exception was:", file=sys.stderr)
        sys.__excepthook__(type(error), error, trace)


def _execute(request: _Request) -> tuple[int, bool]:
    """The run's exit status, and whether an interrupt ended it."""
    try:
        _run(request)
    except SystemExit as exit:
        return _exit_status(exit.code), False
    except BaseException as error:
        uncaught = error
    else:
        return 0, False
    # Reported with nothing being handled, as the interpreter calls the hook.
    _report(uncaught)
    return 1, isinstance(uncaught, KeyboardInterrupt)


def _exit(status: int, interrupted: bool) -> None:
    """Ends as an interpreter does: non-daemon threads joined, atexit handlers run, ``__main__``
    dropped and what the run left unreferenced collected (files closed and flushed), streams
    flushed, the run's own resource tracker stopped; an interrupt ends by SIGINT."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    # Py_FinalizeEx collects once with __main__ still imported, then finalize_modules drops the
    # module (its dict goes with it, or with the cycles it is in) and collects again.
    gc.collect()
    sys.last_type = sys.last_value = sys.last_traceback = None  # finalize_modules_delete_special
    sys.modules.pop("__main__", None)
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        if not stream.closed:  # the run may have closed it
            stream.flush()
    # The run's own resource tracker, if it started one, reports leaks on the run's stderr before
    # the run has ended, as a new interpreter's caller would read them.
    with contextlib.suppress(OSError):  # the run may have reaped it, or closed its pipe, itself
        multiprocessing.resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def _child(request: _Request) -> None:
    """The server's child: becomes the run, then exits as an interpreter would."""
    _redirect(request)
    # Checked again against the server this run was forked from, which start() may not have seen
    # (one that died and was started again in between).
    if differ := _set_at_start(request.env, os.environ):
        found = "; ".join(
            f"{n}: {os.environ.get(n)!r}, the run {request.env.get(n)!r}" for n in differ
        )
        raise RuntimeError(f"warm: the server this run was forked from has {found}")
    os.environ.clear()
    os.environ.update(request.env)
    os.chdir(request.cwd)
    _as_main_process(request.cwd)
    # What the server imported is the run's start-up, not its garbage: collections see the
    # run's own objects only (and no longer touch, so copy, every page the server left).
    gc.freeze()
    # A new interpreter seeds numpy's and torch's global generators at import.
    sys.modules["numpy"].random.seed()
    sys.modules["torch"].seed()
    _exit(*_execute(request))


_server: dict[str, Any] = {"pid": None, "env": {}}


def _context() -> multiprocessing.context.ForkServerContext:
    """The forkserver context, its server (started again if it died) running with PRELOAD
    imported and one OpenMP thread; the environment it started with in ``_server``."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    with _one_thread():
        multiprocessing.forkserver.ensure_running()
        pid = multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
        if pid != _server["pid"]:  # started here or in Process.start(), both with one thread
            _server.update(pid=pid, env=dict(os.environ))
    return context


@contextlib.contextmanager
def _one_thread() -> Any:
    """The test process's environment with OMP_NUM_THREADS=1, for a server started meanwhile."""
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = THREADS
    try:
        yield
    finally:
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved


def _set_at_start(env: Mapping[str, str], server: Mapping[str, str]) -> list[str]:
    """The variables of AT_START that ``env`` sets otherwise than the ``server``'s environment."""
    names = {name for name in [*env, *server] if name.startswith(AT_START)} - READ_LATER
    return sorted(name for name in names if env.get(name) != server.get(name))


_FRESH_PATHS: dict[str, tuple[str, ...]] = {}


def _fresh_sys_path(env: Mapping[str, str], cwd: str) -> tuple[str, ...]:
    """``sys.path`` after its first entry in a new interpreter with ``env``'s PYTHONPATH (its
    entries made absolute from ``cwd``, as the interpreter's start-up does)."""
    value = env.get("PYTHONPATH", "")
    entries = value.split(os.pathsep) if value else []
    key = os.pathsep.join(os.path.join(cwd, entry) if entry else cwd for entry in entries)
    if key not in _FRESH_PATHS:
        fresh_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        printed = subprocess.run(
            [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
            env={**fresh_env, "PYTHONPATH": key} if key else fresh_env,
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        _FRESH_PATHS[key] = tuple(json.loads(printed))
    return _FRESH_PATHS[key]


_LIVE: weakref.WeakSet[Started] = weakref.WeakSet()


@atexit.register
def _kill_live_runs() -> None:
    """Kills the runs still going when the test process exits. Registered after multiprocessing's
    own exit function, so it runs first: that one would SIGTERM them and wait without limit for
    one that keeps running (the trainer checkpoints on SIGTERM)."""
    for started in list(_LIVE):
        started.kill()


class Started:
    """A warm run, with the parts of ``subprocess.Popen`` the tests use. The test process kills
    it if it is still running when the test process exits."""

    def __init__(
        self,
        argv: Sequence[str],
        request: _Request,
        scratch: str,
        context: multiprocessing.context.ForkServerContext,
    ) -> None:
        self.args = list(argv)
        self._request = request
        self._scratch = scratch
        weakref.finalize(self, shutil.rmtree, scratch, ignore_errors=True)
        self._process = context.Process(target=_child, args=(request,), name="warm")
        # Daemonic, or multiprocessing's exit function would wait for it without limit (and
        # _kill_live_runs could not run first). The run itself is a main process again
        # (_as_main_process).
        self._process.daemon = True
        with _one_thread():  # a server that died since start() looked is started here again
            self._process.start()
        _LIVE.add(self)
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
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0, *self._read())
        return self.returncode

    def _read(self) -> tuple[str, str | None]:
        stderr = self._request.stderr
        return (
            Path(self._request.stdout).read_text(errors="replace"),
            None if stderr is None else Path(stderr).read_text(errors="replace"),
        )

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """Waits for the exit; (stdout, stderr), stderr None when it went into stdout."""
        self.wait(timeout)
        if self._output is None:
            self._output = self._read()
            shutil.rmtree(self._scratch, ignore_errors=True)
        return self._output

    def send_signal(self, signal: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    @property
    def sentinel(self) -> int:
        """Ready when the run has ended (``multiprocessing.connection.wait``)."""
        return self._process.sentinel


def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None = None,
    stderr_into_stdout: bool = False,
) -> Started:
    """Starts ``argv`` (``[sys.executable, "-m", MODULE, ...]``, ``[sys.executable, "-c", CODE,
    ...]`` or ``[sys.executable, "/ABSOLUTE/SCRIPT", ...]``) warm. ValueError for another
    program, an interpreter option, a relative script path, or an environment whose AT_START
    variables differ from the server's (which has OMP_NUM_THREADS=1)."""
    if len(argv) < 2 or argv[0] != sys.executable:
        raise ValueError(f"warm runs start this interpreter with a script, -m or -c: {argv!r}")
    first = argv[1]
    if first.startswith("-") and first not in ("-m", "-c"):
        raise ValueError(f"warm runs take no interpreter option but -m or -c: {first!r}")
    if not first.startswith("-") and not os.path.isabs(first):
        raise ValueError(f"warm runs take a script by its absolute path: {first!r}")
    context = _context()
    if differ := _set_at_start(env, _server["env"]):
        raise ValueError(f"warm runs inherit what is read at start; the run sets {differ}")
    workdir = os.path.realpath(cwd or os.getcwd())
    scratch = tempfile.mkdtemp(prefix="warm-")
    outputs = [os.path.join(scratch, name) for name in ("stdout", "stderr")]
    for path in outputs:
        Path(path).touch()
    request = _Request(
        argv=tuple(argv[1:]),
        env=dict(env),
        cwd=workdir,
        sys_path=_fresh_sys_path(env, workdir),
        stdout=outputs[0],
        stderr=None if stderr_into_stdout else outputs[1],
    )
    return Started(argv, request, scratch, context)


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None = None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=timeout)``, warm: killed,
    and TimeoutExpired with its output so far, after ``timeout`` seconds. Output that is not
    UTF-8 is decoded with replacement characters."""
    started = start(argv, env=env, cwd=cwd)
    try:
        stdout, stderr = started.communicate(timeout)
    finally:
        if started.poll() is None:
            started.kill()
            started.wait()
    return subprocess.CompletedProcess(started.args, started.wait(), stdout, stderr)


def free_port() -> int:
    """A TCP port nothing on 127.0.0.1 listens on now (another process may take it before the
    caller binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def rank_env(
    env: Mapping[str, str], *, rank: int, world: int, per_node: int, port: int
) -> dict[str, str]:
    """``env`` with torchrun's rank variables for worker ``rank`` of ``world`` (``per_node`` on
    each node; rank 0 hosts the rendezvous store on 127.0.0.1:``port``)."""
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


# How long the other ranks may still run after one failed, before they are killed (torchrun's
# agent stops the group at once; this leaves time to print why).
FAILED_RANK_GRACE_S = 10.0


def _wait_all(started: list[Started], timeout: float) -> None:
    """Until every rank has ended, or ``timeout`` seconds have passed, or one failed and the rest
    have had FAILED_RANK_GRACE_S more."""
    deadline = time.monotonic() + timeout
    while running := [rank for rank in started if rank.poll() is None]:
        if any(rank.poll() for rank in started):
            deadline = min(deadline, time.monotonic() + FAILED_RANK_GRACE_S)
        left = deadline - time.monotonic()
        if left <= 0:
            break
        multiprocessing.connection.wait([rank.sentinel for rank in running], left)


def run_ranks(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    world: int,
    per_node: int | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float,
) -> list[subprocess.CompletedProcess[str]]:
    """Every rank of ``argv`` at once, warm, with torchrun's rank variables (:func:`rank_env`),
    without its agents (one more torch process each, and a store of their own, which nothing
    here needs). A rank still running after ``timeout`` seconds, or FAILED_RANK_GRACE_S after
    another rank failed, is killed (a rank that died can leave the others waiting in a
    collective); its status is then -9."""
    layout = {"world": world, "per_node": per_node or world, "port": free_port()}
    started: list[Started] = []
    try:
        for rank in range(world):
            started.append(start(argv, env=rank_env(env, rank=rank, **layout), cwd=cwd))
        _wait_all(started, timeout)
    finally:
        for run in started:
            run.kill()
    outputs = [rank.communicate() for rank in started]
    return [
        subprocess.CompletedProcess(rank.args, rank.wait(), out, err)
        for rank, (out, err) in zip(started, outputs, strict=True)
    ]
