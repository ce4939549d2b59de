"""The cluster stack: EKS with add-ons, plugins, the job engine and the Trainium node group."""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from aws_cdk.lambda_layer_kubectl_v35 import KubectlV35Layer
from constructs import Construct

from constructs_lib import NeuronCluster, NeuronClusterProps, TrainingNetwork
from platform_config import PlatformConfig
from stacks._removal import removal_policy


class ClusterStack(Stack):
    """Composes :class:`NeuronCluster` and one Trainium node group in the trn AZ.

    It depends on the network stack only, never on the data stack, so that CloudFormation
    creates the cluster and the FSx file system at the same time.
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
        self.neuron_cluster = NeuronCluster(
            self,
            "Neuron",
            props=NeuronClusterProps(
                vpc=network.vpc,
                subnets=network.private_subnets,
                kubectl_layer=KubectlV35Layer(self, "KubectlLayer"),
                cluster_name=config.name,
                admin_role_arn=config.admin_role_arn,
                removal_policy=removal_policy(config),
            ),
        )
        self.trainium = self.neuron_cluster.add_trainium_nodegroup(
            "Trainium",
            subnet=network.trn_subnet,
            instance_type=config.trn.instance_type,
            nodes=config.trn.nodes,
            capacity=config.trn.capacity,
            capacity_reservation_id=config.trn.capacity_reservation_id,
            security_groups=[network.lustre_clients],
            name_prefix=f"{config.name}-trn",
        )
