"""Host memory available to this container, checked before the Neuron compiler runs.

An out-of-memory compiler is killed by the kernel (or the cgroup's OOM killer) with nothing
but "Killed" in the log, often long into a compile. Checking first turns that into one line
naming what is needed and what is there. What is there is the smaller of the host's
``MemAvailable`` (``/proc/meminfo``) and the container's cgroup headroom (cgroup v2
``memory.max`` less ``memory.current``; v1 ``memory.limit_in_bytes`` less
``memory.usage_in_bytes``).

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30
# cgroup v1 reports "no limit" as a page-aligned value near 2**63.
_V1_UNLIMITED = 1 << 62


class CompileMemoryError(RuntimeError):
    """Too little host memory to compile; the message names needed and available."""


@dataclass(frozen=True)
class HostMemory:
    """Bytes this container can still use, and where the figure comes from."""

    available: int
    source: str


def _meminfo_available(proc: Path) -> int | None:
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "MemAvailable":
                return int(value.split()[0]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_headroom(cgroup: Path) -> tuple[int, str] | None:
    """(limit - usage, description) of this container's cgroup, or None without a limit."""
    limit, usage = _read_int(cgroup / "memory.max"), _read_int(cgroup / "memory.current")
    if limit is not None and usage is not None:
        return limit - usage, f"cgroup memory.max {limit / GIB:.1f} GiB, {usage / GIB:.1f} used"
    v1 = cgroup / "memory"
    limit, usage = _read_int(v1 / "memory.limit_in_bytes"), _read_int(v1 / "memory.usage_in_bytes")
    if limit is not None and usage is not None and limit < _V1_UNLIMITED:
        return limit - usage, f"cgroup memory limit {limit / GIB:.1f} GiB, {usage / GIB:.1f} used"
    return None


def available(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> HostMemory:
    """What this container can still allocate: the smaller of the host's ``MemAvailable`` and
    the cgroup's headroom (either may be missing; with neither, 0 bytes from "nowhere")."""
    candidates: list[tuple[int, str]] = []
    host = _meminfo_available(proc)
    if host is not None:
        candidates.append((host, "MemAvailable in /proc/meminfo"))
    headroom = _cgroup_headroom(cgroup)
    if headroom is not None:
        candidates.append(headroom)
    if not candidates:
        return HostMemory(0, "no /proc/meminfo and no cgroup memory limit found")
    amount, source = min(candidates)
    return HostMemory(max(0, amount), source)


def check_for_compile(gib_per_process: float, processes: int, memory: HostMemory) -> None:
    """Refuses to compile when ``processes`` compilers of ``gib_per_process`` GiB each would not
    fit in ``memory``.

    Raises:
        CompileMemoryError: naming the GiB needed, how they add up, and the GiB available with
            where that figure comes from.
    """
    needed = int(gib_per_process * GIB) * processes
    if needed <= memory.available:
        return
    raise CompileMemoryError(
        f"compiling needs {needed / GIB:.1f} GiB of host memory ({processes} compiling "
        f"process(es) x {gib_per_process:g} GiB) but {memory.available / GIB:.1f} GiB is "
        f"available ({memory.source}); give the pod more memory, run fewer ranks per node, or "
        "set --compile-memory-gib (TRN_COMPILE_MEMORY_GIB) to a measured per-process peak"
    )
