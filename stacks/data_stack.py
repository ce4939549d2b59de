"""The data stack: buckets, the compile cache and FSx for Lustre. Stateful, retained in prod."""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from constructs import Construct

from constructs_lib import TrainingDataPaths, TrainingNetwork
from platform_config import PlatformConfig
from stacks._removal import removal_policy


class DataStack(Stack):
    """Composes :class:`TrainingDataPaths` in the trn AZ of the network.

    It depends on the network stack only, never on the cluster, so that CloudFormation creates
    the file system and the EKS cluster at the same time.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: PlatformConfig,
        network: TrainingNetwork,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.data = TrainingDataPaths(
            self,
            "DataPaths",
            vpc=network.vpc,
            fsx_subnet=network.trn_subnet,
            lustre_clients=network.lustre_clients,
            fsx_storage_gib=config.fsx.storage_gib,
            fsx_throughput_per_tib=config.fsx.throughput_per_tib,
            efa_fsx=config.fsx.efa,
            removal_policy=removal_policy(config),
        )
