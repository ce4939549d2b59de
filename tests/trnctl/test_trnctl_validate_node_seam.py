"""Seam: what ``python -m trainer.validate_node`` prints is what ``trnctl validate`` judges.

The program runs for real (torchrun, two gloo ranks on CPU, the fake neuron-ls and sysfs of its
own tests); its stdout goes to trnctl's parser and judge, and through the fake Kubernetes API as
the pods' logs to the ``validate`` command. A key renamed on either side, or a count read wrong,
fails here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import test_trnctl_kube
from fake_kube import FakeKube
from test_trnctl_kube import _finished

import trn_catalog
from tests.trainer.test_validate_node import NEURON_LS, _script, _sysfs
from trnctl import validation
from trnctl.errors import ExitCode

# The fake node matches trn2.48xlarge: 16 devices of 8 NeuronCores, 16 EFA interfaces.
SPEC = trn_catalog.get("trn2.48xlarge")
# trn-dev (trn2.48xlarge, two nodes) whose API server is the fake one of the job tests.
fake = test_trnctl_kube.fake
CPU_OVER_TCP = "all-reduce ran on gloo (CPU over TCP), not a Neuron backend (neuron or xla)"


def _run_node(tmp: Path, *args: str, **env_overrides: str) -> subprocess.CompletedProcess[str]:
    """The program in node mode, as a pod runs it, with two CPU ranks and the fakes."""
    tool = _script(tmp / "neuron-ls", NEURON_LS)
    sysfs = _sysfs(tmp / "sys", 16)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(
        NPROC_PER_NODE="2",
        OMP_NUM_THREADS="1",
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        **env_overrides,
    )
    return subprocess.run(
        [
            *[sys.executable, "-m", "trainer.validate_node", "--size-mib", "1"],
            *["--iterations", "1", "--sysfs", str(sysfs), "--neuron-ls", tool, *args],
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def cpu_node(tmp_path_factory: pytest.TempPathFactory) -> str:
    """stdout of a node whose all-reduce ran, over gloo."""
    done = _run_node(tmp_path_factory.mktemp("cpu-node"), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def native_node(tmp_path_factory: pytest.TempPathFactory) -> str:
    """stdout of a node of the native image without a Neuron device: the all-reduce fails."""
    tmp = tmp_path_factory.mktemp("native-node")
    done = _run_node(tmp, NEURON_STACK="native", TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp / "neff"))
    assert done.returncode != 0
    return done.stdout


def test_trnctl_reads_every_key_of_the_programs_line(cpu_node: str) -> None:
    report = validation.parse(cpu_node)

    assert report is not None, cpu_node
    assert report["node"] == socket.gethostname()
    assert report["node_rank"] == 0
    assert (report["stack"], report["device"], report["backend"]) == (None, "cpu", "gloo")


def test_counts_the_program_reads_pass_the_catalog_and_gloo_does_not(cpu_node: str) -> None:
    result = validation.judge(0, "p", cpu_node, SPEC)

    # Devices, cores and EFA agree with the catalog: only the CPU all-reduce is refused.
    assert result.problems == (CPU_OVER_TCP,)


def test_counts_the_program_reads_are_compared_with_the_instance_type(cpu_node: str) -> None:
    trn1 = trn_catalog.get("trn1.32xlarge")  # 16 devices, 32 cores, 8 EFA interfaces

    result = validation.judge(0, "p", cpu_node, trn1)

    assert result.problems == (
        "neuron cores 128, catalog 32 (32 logical)",
        "EFA interfaces 16, catalog 8",
        CPU_OVER_TCP,
    )


def test_the_programs_error_reaches_the_verdict(native_node: str) -> None:
    result = validation.judge(0, "p", native_node, SPEC)

    (problem,) = result.problems
    assert problem.startswith("all-reduce failed: ")
    assert "device 'neuron' is not available" in problem
    assert result.report is not None and result.report["node"] == socket.gethostname()


def _pods_log(fake: FakeKube, logs: dict[int, str]) -> None:
    def created(job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        fake.statuses[name] = [{"conditions": []}, _finished("Complete")]
        for index, log in logs.items():
            fake.add_pod(name, index, f"compile cache: x\n{log}")

    fake.on_create = created


def test_validate_command_judges_the_programs_output(
    fake: FakeKube, trnctl: Callable[..., Any], cpu_node: str, native_node: str
) -> None:
    _pods_log(fake, {0: cpu_node, 1: native_node})

    run = trnctl("validate", "--env", "trn-dev", "--name", "v", "--poll", "0.01")

    assert run.exit_code == ExitCode.FAILED
    last = run.stderr.splitlines()[-1]
    assert last.startswith(
        f"trnctl: validation failed on 2 of 2 nodes: node 0: {CPU_OVER_TCP} | node 1: "
        "all-reduce failed: "
    )
    (row,) = [line for line in run.stdout.splitlines() if "v-node-0-0-" in line]
    assert "16/16" in row and "128/128" in row
