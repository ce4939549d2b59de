"""GpuNodeGroup: an EKS managed node group of NVIDIA GPU instances with every EFA attached, for
running the same job on GPUs beside the Trainium nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

import trn_catalog
from constructs_lib._props import EMPTY_LABELS, props_of
from constructs_lib.trainium_nodegroup import (
    CapacityMode,
    Interface,
    TrainiumNodeGroup,
    TrainiumNodeGroupProps,
)
from trn_catalog.workspace import GPU_NODE_TYPE, GPU_TAINT_KEY


class GpuNodeGroup(TrainiumNodeGroup):
    """A managed node group of NVIDIA GPU instances, with the EFA layout from the GPU catalog.

    Everything :class:`TrainiumNodeGroup` sets up (launch template carrying the type, IMDSv2 with
    hop limit 1, no SSH, encrypted gp3 root volume, instance-store RAID0, node auto repair, the
    MINIMAL update strategy (old nodes go before new ones launch), the EFA security group,
    placement group for ``on-demand`` only, Capacity Block and ODCR targeting, the
    replacement-safe name), with: AMI type AL2023_x86_64_NVIDIA (the EKS AMI with
    the NVIDIA driver and container toolkit); the taint ``nvidia.com/gpu=true:NoSchedule``; the
    label ``trn-platform/node-type=gpu``; and the network interfaces EC2 documents for these
    types to save IP addresses: an ENA primary on card 0 device 0, an EFA-only interface on card
    0 device 1 and on device 0 of every other card (one EFA device per card).

    Raises:
        ValueError: an instance type outside the GPU catalog, and every error of
            :class:`TrainiumNodeGroup`.
    """

    AMI_TYPE = eks.NodegroupAmiType.AL2023_X86_64_NVIDIA
    TAINT_KEY = GPU_TAINT_KEY
    NODE_TYPE = GPU_NODE_TYPE
    ROLE_DESCRIPTION = "GPU worker nodes"

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        subnet: ec2.ISubnet,
        trn_availability_zone: str | None = None,
        instance_type: str = "p5.48xlarge",
        desired_size: int = 1,
        min_size: int = 0,
        max_size: int | None = None,
        capacity: CapacityMode = "on-demand",
        capacity_reservation_id: str | None = None,
        root_volume_gib: int = 512,
        node_role: iam.IRole | None = None,
        labels: Mapping[str, str] = EMPTY_LABELS,
        taints: Sequence[eks.TaintSpec] | None = None,
        security_groups: Sequence[ec2.ISecurityGroup] = (),
        efa_security_group: ec2.ISecurityGroup | None = None,
        name_prefix: str | None = None,
        lnc: int | None = None,
    ) -> None:
        """The props of :class:`TrainiumNodeGroup`, each documented there with its default, but
        for the four below (a missing required one: TypeError).

        Args:
            instance_type: a type of the GPU catalog (:data:`trn_catalog.GPU_CATALOG`). Default
                ``p5.48xlarge``.
            desired_size: the node count to run. Default 1.
            taints: as for Trainium; the default (:meth:`default_taints`) is
                ``nvidia.com/gpu=true:NoSchedule``.
            lnc: refused: GPU types have no NeuronCores. Default None.
        """
        # The construct itself, not TrainiumNodeGroup's constructor: its defaults are not ours.
        Construct.__init__(self, scope, construct_id)
        self._build(props_of(TrainiumNodeGroupProps, locals()))

    def _lookup(self, instance_type: str) -> Any:
        return trn_catalog.get_gpu(instance_type)

    def _interface_layout(self) -> list[Interface]:
        return list(self.spec.efa_layout())
