"""Stacks: each composes constructs for one deployable unit of an environment."""

from stacks.cluster_stack import ClusterStack
from stacks.data_stack import DataStack
from stacks.image_stack import ImageStack
from stacks.network_stack import NetworkStack
from stacks.platform import Platform, build_platform
from stacks.workloads_stack import WorkloadsStack

__all__ = [
    "ClusterStack",
    "DataStack",
    "ImageStack",
    "NetworkStack",
    "Platform",
    "WorkloadsStack",
    "build_platform",
]
