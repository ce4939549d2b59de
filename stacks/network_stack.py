"""The network stack: the VPC every other stack of an environment lives in."""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from constructs import Construct

from constructs_lib import TrainingNetwork
from platform_config import PlatformConfig
from stacks._removal import removal_policy


class NetworkStack(Stack):
    """Composes :class:`TrainingNetwork` over the trn AZ and the region's next AZs."""

    def __init__(
        self, scope: Construct, construct_id: str, *, config: PlatformConfig, **kwargs: Any
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        azs = self._zones(config)
        self.network = TrainingNetwork(
            self,
            "Network",
            trn_availability_zone=config.availability_zone,
            availability_zones=azs,
            nat_gateways=min(config.profile.nat_gateways, len(azs)),
            flow_log_retention_days=config.profile.log_retention_days,
            removal_policy=removal_policy(config),
        )

    def _zones(self, config: PlatformConfig) -> list[str]:
        # The region's AZ list comes from the availability-zones context (seeded in cdk.json for
        # the offline default; looked up once by the CDK CLI for a real account).
        others = [az for az in self.availability_zones if az != config.availability_zone]
        return [config.availability_zone, *others][: config.profile.max_azs]
