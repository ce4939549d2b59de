"""`make bench`: every benchmark of the project, each against its baseline in the same run.

Writes bench/results.json (synth and trainer sections).
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
