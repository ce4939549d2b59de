"""`make bench`: every benchmark of the project, each against its baseline in the same run.

Writes bench/results.json (its synth, trainer and fine_tuning sections). Stops at the first
benchmark that exits non-zero: trainer_bench.py when its nanoGPT figure misses the goal,
hf_bench.py when either of its figures with a goal does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    for script in ("synth_bench.py", "trainer_bench.py", "hf_bench.py"):
        result = subprocess.run([sys.executable, str(HERE / script)])
        if result.returncode:
            return result.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
