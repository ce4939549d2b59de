"""The instance catalog: per-type Trainium facts with sources, standard library only."""

from trn_catalog import fsx
from trn_catalog.instances import (
    CATALOG,
    FACT_FIELDS,
    SOURCES,
    InstanceSpec,
    UnknownInstanceTypeError,
    get,
)

__all__ = [
    "CATALOG",
    "FACT_FIELDS",
    "SOURCES",
    "InstanceSpec",
    "UnknownInstanceTypeError",
    "fsx",
    "get",
]
