"""The shared example runs (tests/examples/example_runs.py)."""

from __future__ import annotations

import pytest
from example_runs import HF, PLAIN, STEPS, ExampleRun, PreemptedRun, platform_run, preempted_ddp_run


@pytest.fixture(scope="session")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> ExampleRun:
    """The plain example, 30 steps, labelled as a p5 node the way the cuda-torch runtime labels
    its pods."""
    root = tmp_path_factory.mktemp("examples") / "plain"
    return platform_run(root, PLAIN, "--steps", str(STEPS), TRN_GPU_INSTANCE_TYPE="p5.48xlarge")


@pytest.fixture(scope="session")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> ExampleRun:
    """The Hugging Face Trainer example, 30 steps, a checkpoint at the last; no instance type
    (a local run)."""
    root = tmp_path_factory.mktemp("examples") / "hf"
    return platform_run(root, HF, "--max-steps", str(STEPS), "--save-every", str(STEPS))


@pytest.fixture(scope="session")
def preempted_ddp(tmp_path_factory: pytest.TempPathFactory) -> PreemptedRun:
    """Two DDP ranks through the entrypoint, stopped by a SIGTERM after step 20."""
    return preempted_ddp_run(tmp_path_factory.mktemp("examples") / "preempted", 20)
