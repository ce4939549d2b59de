"""tests/warm.py, which starts the suite's trainer, example and rank processes from a server that
has imported torch: a warm run sees what a new interpreter sees, and ends as it would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import warm

# Prints what a program can see of how it was started (torch's threads; a child it forks), then
# exits with the status in argv ("none": SystemExit(None)).
PROBE = """
import json, multiprocessing, os, sys
child = multiprocessing.get_context("fork").Process(target=int)
child.start()
child.join()
def annotated(x: int): pass
print(json.dumps({
    "argv": sys.argv, "path": sys.path, "cwd": os.getcwd(), "name": __name__,
    "main": sys.modules["__main__"].__dict__ is globals(),
    "builtins": type(__builtins__).__name__, "probe": os.environ.get("PROBE"),
    "torch_threads": __import__("torch").get_num_threads(),
    "process": multiprocessing.current_process().name,
    "parent": repr(multiprocessing.parent_process()),
    "start_method": multiprocessing.get_start_method(allow_none=True),
    "child": [child.name, child.exitcode], "annotations": str(annotated.__annotations__),
}))
print("to stderr", file=sys.stderr)
raise SystemExit(None if sys.argv[-1] == "none" else int(sys.argv[-1]))
"""


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def _ran(argv: list[str], env: dict[str, str], cwd: Path, warm_run: bool) -> tuple[int, str, str]:
    """(status, stdout, stderr) of ``argv`` warm, or in a new interpreter."""
    if warm_run:
        done = warm.run(argv, env=env, cwd=cwd, timeout=60)
    else:
        done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("form", ["script", "module", "code"])
def test_a_warm_run_sees_what_a_new_interpreter_sees(tmp_path: Path, form: str) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "probe.py").write_text(PROBE)
    head = {"script": [str(tmp_path / "pkg" / "probe.py")], "module": ["-m", "pkg.probe"]}
    status, code = ("none", 0) if form == "script" else ("3", 3)
    # Two threads: a server of its own, started with them.
    env = _env(PROBE="seen", OMP_NUM_THREADS="2" if form == "code" else "1")
    argv = [sys.executable, *head.get(form, ["-c", PROBE]), "a b", status]
    fresh, started = (_ran(argv, env, tmp_path, warm_run) for warm_run in (False, True))
    assert started == fresh and fresh[0] == code and fresh[2] == "to stderr\n"
    assert '"probe": "seen"' in fresh[1] and '"process": "MainProcess"' in fresh[1]
    assert f'"torch_threads": {env["OMP_NUM_THREADS"]}' in fresh[1]
    assert '"child": ["ForkProcess-1", 0]' in fresh[1]


# Leaves work to the interpreter's exit (a non-daemon thread, an atexit handler, a file never
# closed) and ends with the code in argv; draws from numpy's global generator.
AT_EXIT = """
import atexit, sys, threading, time
import numpy
print(numpy.random.randint(1 << 30), flush=True)
threading.Thread(target=lambda: (time.sleep(0.2), print("thread", flush=True))).start()
atexit.register(print, "atexit")
unclosed = open(sys.argv[1], "w")
unclosed.write("written")
exec(sys.argv[2])
"""
ENDS = {
    "pass": (0, ""),
    "raise SystemExit(-2)": (254, ""),
    "raise SystemExit('message')": (1, "message\n"),
    "raise KeyError('k')": (1, "KeyError: 'k'\n"),
    "raise KeyboardInterrupt": (-signal.SIGINT, "KeyboardInterrupt\n"),
}


@pytest.mark.parametrize("end", ENDS)
def test_a_warm_run_ends_as_an_interpreter_does(tmp_path: Path, end: str) -> None:
    """Threads joined, atexit handlers run, files flushed, the exit status and stderr of each end;
    numpy's global generator seeded in each run."""
    (tmp_path / "at_exit.py").write_text(AT_EXIT)
    drawn, (status, ending) = [], ENDS[end]
    for name, warm_run in (("fresh", False), ("warm", True), ("again", True)):
        argv = [sys.executable, str(tmp_path / "at_exit.py"), str(tmp_path / name), end]
        done = _ran(argv, _env(), tmp_path, warm_run)
        first, *rest = done[1].splitlines()
        assert (done[0], rest, (tmp_path / name).read_text()) == (
            status,
            ["thread", "atexit"],
            "written",
        )
        assert done[2].endswith(ending)
        drawn.append(first)
    assert drawn[1] != drawn[2]


def test_a_run_is_signalled_killed_past_its_timeout_and_only_python(tmp_path: Path) -> None:
    wait = tmp_path / "wait.py"
    wait.write_text("import os, sys, time\nprint(os.getpid(), file=sys.stderr)\nprint('up')\n")
    wait.write_text(wait.read_text() + "sys.stdout.flush()\ntime.sleep(60)")
    started = warm.start([sys.executable, str(wait)], env=_env(), cwd=tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        started.wait(0.2)
    started.send_signal(signal.SIGTERM)
    assert started.wait(30) == -signal.SIGTERM
    with pytest.raises(subprocess.TimeoutExpired) as late:
        warm.run([sys.executable, str(wait)], env=_env(), cwd=tmp_path, timeout=2)
    assert late.value.stdout == "up\n"
    with pytest.raises(ProcessLookupError):
        os.kill(int(late.value.stderr), 0)
    for argv in (["python3", "-c", "pass"], [sys.executable, "-u", "x.py"]):
        with pytest.raises(ValueError, match="start this interpreter with a script, -m or -c"):
            warm.start(argv, env=_env())


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
    (tmp_path / "rank.py").write_text(RANK)
    argv = [sys.executable, str(tmp_path / "rank.py"), "none"]
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
