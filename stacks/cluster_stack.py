"""The cluster stack: EKS with add-ons, plugins, the job engine and the Trainium node group."""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from aws_cdk.lambda_layer_kubectl_v35 import KubectlV35Layer
from constructs import Construct

from constructs_lib import (
    GpuNodeGroup,
    NeuronCluster,
    NodeGroupOptions,
    TrainingNetwork,
    TrainiumNodeGroup,
)
from platform_config import NodeCapacity, PlatformConfig
from stacks._removal import removal_policy
from trn_catalog import devices as device_modes
from trn_catalog import observability as obs


class ClusterStack(Stack):
    """Composes :class:`NeuronCluster`, one Trainium node group in the trn AZ (or, with
    UltraServer blocks, one per block: ``ultraservers``, the first also ``trainium``) and, when
    the config names a GPU type, one GPU node group in the same AZ (``gpu``, else None).

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
            vpc=network.vpc,
            subnets=network.private_subnets,
            kubectl_layer=KubectlV35Layer(self, "KubectlLayer"),
            cluster_name=config.name,
            system_name_prefix=f"{config.name}-system",
            admin_role_arn=config.admin_role_arn,
            removal_policy=removal_policy(config),
            devices=config.devices,
        )
        self.ultraservers = _ultraserver_groups(self.neuron_cluster, config, network)
        self.trainium = (
            self.ultraservers[0] if self.ultraservers else self._trainium(config, network)
        )
        self.gpu: GpuNodeGroup | None = None
        if config.gpu is not None:
            gpu: NodeGroupOptions = {
                **_capacity(config.gpu),
                "security_groups": [network.lustre_clients],
                "name_prefix": f"{config.name}-gpu",
            }
            self.gpu = self.neuron_cluster.add_gpu_nodegroup(
                "Gpu", subnet=network.trn_subnet, **gpu
            )

    def _trainium(self, config: PlatformConfig, network: TrainingNetwork) -> TrainiumNodeGroup:
        trn: NodeGroupOptions = {**_capacity(config.trn), **_trn_props(config, network)}
        return self.neuron_cluster.add_trainium_nodegroup(
            "Trainium", subnet=network.trn_subnet, **trn
        )


def _ultraserver_groups(
    cluster: NeuronCluster, config: PlatformConfig, network: TrainingNetwork
) -> list[TrainiumNodeGroup]:
    """One node group per UltraServer Capacity Block (none without blocks)."""
    spec = config.trn.ultraserver
    if spec is None:
        return []
    return cluster.add_ultraserver_nodegroups(
        spec.name,
        config.trn.ultraserver_reservation_ids,
        subnet=network.trn_subnet,
        **_trn_props(config, network),
    )


def _device_labels(config: PlatformConfig) -> dict[str, str]:
    """How the trn nodes' devices are managed and their LNC, for trnctl preflight to read; under
    DRA also the label the Neuron device plugin would have set, which Neuron Observer selects
    its nodes by."""
    lnc = config.trn.lnc or config.trn.spec.default_lnc
    dra = config.devices == "dra"
    return {
        device_modes.DEVICES_LABEL: config.devices,
        device_modes.LNC_LABEL: device_modes.LNC_PER_JOB if dra else str(lnc),
        **({obs.NEURON_PRESENT_LABEL: "true"} if dra else {}),
    }


def _capacity(capacity: NodeCapacity) -> NodeGroupOptions:
    """A node group's props from its capacity (what an UltraServer block decides itself). Both
    groups sit in the trn AZ's subnet and are Lustre clients (FSx is in that AZ too)."""
    return {
        "instance_type": capacity.instance_type,
        "desired_size": capacity.nodes,
        "capacity": capacity.capacity,
        "capacity_reservation_id": capacity.capacity_reservation_id,
    }


def _trn_props(config: PlatformConfig, network: TrainingNetwork) -> NodeGroupOptions:
    """The trn node groups' other props: a Lustre client, the replacement-safe name, the LNC and
    the device labels."""
    return {
        "security_groups": [network.lustre_clients],
        "name_prefix": f"{config.name}-trn",
        "lnc": config.trn.lnc,
        "labels": _device_labels(config),
    }
