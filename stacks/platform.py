"""One environment of the platform: its stacks, named and tagged after the config."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Environment, Stack, Tags
from constructs import Construct

from platform_config import PlatformConfig
from stacks.data_stack import DataStack
from stacks.network_stack import NetworkStack

TAG_ENVIRONMENT = "trn-platform:environment"
TAG_PROFILE = "trn-platform:profile"


@dataclass(frozen=True)
class Platform:
    """The stacks of one environment, in deployment order."""

    network: NetworkStack
    data: DataStack

    @property
    def stacks(self) -> tuple[Stack, ...]:
        return (self.network, self.data)


def build_platform(scope: Construct, config: PlatformConfig) -> Platform:
    """Add one environment's stacks to ``scope`` (an App): ``<name>-network``, ``<name>-data``."""
    env = Environment(account=config.account, region=config.region)
    common = {
        "env": env,
        "termination_protection": config.profile.termination_protection,
    }
    network = NetworkStack(
        scope,
        f"{config.name}-network",
        config=config,
        description=f"Trainium training platform {config.name}: VPC, endpoints, flow logs",
        **common,
    )
    data = DataStack(
        scope,
        f"{config.name}-data",
        config=config,
        network=network.network,
        description=f"Trainium training platform {config.name}: S3 data paths and FSx for Lustre",
        **common,
    )
    platform = Platform(network=network, data=data)
    for stack in platform.stacks:
        Tags.of(stack).add(TAG_ENVIRONMENT, config.name)
        Tags.of(stack).add(TAG_PROFILE, config.env)
    return platform
