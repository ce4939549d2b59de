"""bench/results.json: each benchmark script merges its own section into it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def merge(path: str | Path, key: str, section: Mapping[str, Any]) -> None:
    """Write ``section`` under ``key`` in the JSON file ``path`` (created when missing),
    keeping the other scripts' sections."""
    path = Path(path)
    results = json.loads(path.read_text()) if path.exists() else {}
    results[key] = {**results.get(key, {}), **section} if key == "run" else dict(section)
    path.write_text(json.dumps(results, indent=2) + "\n")
