"""`make bench`: every benchmark of the project, each against its baseline in the same run.

Writes bench/results.json (its synth, trainer, fine_tuning and packing sections). Stops at the
first benchmark that exits non-zero: trainer_bench.py when its nanoGPT figure misses the goal,
hf_bench.py when either of its figures with a goal does, packing_bench.py when packed rows fall
below 0.9 of the stream's tokens/s.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    for script in ("synth_bench.py", "trainer_bench.py", "hf_bench.py", "packing_bench.py"):
        result = subprocess.run([sys.executable, str(HERE / script)])
        if result.returncode:
            return result.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
