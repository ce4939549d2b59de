"""trainer.validate_node on CPU: device and EFA counts from fakes, the all-reduce over gloo."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import trn_catalog
from tests import warm
from trainer import validate_node
from trnctl import validation

NEURON_LS = json.dumps(
    [
        {"neuron_device": i, "bdf": f"{i:02x}:00.0", "nc_count": 8, "neuroncore_ids": []}
        for i in range(16)
    ]
)


# The fakes below match trn2.48xlarge: 16 devices of 8 NeuronCores, 16 EFA interfaces.
TRN2 = trn_catalog.get("trn2.48xlarge")
CPU_OVER_TCP = "all-reduce ran on gloo (CPU over TCP), not a Neuron backend (neuron or xla)"


def _script(path: Path, stdout: str, code: int = 0) -> str:
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}\nEOF\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def _sysfs(root: Path, interfaces: int) -> Path:
    rdma = root / "class" / "infiniband"
    rdma.mkdir(parents=True)
    for i in range(interfaces):
        (rdma / f"rdmap{i}s0").mkdir()
    return root


def test_neuron_inventory_counts_devices_and_cores(tmp_path: Path) -> None:
    tool = _script(tmp_path / "neuron-ls", NEURON_LS)

    assert validate_node.neuron_inventory(tool) == (16, 128)


def test_neuron_inventory_is_unknown_without_the_tool_or_with_bad_output(tmp_path: Path) -> None:
    assert validate_node.neuron_inventory(str(tmp_path / "missing")) == (None, None)
    failing = _script(tmp_path / "neuron-ls-failing", "", code=1)
    garbage = _script(tmp_path / "neuron-ls-garbage", "not json")

    assert validate_node.neuron_inventory(failing) == (None, None)
    assert validate_node.neuron_inventory(garbage) == (None, None)


def test_efa_interfaces_from_sysfs(tmp_path: Path) -> None:
    assert validate_node.efa_interfaces(_sysfs(tmp_path / "sys", 16)) == 16


def test_efa_interfaces_from_fi_info_when_sysfs_has_none(tmp_path: Path) -> None:
    listing = "\n".join(
        f"provider: efa\n    fabric: efa\n    domain: rdmap{i}s0-rdm\n    version: 122.0"
        for i in (0, 1, 1, 2)
    )
    fi_info = _script(tmp_path / "fi_info", listing)

    assert validate_node.efa_interfaces(tmp_path / "nosys", fi_info) == 3
    assert validate_node.efa_interfaces(tmp_path / "nosys", str(tmp_path / "none")) is None


@pytest.mark.slow
def test_node_mode_runs_an_allreduce_over_its_ranks_and_prints_one_line(tmp_path: Path) -> None:
    """Node mode as a pod runs it: torchrun with two CPU ranks (gloo), fake tools and sysfs."""
    tool = _script(tmp_path / "neuron-ls", NEURON_LS)
    sysfs = _sysfs(tmp_path / "sys", 16)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(
        NPROC_PER_NODE="2",
        OMP_NUM_THREADS="1",
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        PET_NODE_RANK="0",
    )

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.validate_node",
            "--device",
            "cpu",
            "--size-mib",
            "1",
            "--iterations",
            "2",
            "--sysfs",
            str(sysfs),
            "--neuron-ls",
            tool,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1
    (report,) = lines
    assert report["neuron_devices"] == 16
    assert report["neuron_cores"] == 128
    assert report["efa_interfaces"] == 16
    assert report["allreduce_ok"] is True
    assert report["allreduce_gbps"] > 0
    assert report["world_size"] == 2
    assert report["backend"] == "gloo"
    assert report["device"] == "cpu" and report["stack"] is None
    assert report["node_rank"] == 0
    assert report["node"] == socket.gethostname()
    # What `trnctl validate` makes of this very output: it finds every key it reads, the counts
    # pass the catalog entry the fakes match, and only the CPU all-reduce is refused; against
    # another type the counts that differ are named.
    assert validation.parse(done.stdout) == report
    assert validation.judge(0, "p", done.stdout, TRN2).problems == (CPU_OVER_TCP,)
    assert validation.judge(0, "p", done.stdout, trn_catalog.get("trn1.32xlarge")).problems == (
        "neuron cores 128, catalog 32 (32 logical)",
        "EFA interfaces 16, catalog 8",
        CPU_OVER_TCP,
    )


@pytest.mark.slow
def test_node_mode_runs_on_the_image_stack_device_never_on_cpu(tmp_path: Path) -> None:
    """In the native image (NEURON_STACK=native) the ranks run on the neuron device: where there
    is none the all-reduce fails and the node's line says why, instead of passing over gloo."""
    tool = _script(tmp_path / "neuron-ls", NEURON_LS)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(
        NEURON_STACK="native",
        TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "neff"),
        # One rank: where the device is missing every rank fails alike.
        NPROC_PER_NODE="1",
        OMP_NUM_THREADS="1",
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
    )

    sysfs = _sysfs(tmp_path / "sys", 16)
    done = subprocess.run(
        [
            *[sys.executable, "-m", "trainer.validate_node", "--size-mib", "1"],
            *["--iterations", "1", "--sysfs", str(sysfs), "--neuron-ls", tool],
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode != 0
    (report,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert report["stack"] == "native" and report["device"] == "neuron"
    assert report["allreduce_ok"] is False
    assert "backend" not in report
    assert "device 'neuron' is not available" in report["error"]
    assert report["node"] == socket.gethostname()
    # trnctl's verdict on this output: the program's own error, nothing else.
    verdict = validation.judge(0, "p", done.stdout, TRN2)
    assert verdict.problems == (f"all-reduce failed: {report['error']}",)


def test_the_timed_window_runs_the_all_reduce_on_a_lazy_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On XLA an all-reduce only queues a graph: it runs at the step mark. Each all-reduce is
    followed by the step mark and the wait for the device before the clock is read again, so
    the time is the transfer's; the fill before it is marked before the clock starts."""
    import torch.distributed as dist

    from trainer import device

    events: list[str] = []
    real_all_reduce, real_clock = dist.all_reduce, validate_node.time.perf_counter

    def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        events.append("all_reduce")
        return real_all_reduce(tensor, *args, **kwargs)

    def clock() -> float:
        events.append("clock")
        return real_clock()

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(validate_node.time, "perf_counter", clock)
    monkeypatch.setattr(device.Backend, "step_boundary", lambda self: events.append("mark"))
    monkeypatch.setattr(device.Backend, "synchronize", lambda self: events.append("wait"))
    port = warm.free_port()
    for name, value in dict(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    ).items():
        monkeypatch.setenv(name, value)

    result = validate_node.allreduce(1, 3, "cpu")

    assert result["allreduce_ok"] is True
    rounds = [i for i, e in enumerate(events) if e == "all_reduce"][:4]  # warm-up and 3 timed
    assert len(rounds) == 4
    for i in rounds:
        assert events[i - 3 : i] == ["mark", "wait", "clock"]  # the fill ran before the clock
        assert events[i + 1 : i + 3] == ["mark", "wait"]  # the transfer ran inside the window
    for i in rounds[1:]:
        assert events[i + 3] == "clock"


def test_node_mode_refuses_an_environment_that_contradicts_itself_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEURON_STACK", "xla")
    monkeypatch.setenv("TRN_INSTANCE_TYPE", "trn1.32xlarge")
    monkeypatch.setenv("NEURON_CC_FLAGS", "--cache_dir=/tmp/mine")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("torchrun must not start")

    monkeypatch.setattr(validate_node.subprocess, "run", refuse)
    assert validate_node.main([]) == 2
    assert capsys.readouterr().err.startswith("error: NEURON_CC_FLAGS sets --cache_dir=/tmp/mine")

    # The rank count too: no instance type to count "auto" by.
    monkeypatch.delenv("TRN_INSTANCE_TYPE")
    monkeypatch.delenv("NEURON_CC_FLAGS")
    monkeypatch.setenv("NPROC_PER_NODE", "auto")
    assert validate_node.main([]) == 2
    assert capsys.readouterr().err.startswith("error: NPROC_PER_NODE='auto' is not a whole number")
