"""`make bench`: every benchmark of the project, each against its baseline in the same run.

Writes bench/results.json afresh: a ``run`` section (the command, when, the machine, its load
before and after, the exit status), then the synth, trainer, fine_tuning, packing, checkpoint
and classification sections of the scripts; then renders it as docs/performance-measured.md
(bench/page.py). Every benchmark runs, whatever the ones before it measured, so that one missed
goal does not hide the other figures; `make bench` fails when any of them exits non-zero
(trainer_bench.py when its nanoGPT figure misses the goal or its CPU MFU is above 1,
hf_bench.py when either of its figures with a goal does, packing_bench.py when packed rows fall
below 0.9 of the stream's tokens/s, classify_bench.py when the classifier's examples/s fall
below transformers' loop's; checkpoint_bench.py has no goal), and the run section records each
script's exit status.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

import results_file

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.json"
PAGE = HERE.parent / "docs" / "performance-measured.md"
SCRIPTS = (
    "synth_bench.py",
    "trainer_bench.py",
    "hf_bench.py",
    "packing_bench.py",
    "checkpoint_bench.py",
    "classify_bench.py",
)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def machine() -> str:
    """The CPU model, logical cores, memory and Python, as far as /proc says."""
    cpu = platform.machine()
    cpuinfo, meminfo = Path("/proc/cpuinfo"), Path("/proc/meminfo")
    if cpuinfo.exists():
        models = [
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = models[0] if models else cpu
    memory = ""
    if meminfo.exists():
        kib = int(meminfo.read_text().split("MemTotal:", 1)[1].split()[0])
        memory = f", {kib / 2**20:.0f} GiB memory"
    return f"{cpu}, {os.cpu_count()} cores{memory}, Python {platform.python_version()}"


def commit() -> str:
    """The commit the bench measures, marked when the tree has other changes (the page this
    bench writes aside); "unknown" outside a git checkout."""
    git = ["git", "-C", str(HERE.parent)]
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        return "unknown"
    status = subprocess.run(
        [*git, "status", "--porcelain", "--", ".", f":!{PAGE.relative_to(HERE.parent)}"],
        capture_output=True,
        text=True,
    )
    changed = " with uncommitted changes" if status.stdout.strip() else ""
    return head.stdout.strip() + changed


def _merge_run(fields: dict[str, object]) -> None:
    results_file.merge(RESULTS, "run", fields)


def main() -> int:
    RESULTS.unlink(missing_ok=True)
    _merge_run(
        {
            "command": "make bench",
            "commit": commit(),
            "started": _now(),
            "machine": machine(),
            "load_before": _load(),
        }
    )
    statuses = {
        script: subprocess.run([sys.executable, str(HERE / script)]).returncode
        for script in SCRIPTS
    }
    failed = [script for script, code in statuses.items() if code]
    status = 1 if failed else 0
    _merge_run(
        {
            "finished": _now(),
            "load_after": _load(),
            "exit_status": status,
            "failed": ", ".join(failed) or "none",
        }
    )
    subprocess.run(
        [sys.executable, str(HERE / "page.py"), "--results", str(RESULTS), "--out", str(PAGE)],
        check=True,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
