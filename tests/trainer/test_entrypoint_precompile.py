"""The image's entrypoint with TRN_PRECOMPILE=1: a failing pre-pass stops the job with its
status, and the training run never starts. The real entrypoint, torchrun and trainer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ENTRYPOINT = Path(__file__).parents[2] / "training_image" / "entrypoint.py"


@pytest.mark.slow
def test_a_failing_precompile_pass_stops_the_job_with_its_status(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(
        TRN_PRECOMPILE="1",
        NPROC_PER_NODE="1",
        OMP_NUM_THREADS="1",
        TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "neff"),
        # The pass checks host memory before the data: a busy test machine must not fail there.
        TRN_COMPILE_MEMORY_GIB="0.01",
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
    )
    missing = tmp_path / "no-dataset"

    done = subprocess.run(
        [
            *[sys.executable, str(ENTRYPOINT), "--preset", "tiny", "--device", "cpu"],
            *["--compile", "none", "--data", str(missing)],
            *["--metrics", str(tmp_path / "m.jsonl"), "--checkpoint-dir", str(tmp_path / "ck")],
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    # torchrun's status for a failed worker; one torchrun run (the pre-pass), one failure.
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("Root Cause (first observed failure)") == 1
    assert done.stderr.count(f"trn-train: error: shard {missing}/manifest.json: missing") == 1
    assert not (tmp_path / "m.jsonl").exists() and not (tmp_path / "ck").exists()
