"""Reusable CDK constructs for Trainium training platforms.

Importing this package has no side effects. The instance catalog is re-exported here so that an
app needs one import for constructs and per-type facts.
"""

from constructs_lib.data_paths import TrainingDataPaths, TrainingDataPathsProps
from constructs_lib.network import (
    DEFAULT_INTERFACE_ENDPOINTS,
    TrainingNetwork,
    TrainingNetworkProps,
)
from trn_catalog import CATALOG, InstanceSpec, UnknownInstanceTypeError
from trn_catalog import get as instance_spec

__all__ = [
    "CATALOG",
    "DEFAULT_INTERFACE_ENDPOINTS",
    "InstanceSpec",
    "TrainingDataPaths",
    "TrainingDataPathsProps",
    "TrainingNetwork",
    "TrainingNetworkProps",
    "UnknownInstanceTypeError",
    "instance_spec",
]
