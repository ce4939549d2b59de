"""tests/warm.py, which starts the suite's trainer, example and rank processes from a server that
has imported torch: a warm run sees what a new interpreter sees, and ends as it would."""

from __future__ import annotations

import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import warm

# Prints what a program can see of how it was started (torch's threads where TORCH is set; a
# child it forks), then exits with the status in argv ("none": SystemExit(None)).
PROBE = """
import json, multiprocessing, os, sys
from multiprocessing import process, resource_tracker
main = sys.modules["__main__"]
tracker = resource_tracker._resource_tracker._fd
child = multiprocessing.get_context("fork").Process(target=int)
child.start()
child.join()
def annotated(x: int): pass
print(json.dumps({
    "argv": sys.argv,
    "path": sys.path,
    "cwd": os.getcwd(),
    "name": __name__,
    "file": getattr(main, "__file__", None),
    "spec": repr(getattr(main, "__spec__", None)) if sys.argv[0] == "-c" else "",
    "probe": os.environ.get("PROBE"),
    "omp": os.environ.get("OMP_NUM_THREADS"),
    "torch_threads": __import__("torch").get_num_threads() if os.environ.get("TORCH") else 0,
    "process": multiprocessing.current_process().name,
    "parent": repr(multiprocessing.parent_process()),
    "start_method": multiprocessing.get_start_method(allow_none=True),
    "original_dir": process.ORIGINAL_DIR,
    "globals": main.__dict__ is globals(),
    "tracker": tracker,
    "child": [child.name, child.exitcode],
    "annotations": str(annotated.__annotations__),
    "builtins": type(main.__builtins__).__name__,
}))
print("to stderr", file=sys.stderr)
raise SystemExit(None if sys.argv[-1] == "none" else int(sys.argv[-1]))
"""


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def _both(argv: list[str], env: dict[str, str], cwd: Path) -> list[tuple[int, str, str]]:
    """(status, stdout, stderr) of ``argv`` in a new interpreter, then warm."""
    fresh = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    started = warm.run(argv, env=env, cwd=cwd, timeout=60)
    return [(done.returncode, done.stdout, done.stderr) for done in (fresh, started)]


@pytest.mark.parametrize("form", ["script", "module", "code"])
def test_a_warm_run_sees_what_a_new_interpreter_sees(tmp_path: Path, form: str) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "probe.py").write_text(PROBE)
    head = {
        "script": [str(tmp_path / "pkg" / "probe.py")],
        "module": ["-m", "pkg.probe"],
        "code": ["-c", PROBE],
    }[form]
    # The script also imports torch (a new interpreter's import costs seconds) and ends with
    # SystemExit(None).
    status, code, torch = ("none", 0, "1") if form == "script" else ("3", 3, "")
    env = _env(PROBE="seen", PYTHONPATH="elsewhere", TORCH=torch)
    fresh, started = _both([sys.executable, *head, "a b", status], env, tmp_path)
    assert started == fresh
    assert fresh[0] == code and '"probe": "seen"' in fresh[1] and "to stderr" in fresh[2]
    assert f'"torch_threads": {int(bool(torch))}' in fresh[1]
    assert '"process": "MainProcess"' in fresh[1]
    assert '"tracker": null' in fresh[1] and '"child": ["ForkProcess-1", 0]' in fresh[1]


def test_a_server_started_again_keeps_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that died is started again with PRELOAD and one OpenMP thread, whatever the test
    process has set."""
    (tmp_path / "probe.py").write_text(PROBE)
    before = warm.run([sys.executable, "-c", "pass"], env=_env(), timeout=60)
    assert before.returncode == 0
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    os.kill(server, signal.SIGKILL)
    # Dead, and left for the restart check to reap.
    os.waitid(os.P_PID, server, os.WEXITED | os.WNOWAIT)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    argv = [sys.executable, str(tmp_path / "probe.py"), "0"]
    done = warm.run(argv, env=_env(TORCH="1"), cwd=tmp_path, timeout=60)
    assert done.returncode == 0 and '"torch_threads": 1' in done.stdout


def test_exit_statuses_and_signals_are_an_interpreters(tmp_path: Path) -> None:
    """A SystemExit message goes to stderr with status 1, an uncaught exception prints its
    traceback, atexit handlers run, a signal shows as its negative number."""
    message, exception = (tmp_path / name for name in ("message.py", "exception.py"))
    message.write_text("import atexit\natexit.register(print, 'bye')\nraise SystemExit('no')")
    exception.write_text("def f():\n    raise KeyError('k')\nf()")
    fresh_message, warm_message = _both([sys.executable, str(message)], _env(), tmp_path)
    assert warm_message == fresh_message == (1, "bye\n", "no\n")
    fresh_exception, warm_exception = _both([sys.executable, str(exception)], _env(), tmp_path)
    assert warm_exception[:2] == fresh_exception[:2] == (1, "")
    assert warm_exception[2].endswith("KeyError: 'k'\n") and "line 2, in f" in warm_exception[2]
    # A status of -2 is not an interrupt; a run that closed its stdout keeps its own status.
    # An uncaught exception goes to the run's own excepthook.
    negative, closed, hook = (tmp_path / f"{name}.py" for name in ("negative", "closed", "hook"))
    negative.write_text("raise SystemExit(-2)")
    closed.write_text("import sys\nsys.stdout.close()\nraise SystemExit(3)")
    hook.write_text("import sys\nsys.excepthook = lambda *e: print('hook', e[0])\nraise KeyError")
    # A hook that raises: both exceptions printed, as PyErr_Print() does.
    broken = tmp_path / "broken.py"
    broken.write_text("import sys\nsys.excepthook = lambda *e: 1 / 0\nraise KeyError")
    # Zip's end-of-directory signature in a plain script does not make it an application.
    signed = tmp_path / "signed.py"
    signed.write_text("# PK\x05\x06\nprint('a script')")
    # Tracebacks start at the run's own code; a syntax error has none; a missing script is
    # status 2; a directory runs its __main__.py.
    syntax, app = tmp_path / "syntax.py", tmp_path / "app"
    syntax.write_text("x = (\n")
    app.mkdir()
    (app / "__main__.py").write_text("import sys\nprint(sys.argv[0], __file__, sys.path[0])")
    cases = [(negative, 254), (closed, 3), (hook, 1), (broken, 1), (exception, 1), (syntax, 1)]
    cases += [(app, 0), (signed, 0)]
    for script, status in [*cases, (tmp_path / "missing.py", 2)]:
        fresh, started = _both([sys.executable, str(script)], _env(), tmp_path)
        assert started == fresh and fresh[0] == status

    wait = tmp_path / "wait.py"
    wait.write_text(
        "import os, sys, time\nprint(os.getpid(), file=sys.stderr)\n"
        "print('up', flush=True)\ntime.sleep(60)"
    )
    started = warm.start([sys.executable, str(wait)], env=_env(), cwd=tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        started.wait(0.2)
    started.send_signal(signal.SIGTERM)
    assert started.wait(30) == -signal.SIGTERM
    # run() past its timeout: the output so far, and the run killed and gone.
    with pytest.raises(subprocess.TimeoutExpired) as late:
        warm.run([sys.executable, str(wait)], env=_env(), cwd=tmp_path, timeout=2)
    assert late.value.stdout == "up\n"
    with pytest.raises(ProcessLookupError):
        os.kill(int(late.value.stderr), 0)


# Leaves work to the interpreter's exit: a non-daemon thread, an atexit handler, a file never
# closed (in a reference cycle through the script's globals: a collection alone can lose what it
# buffered), an interrupt; draws from numpy's global generator.
AT_EXIT = """
import atexit, sys, threading, time
import numpy
print(numpy.random.randint(1 << 30), flush=True)
threading.Thread(target=lambda: (time.sleep(0.2), print("thread", flush=True))).start()
atexit.register(print, "atexit")
unclosed = open(sys.argv[1], "w")
unclosed.write("written")
def keep():
    return unclosed
class Holder:
    pass
holder = Holder()
holder.me = holder
holder.file = open(sys.argv[1] + ".held", "w")
holder.file.write("held")
if sys.argv[2] == "interrupt":
    raise KeyboardInterrupt
"""


def test_what_an_interpreter_does_at_exit_is_done(tmp_path: Path) -> None:
    script = tmp_path / "at_exit.py"
    script.write_text(AT_EXIT)
    runs = {}
    for how in ("fresh", "warm", "warm again"):
        for end in ("return", "interrupt"):
            file = tmp_path / f"{how}-{end}.txt"
            head = ["-m", "at_exit"] if how == "warm again" else [str(script)]
            argv = [sys.executable, *head, str(file), end]
            if how == "fresh":
                done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=60)
            else:
                done = warm.run(argv, env=_env(), cwd=tmp_path, timeout=60)
            drawn, *rest = done.stdout.splitlines()
            held = Path(f"{file}.held").read_text()
            runs[how, end] = (done.returncode, rest, file.read_text() + held, drawn)
            assert done.stderr.endswith("KeyboardInterrupt\n") == (end == "interrupt")
    for end in ("return", "interrupt"):
        assert runs["warm", end][:3] == runs["warm again", end][:3] == runs["fresh", end][:3]
    assert runs["warm", "return"][:3] == (0, ["thread", "atexit"], "writtenheld")
    assert runs["warm", "interrupt"][0] == -signal.SIGINT
    # numpy's global generator is seeded in each run, as at a new interpreter's import.
    assert runs["warm", "return"][3] != runs["warm again", "return"][3]


def test_a_run_may_not_change_what_is_read_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = [sys.executable, "-c", "pass"]
    with pytest.raises(ValueError, match=r"the run sets \['OMP_NUM_THREADS'\]"):
        warm.start(probe, env={**os.environ, "OMP_NUM_THREADS": "4"})
    with pytest.raises(ValueError, match=r"the run sets \['TORCH_LOGS'\]"):
        warm.start(probe, env=_env(TORCH_LOGS="dynamo"))
    with pytest.raises(ValueError, match=r"the run sets \['PYTHONHASHSEED', 'TMPDIR'\]"):
        warm.start(probe, env=_env(PYTHONHASHSEED="1", TMPDIR=str(tmp_path)))
    with pytest.raises(ValueError, match=r"the run sets \['OMP_NUM_THREADS'\]"):
        warm.start(probe, env={k: v for k, v in _env().items() if k != "OMP_NUM_THREADS"})
    # The run checks again against the server it was forked from: here start() holds a wrong
    # record of the server's environment, as it would of a server started again meanwhile.
    monkeypatch.setitem(warm._server, "env", {**warm._server["env"], "OMP_NUM_THREADS": "4"})
    stale = warm.run(probe, env=_env(OMP_NUM_THREADS="4"), timeout=60)
    message = "warm: the server this run was forked from has OMP_NUM_THREADS: '1', the run '4'"
    assert stale.returncode == 1 and message in stale.stderr
    monkeypatch.undo()
    # What torch reads when it compiles, and what warm runs do as the interpreter would.
    later = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    assert warm.run(probe, env=_env(**later), timeout=60).returncode == 0
    with pytest.raises(ValueError, match="this interpreter with a script, -m or -c"):
        warm.start(["python3", "-c", "pass"], env=_env())
    with pytest.raises(ValueError, match="no interpreter option but -m or -c: '-u'"):
        warm.start([sys.executable, "-u", "x.py"], env=_env())
    with pytest.raises(ValueError, match=r"a script by its absolute path: 'x\.py'"):
        warm.start([sys.executable, "x.py"], env=_env())


# Prints torchrun's rank variables and its generators' seeds; rank 3 hangs, rank FAIL exits 1.
RANK = """
import os, sys, time
import numpy, torch
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
print(*(os.environ[n] for n in names))
print(torch.initial_seed(), numpy.random.randint(1 << 30))
if os.environ["RANK"] == sys.argv[1]:
    raise SystemExit(1)
if os.environ["RANK"] == "3":
    time.sleep(60)
"""


def test_ranks_get_torchruns_variables_and_a_hung_rank_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rank = tmp_path / "rank.py"
    rank.write_text(RANK)
    argv = [sys.executable, str(rank), "none"]
    done = warm.run_ranks(argv, env=_env(), world=4, per_node=2, cwd=tmp_path, timeout=3)
    printed = [d.stdout.splitlines() for d in done]
    assert [p[0] for p in printed] == ["0 0 4 2 0", "1 1 4 2 0", "2 0 4 2 1", "3 1 4 2 1"]
    assert [d.returncode for d in done] == [0, 0, 0, -signal.SIGKILL]
    # Each rank's torch and numpy generators are seeded afresh, as in a new interpreter.
    assert len({p[1].split()[0] for p in printed}) == len({p[1].split()[1] for p in printed}) == 4

    # A failed rank stops the group after the grace period, long before the timeout.
    monkeypatch.setattr(warm, "FAILED_RANK_GRACE_S", 0.5)
    begun = time.monotonic()
    done = warm.run_ranks([*argv[:2], "2"], env=_env(), world=4, cwd=tmp_path, timeout=60)
    assert [d.returncode for d in done] == [0, 0, 1, -signal.SIGKILL]
    assert time.monotonic() - begun < 30


def test_a_runs_resource_tracker_reports_on_its_stderr(tmp_path: Path) -> None:
    """A run's own resource tracker reports what the run leaked before the run is over."""
    leak = tmp_path / "leak.py"
    leak.write_text(
        "from multiprocessing import shared_memory\nshared_memory.SharedMemory(create=True, size=8)"
    )
    for _ in range(3):
        fresh, started = _both([sys.executable, str(leak)], _env(), tmp_path)
        assert "1 leaked shared_memory objects" in fresh[2]
        assert started == fresh
