"""Stacks: each composes constructs for one deployable unit of an environment."""

from stacks.data_stack import DataStack
from stacks.network_stack import NetworkStack
from stacks.platform import Platform, build_platform

__all__ = ["DataStack", "NetworkStack", "Platform", "build_platform"]
