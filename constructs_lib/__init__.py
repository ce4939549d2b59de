"""Reusable CDK constructs for Trainium training platforms.

Importing this package has no side effects. Each construct takes its props as typed keyword
arguments after ``scope`` and ``id``, as aws-cdk-lib's do, and keeps them in ``.props`` (the
``...Props`` record); ``NodeGroupOptions`` and ``WorkspaceOptions`` type the keyword arguments of
the methods that add a node group or a workspace. The instance catalog is re-exported here so
that an app needs one import for constructs and per-type facts.
"""

from constructs_lib.cluster import NeuronCluster, NeuronClusterProps
from constructs_lib.data_paths import TrainingDataPaths, TrainingDataPathsProps
from constructs_lib.gpu_nodegroup import GpuNodeGroup
from constructs_lib.network import (
    DEFAULT_INTERFACE_ENDPOINTS,
    TrainingNetwork,
    TrainingNetworkProps,
)
from constructs_lib.observability import (
    NodeGroupSummary,
    TrainingObservability,
    TrainingObservabilityProps,
)
from constructs_lib.pipeline import (
    PipelineAccess,
    PipelineAccessProps,
    TrainingPipeline,
    TrainingPipelineProps,
)
from constructs_lib.plugins import NeuronPlugins, NeuronPluginsProps
from constructs_lib.preview import PreviewLifecycle, PreviewLifecycleProps
from constructs_lib.training_image import TrainingImage, TrainingImageProps
from constructs_lib.trainium_nodegroup import (
    NodeGroupOptions,
    TrainiumNodeGroup,
    TrainiumNodeGroupProps,
)
from constructs_lib.workspace import (
    TrainingWorkspace,
    TrainingWorkspaceProps,
    WorkspaceOptions,
)
from trn_catalog import CATALOG, InstanceSpec, UnknownInstanceTypeError
from trn_catalog import get as instance_spec

__all__ = [
    "CATALOG",
    "DEFAULT_INTERFACE_ENDPOINTS",
    "GpuNodeGroup",
    "InstanceSpec",
    "NeuronCluster",
    "NeuronClusterProps",
    "NeuronPlugins",
    "NeuronPluginsProps",
    "NodeGroupOptions",
    "NodeGroupSummary",
    "PipelineAccess",
    "PipelineAccessProps",
    "PreviewLifecycle",
    "PreviewLifecycleProps",
    "TrainingDataPaths",
    "TrainingDataPathsProps",
    "TrainingImage",
    "TrainingImageProps",
    "TrainingNetwork",
    "TrainingNetworkProps",
    "TrainingObservability",
    "TrainingObservabilityProps",
    "TrainingPipeline",
    "TrainingPipelineProps",
    "TrainingWorkspace",
    "TrainingWorkspaceProps",
    "TrainiumNodeGroup",
    "TrainiumNodeGroupProps",
    "UnknownInstanceTypeError",
    "WorkspaceOptions",
    "instance_spec",
]
