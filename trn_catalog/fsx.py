"""FSx for Lustre PERSISTENT_2 limits (FSx for Lustre user guide, "Deployment options" and
"Throughput capacity"), shared by the config model and the data-paths construct."""

from __future__ import annotations

FSX_MIN_GIB = 1200
FSX_STEP_GIB = 2400
FSX_THROUGHPUTS_PER_TIB: tuple[int, ...] = (125, 250, 500, 1000)
STORAGE_RULE = f"PERSISTENT_2 storage is {FSX_MIN_GIB} GiB or a multiple of {FSX_STEP_GIB} GiB"
THROUGHPUT_RULE = "PERSISTENT_2 throughput (MB/s per TiB) is one of " + ", ".join(
    map(str, FSX_THROUGHPUTS_PER_TIB)
)


def storage_allowed(gib: int) -> bool:
    return gib == FSX_MIN_GIB or (gib > 0 and gib % FSX_STEP_GIB == 0)


def throughput_allowed(mb_per_tib: int) -> bool:
    return mb_per_tib in FSX_THROUGHPUTS_PER_TIB
