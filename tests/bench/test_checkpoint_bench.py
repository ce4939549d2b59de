"""The checkpoint benchmark times each operation of every round but the first and counts the
checkpoint's bytes on disk."""

import importlib
from pathlib import Path

import pytest

from tests.conftest import ROOT


def test_the_first_round_is_not_timed_and_the_bytes_are_the_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    checkpoint_bench = importlib.import_module("checkpoint_bench")
    calls: list[float] = []
    clock = iter(range(1000))

    def ticking() -> float:
        calls.append(1.0)
        return float(next(clock))

    # A clock that ticks a second at each reading: each operation lasts 1 s.
    monkeypatch.setattr(checkpoint_bench.time, "perf_counter", ticking)
    figures = checkpoint_bench.measure("tiny", tmp_path, rounds=1)

    assert {k: figures[k] for k in ("save_s", "resume_s", "load_s")} == {
        "save_s": 1.0,
        "resume_s": 1.0,
        "load_s": 1.0,
    }
    assert len(calls) == 4 * 2  # four readings a round, the untimed first one too
    newest = tmp_path / "step_00000001"
    assert figures["bytes"] == sum(p.stat().st_size for p in newest.rglob("*") if p.is_file())
