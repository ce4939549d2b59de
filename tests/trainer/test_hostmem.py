"""Host memory for the compiler: /proc/meminfo and the cgroup's headroom, the smaller wins."""

from pathlib import Path

import pytest

from trainer import hostmem
from trainer.hostmem import GIB, HostMemory


def _proc(tmp_path: Path, available_gib: float) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    kb = int(available_gib * GIB / 1024)
    (proc / "meminfo").write_text(
        f"MemTotal:       {4 * kb} kB\nMemFree:        {kb // 2} kB\nMemAvailable:   {kb} kB\n"
    )
    return proc


def _cgroup_v2(tmp_path: Path, limit: str, current_gib: float) -> Path:
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text(limit + "\n")
    (cgroup / "memory.current").write_text(f"{int(current_gib * GIB)}\n")
    return cgroup


def test_host_memory_alone(tmp_path: Path) -> None:
    memory = hostmem.available(_proc(tmp_path, 100), tmp_path / "no-cgroup")
    assert memory == HostMemory(100 * GIB, "MemAvailable in /proc/meminfo")


def test_a_pod_limit_below_the_host_wins(tmp_path: Path) -> None:
    cgroup = _cgroup_v2(tmp_path, str(64 * GIB), 4)
    memory = hostmem.available(_proc(tmp_path, 1000), cgroup)
    assert memory.available == 60 * GIB
    assert memory.source == "cgroup memory.max 64.0 GiB, 4.0 used"


def test_an_unlimited_cgroup_leaves_the_host_figure(tmp_path: Path) -> None:
    cgroup = _cgroup_v2(tmp_path, "max", 4)
    assert hostmem.available(_proc(tmp_path, 50), cgroup).available == 50 * GIB


def test_cgroup_v1_limit_and_its_unlimited_value(tmp_path: Path) -> None:
    v1 = tmp_path / "cgroup" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.usage_in_bytes").write_text(f"{2 * GIB}\n")
    (v1 / "memory.limit_in_bytes").write_text(f"{10 * GIB}\n")
    proc = _proc(tmp_path, 500)
    assert hostmem.available(proc, tmp_path / "cgroup").available == 8 * GIB
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert hostmem.available(proc, tmp_path / "cgroup").available == 500 * GIB


def test_too_little_memory_names_needed_and_available(tmp_path: Path) -> None:
    memory = hostmem.available(_proc(tmp_path, 1000), _cgroup_v2(tmp_path, str(64 * GIB), 4))
    hostmem.check_for_compile(7.5, 8, memory)  # 60 GiB fits exactly
    with pytest.raises(
        hostmem.CompileMemoryError,
        match=r"compiling needs 64\.0 GiB of host memory \(8 compiling process\(es\) x 8 GiB\) "
        r"but 60\.0 GiB is available \(cgroup memory\.max 64\.0 GiB, 4\.0 used\)",
    ):
        hostmem.check_for_compile(8, 8, memory)


def test_nothing_readable_means_nothing_available(tmp_path: Path) -> None:
    memory = hostmem.available(tmp_path / "no-proc", tmp_path / "no-cgroup")
    assert memory.available == 0
    with pytest.raises(hostmem.CompileMemoryError, match="no /proc/meminfo"):
        hostmem.check_for_compile(1, 1, memory)
