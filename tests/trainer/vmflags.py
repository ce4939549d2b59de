"""The kernel's flags on the mapping that holds an address of this process (``VmFlags`` in
``/proc/self/smaps``): ``hg`` marks memory advised ``MADV_HUGEPAGE``, ``nh`` ``MADV_NOHUGEPAGE``."""

from __future__ import annotations

from pathlib import Path

SMAPS = Path("/proc/self/smaps")


def vm_flags(address: int) -> set[str]:
    """The flags of the mapping holding ``address``.

    Raises:
        LookupError: no mapping of this process holds it.
    """
    inside = False
    for line in SMAPS.read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(part, 16) for part in head.split("-"))
            inside = low <= address < high
        elif inside and head == "VmFlags:":
            return set(line.split()[1:])
    raise LookupError(f"no mapping holds {address:#x}")
