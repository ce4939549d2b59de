"""The trainer benchmark runs each loop in a process of its own with a clean environment, records
what each ran with, and fails an MFU above 1."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from bench import trainer_bench
from bench.trainer_bench import GOALS, check, clean_env, failures, run_side, side_command

TUNING = {
    "THP_MEM_ALLOC_ENABLE": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MALLOC_ARENA_MAX": "2",
    "LD_PRELOAD": "libjemalloc.so",
    "PYTHONPATH": "/elsewhere",
}


def test_the_clean_environment_keeps_paths_locale_and_user_only() -> None:
    shell = {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", **TUNING}
    assert clean_env(shell) == {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8"}


@pytest.mark.slow
def test_the_baseline_runs_alone_and_reports_the_environment_it_ran_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started as the bench starts it, from a process whose own environment has settings that
    tune torch: the baseline sees none of them, and reports what it had (the variables it was
    given, and any torch sets for itself while it runs, such as TORCHINDUCTOR_CACHE_DIR). The
    settings are in this process's environment, so a child that inherited it would have them."""
    for name, value in TUNING.items():
        monkeypatch.setenv(name, value)
    tokens = tmp_path / "train.bin"
    (np.arange(2000) % 64).astype(np.uint16).tofile(tokens)
    script = str(Path(trainer_bench.__file__).with_name("nanogpt_baseline.py"))
    shape = ["--layers", "1", "--heads", "2", "--width", "32", "--seq-len", "16"]
    command = [sys.executable, script, "--tokens", str(tokens), *shape]
    command += ["--vocab", "64", "--batch", "2", "--warmup-steps", "1", "--measured-steps", "2"]
    env = clean_env()

    record = run_side(command, env)

    assert record["env"].items() >= env.items()
    assert not TUNING.keys() & record["env"].keys()
    assert record["tokens_per_s"] > 0
    assert record["torch_threads"] >= 1


def test_a_failing_side_is_named_with_its_error(tmp_path: Path) -> None:
    script = str(Path(trainer_bench.__file__).with_name("nanogpt_baseline.py"))
    with pytest.raises(RuntimeError, match=r"nanogpt_baseline.py exited 2: .*--tokens"):
        run_side([sys.executable, script], clean_env())


def test_each_side_is_its_own_process_and_the_asserted_baseline_is_nanogpts_train_py(
    tmp_path: Path,
) -> None:
    """The baseline starts the baseline's script (which never imports the trainer) with GPT-2's
    biases; the trainer and the bare loop start this script with the peak the bench measured."""
    paths = {"data_dir": tmp_path / "corpus", "tokens": tmp_path / "train.bin", "peak": 1.5e11}
    commands = {side: side_command(side, **paths) for side in trainer_bench.SIDES}
    assert commands["nanogpt"][1].endswith("bench/nanogpt_baseline.py")
    assert commands["nanogpt"][-1] == "--bias"
    for side in ("trainer", "bare"):
        assert commands[side][1].endswith("bench/trainer_bench.py")
        assert commands[side][2:4] == ["--side", side]
        assert float(commands[side][commands[side].index("--peak") + 1]) == 1.5e11
    with pytest.raises(ValueError, match="side 'other' is unknown; known: nanogpt, trainer"):
        side_command("other", **paths)


@pytest.mark.parametrize(
    ("mfu", "meets", "fails"),
    [(0.5, False, False), (0.8, True, False), (1.0, True, False), (1.02, False, True)],
)
def test_an_mfu_above_one_fails_the_bench_and_one_below_its_goal_is_reported(
    mfu: float, meets: bool, fails: bool
) -> None:
    figures = {**GOALS, "cpu_mfu": mfu}
    assert check(figures)["cpu_mfu"] is meets
    assert failures(figures) == (
        [f"cpu_mfu {mfu:.3f} is above 1.0: the peak is wrong"] if fails else []
    )


def test_the_nanogpt_ratio_below_its_goal_fails_the_bench() -> None:
    figures = {**GOALS, "trainer_vs_nanogpt_tokens_per_s": 0.95}
    assert failures(figures) == ["trainer_vs_nanogpt_tokens_per_s 0.950 is below its goal 1.0"]
