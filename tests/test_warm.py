"""tests/warm.py, which starts the suite's trainer, example and rank processes from a server that
has imported torch: a warm run sees what a new interpreter sees, and ends as it would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import warm

# Prints what a program can see of how it was started, then exits with the status in argv.
PROBE = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv,
    "path": sys.path,
    "cwd": os.getcwd(),
    "name": __name__,
    "probe": os.environ.get("PROBE"),
    "threads": os.environ.get("OMP_NUM_THREADS"),
}))
print("to stderr", file=sys.stderr)
raise SystemExit(int(sys.argv[-1]))
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
    env = _env(PROBE="seen", PYTHONPATH=str(tmp_path / "elsewhere"))
    fresh, started = _both([sys.executable, *head, "a b", "3"], env, tmp_path)
    assert started == fresh
    assert fresh[0] == 3 and '"probe": "seen"' in fresh[1] and "to stderr" in fresh[2]


def test_a_run_ends_as_an_interpreter_does(tmp_path: Path) -> None:
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

    (tmp_path / "wait.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(60)")
    started = warm.start([sys.executable, "wait.py"], env=_env(), cwd=tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        started.wait(0.2)
    started.send_signal(signal.SIGTERM)
    assert started.wait(30) == -signal.SIGTERM


def test_a_run_may_not_change_what_torch_reads_at_import(tmp_path: Path) -> None:
    probe = [sys.executable, "-c", "pass"]
    with pytest.raises(ValueError, match=r"the run sets \['OMP_NUM_THREADS'\]"):
        warm.start(probe, env={**os.environ, "OMP_NUM_THREADS": "4"})
    with pytest.raises(ValueError, match=r"the run sets \['TORCH_LOGS'\]"):
        warm.start(probe, env=_env(TORCH_LOGS="dynamo"))
    with pytest.raises(ValueError, match="this interpreter with a script, -m or -c"):
        warm.start(["python3", "-c", "pass"], env=_env())


def test_ranks_get_torchruns_variables_and_a_hung_rank_is_killed(tmp_path: Path) -> None:
    (tmp_path / "rank.py").write_text(
        "import os, time\n"
        "names = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK')\n"
        "print(*(os.environ[n] for n in names))\n"
        "if os.environ['RANK'] == '3':\n"
        "    time.sleep(60)\n"
    )
    done = warm.run_ranks(
        [sys.executable, "rank.py"], env=_env(), world=4, per_node=2, cwd=tmp_path, timeout=3
    )
    assert [d.stdout for d in done] == ["0 0 4 2 0\n", "1 1 4 2 0\n", "2 0 4 2 1\n", "3 1 4 2 1\n"]
    assert [d.returncode for d in done] == [0, 0, 0, -signal.SIGKILL]
