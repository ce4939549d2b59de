"""The benchmark scripts run as scripts (`python bench/x.py`), so their folder is on sys.path and
they import their siblings by name (hf_bench, results_file); the tests see them the same way."""

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
