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


# An EFA-enabled file system is sized in larger steps that depend on its throughput tier
# (FSx for Lustre user guide, "Increasing storage capacity"), and FSx's EFA clients are Nitro v4
# or later instances with EFA, "excluding the trn2 instance family" (user guide, "Working with
# EFA-enabled file systems").
FSX_EFA_STEP_GIB: dict[int, int] = {125: 38400, 250: 19200, 500: 9600, 1000: 4800}
EFA_UNSUPPORTED_FAMILIES: tuple[str, ...] = ("trn2", "trn2u")


def efa_storage_rule(mb_per_tib: int) -> str:
    step = FSX_EFA_STEP_GIB.get(mb_per_tib)
    if step is None:
        return "an EFA-enabled file system needs a throughput of " + ", ".join(
            map(str, FSX_EFA_STEP_GIB)
        )
    return f"an EFA-enabled file system at {mb_per_tib} MB/s per TiB is a multiple of {step} GiB"


def efa_storage_allowed(gib: int, mb_per_tib: int) -> bool:
    step = FSX_EFA_STEP_GIB.get(mb_per_tib)
    return step is not None and gib > 0 and gib % step == 0


def efa_client_allowed(instance_type: str) -> bool:
    """Whether FSx for Lustre serves EFA to ``instance_type`` (not to the trn2 family)."""
    return instance_type.split(".")[0] not in EFA_UNSUPPORTED_FAMILIES
