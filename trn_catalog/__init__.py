"""The instance catalogs: per-type Trainium facts and, apart, the GPU node group's NVIDIA types,
each with sources; standard library only."""

from trn_catalog import fsx
from trn_catalog.gpu_instances import (
    GPU_CATALOG,
    GpuInstanceSpec,
    UnknownGpuInstanceTypeError,
    get_gpu,
)
from trn_catalog.instances import (
    CATALOG,
    DEFAULT_INSTANCE_TYPE,
    FACT_FIELDS,
    SOURCES,
    InstanceSpec,
    UnknownInstanceTypeError,
    get,
)

__all__ = [
    "CATALOG",
    "DEFAULT_INSTANCE_TYPE",
    "FACT_FIELDS",
    "GPU_CATALOG",
    "SOURCES",
    "GpuInstanceSpec",
    "InstanceSpec",
    "UnknownGpuInstanceTypeError",
    "UnknownInstanceTypeError",
    "fsx",
    "get",
    "get_gpu",
]
