"""Python processes for the tests, started warm: forked from a server, a plain interpreter that has
imported torch once (a tiny trainer run, example or rank spends about 6 of its 7 CPU-seconds
importing numpy, torch and torch._dynamo; the suite starts dozens of them on two cores).

The server is this file run as a script, one per set of values of :data:`AT_START`. Its child
takes a run's environment, working directory, ``sys.argv`` and ``sys.path[0]`` and runs the script,
``-m`` module or ``-c`` code with :mod:`runpy`; the interpreter then ends it as it ends a script,
but for freeing every module (:func:`_end`). Unlike a new interpreter: the hash seed is the same
in every run; tracebacks start in this file; a buffered file that a module other than ``__main__``
holds open is not flushed at exit.
"""

from __future__ import annotations

import atexit
import builtins
import gc
import importlib
import json
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

# torch._dynamo: torch imports it on a model's first step, even without compiling.
PRELOAD = ("numpy", "torch", "torch._dynamo")
# Read as the interpreter, the preloaded modules or their native libraries start (OpenMP, BLAS,
# torch's logging, Dynamo, Inductor, Python, locale, temporary directory, loader) but READ_LATER.
AT_START = (
    *("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "NPY_", "NUMPY_", "LD_", "LC_", "LANG", "TZ"),
    *("TORCH_LOGS", "TORCH_COMPILE", "TORCH_USE_RTLD_GLOBAL", "TORCHDYNAMO_", "TORCHINDUCTOR_"),
    *("PYTORCH_", "PYTHON", "TMPDIR", "TEMP", "TMP"),
)
READ_LATER = {"TORCHINDUCTOR_CACHE_DIR", "LANGUAGE"}
MESSAGE = 16  # bytes of a server's message: a run's pid, then its exit status
# After a rank failed, the time the others have to print why before they are killed.
FAILED_RANK_GRACE_S = 10.0
Cwd = str | os.PathLike[str] | None
Env = Mapping[str, str]
_STATUS: list[int | str] = []  # in a run: its exit status, or "interrupt"


def _serve(listener: socket.socket) -> None:
    """Forks a monitor per connection, which forks the run and sends its pid and exit status;
    kills its group once the test process has gone (stdin closed). A run returns when done."""
    sys.path.pop(0)  # this file's directory, which is no run's
    atexit.register(_end)  # first, so called last: after the preloaded modules' and the run's
    for name in PRELOAD:
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors, reaped by the kernel
    while True:
        if listener not in select.select([listener, sys.stdin], [], [])[0]:
            os.killpg(0, signal.SIGKILL)
        conn = listener.accept()[0]
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            request = json.loads(conn.makefile().readline())
            if (pid := os.fork()) == 0:
                conn.close()
                return _run(**request)
            conn.sendall(b"%*d\n" % (MESSAGE - 1, pid))
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            conn.sendall(b"%*d\n" % (MESSAGE - 1, status))
            os._exit(0)
        conn.close()


def _run(argv: list[str], env: dict[str, str], cwd: str, scratch: str) -> None:
    """Becomes the run (``argv`` without the interpreter) as a new interpreter starts it; keeps
    its exit status for :func:`_end` and leaves what it raises to the interpreter."""
    _STATUS.append(1)  # an uncaught exception's
    for fd, path in ((0, os.devnull), (1, f"{scratch}/out"), (2, f"{scratch}/err")):
        opened = os.open(path, (os.O_WRONLY | os.O_APPEND) if fd else os.O_RDONLY)
        os.dup2(opened, fd)
        os.close(opened)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # What the server imported is the run's start-up, not its garbage: collections see the run's
    # own objects only (and no longer touch, so copy, every page the server left).
    gc.freeze()
    # A new interpreter seeds numpy's and torch's global generators at import.
    sys.modules["numpy"].random.seed()
    sys.modules["torch"].seed()
    first, *rest = argv
    script = not first.startswith("-")
    sys.argv = argv if script else [first, *rest[1:]]
    sys.path.insert(0, {"-m": cwd, "-c": ""}.get(first, os.path.dirname(os.path.realpath(first))))
    main = {"__builtins__": builtins}
    try:
        if script:
            runpy.run_path(first, init_globals=main, run_name="__main__")
        elif first == "-m":
            runpy.run_module(rest[0], init_globals=main, run_name="__main__", alter_sys=True)
        else:
            module = sys.modules["__main__"] = types.ModuleType("__main__")
            module.__dict__.update(main)
            exec(compile(rest[0], "<string>", "exec", dont_inherit=True), module.__dict__)
        _STATUS[0] = 0
    except SystemExit as exit:
        _STATUS[0] = 0 if exit.code is None else exit.code if isinstance(exit.code, int) else 1
        raise
    except KeyboardInterrupt:
        _STATUS[0] = "interrupt"
        raise


def _end() -> None:
    """A run's last atexit handler, after its threads were joined and the other handlers called:
    the rest of the interpreter's exit, but freeing every module (seconds of copying the pages
    shared with the server): garbage collected (files flushed), streams flushed, the status."""
    if not _STATUS:
        return
    sys.last_type = sys.last_value = sys.last_traceback = None
    sys.modules.pop("__main__", None)
    gc.collect()
    for stream in (s for s in (sys.stdout, sys.stderr) if not s.closed):  # the run may close one
        stream.flush()
    if _STATUS[0] == "interrupt":
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(int(_STATUS[0]))


_SERVERS: dict[tuple[tuple[str, str], ...], tuple[subprocess.Popen[bytes], bytes]] = {}


def _server(env: Mapping[str, str]) -> bytes:
    """The address of the server for ``env``'s AT_START variables, started with them and the test
    process's others when first needed, in a session of its own (the group it kills at the end)."""
    at_start = {k: v for k, v in env.items() if k.startswith(AT_START) and k not in READ_LATER}
    key = tuple(sorted(at_start.items()))
    if key not in _SERVERS or _SERVERS[key][0].poll() is not None:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(AT_START)}
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind("")  # an abstract address of the kernel's choice: no file
            listener.listen()
            fd = listener.fileno()
            server = subprocess.Popen(
                [sys.executable, __file__, str(fd)],
                env={**inherited, **at_start},
                stdin=subprocess.PIPE,
                pass_fds=[fd],
                start_new_session=True,
            )
            _SERVERS[key] = (server, listener.getsockname())
    return _SERVERS[key][1]


class Started:
    """A warm run, with the parts of ``subprocess.Popen`` the tests use."""

    def __init__(self, argv: Sequence[str], conn: socket.socket, scratch: str) -> None:
        self.args, self._conn, self._scratch = list(argv), conn, scratch
        weakref.finalize(self, shutil.rmtree, scratch, ignore_errors=True)
        weakref.finalize(self, conn.close)
        if not (pid := conn.recv(MESSAGE, socket.MSG_WAITALL)):
            raise RuntimeError("warm: the server has ended (its stderr is the test process's)")
        self.pid = int(pid)
        self.returncode: int | None = None

    def poll(self, timeout: float | None = 0) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], timeout)[0]:
            self.returncode = int(self._conn.recv(MESSAGE, socket.MSG_WAITALL))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if (status := self.poll(timeout)) is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0, *self._output())
        return status

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """(stdout, stderr), once the run has ended."""
        self.wait(timeout)
        return self._output()

    def _output(self) -> tuple[str, str]:
        out, err = (Path(self._scratch, n).read_text(errors="replace") for n in ("out", "err"))
        return out, err

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
        self.wait()


def start(argv: Sequence[str], *, env: Env, cwd: Cwd = None) -> Started:
    """Starts ``argv`` (``[sys.executable, "-m", MODULE, ...]``, ``[sys.executable, "-c", CODE,
    ...]`` or ``[sys.executable, SCRIPT, ...]``) warm. ValueError for another program or an
    interpreter option."""
    if argv[0] != sys.executable or (argv[1].startswith("-") and argv[1] not in ("-m", "-c")):
        raise ValueError(f"warm runs start this interpreter with a script, -m or -c: {argv!r}")
    scratch = tempfile.mkdtemp(prefix="warm-")
    for name in ("out", "err"):
        Path(scratch, name).touch()
    cwd = os.path.realpath(cwd or os.getcwd())
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(_server(env))
    request = {"argv": list(argv[1:]), "env": dict(env), "cwd": cwd, "scratch": scratch}
    conn.sendall(json.dumps(request).encode() + b"\n")
    return Started(argv, conn, scratch)


def run(
    argv: Sequence[str], *, env: Env, cwd: Cwd = None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=timeout)``, warm (output
    that is not UTF-8 decoded with replacement characters)."""
    started = start(argv, env=env, cwd=cwd)
    try:
        stdout, stderr = started.communicate(timeout)
    finally:
        started.kill()
    return subprocess.CompletedProcess(started.args, started.wait(), stdout, stderr)


def free_port() -> int:
    """A TCP port nothing on 127.0.0.1 listens on now (another process may take it first)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def run_ranks(
    argv: Sequence[str], *, env: Env, world: int, timeout: float, per_node: int = 0, cwd: Cwd = None
) -> list[subprocess.CompletedProcess[str]]:
    """Every rank of ``argv`` at once, warm, with torchrun's rank variables (``per_node`` ranks
    a node, default all) but no agents. A rank still running after ``timeout`` seconds, or
    FAILED_RANK_GRACE_S after another failed, is killed (its status -9)."""
    per_node, port = per_node or world, free_port()
    names = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT")
    started: list[Started] = []
    try:
        for rank in range(world):
            ids = map(str, (rank, rank % per_node, rank // per_node, world, per_node, port))
            rank_env = {**env, **dict(zip(names, ids, strict=True)), "MASTER_ADDR": "127.0.0.1"}
            started.append(start(argv, env=rank_env, cwd=cwd))
        deadline = time.monotonic() + timeout
        while running := [r for r in started if r.poll() is None]:
            if any(r.returncode for r in started):  # one failed: the rest get the grace period
                deadline = min(deadline, time.monotonic() + FAILED_RANK_GRACE_S)
            if (left := deadline - time.monotonic()) <= 0:
                break
            select.select([r._conn for r in running], [], [], left)
    finally:
        for rank_run in started:
            rank_run.kill()
    return [subprocess.CompletedProcess(r.args, r.wait(), *r.communicate()) for r in started]


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
