"""GpuNodeGroup: an EKS managed node group of NVIDIA GPU instances with every EFA attached, for
running the same job on GPUs beside the Trainium nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aws_cdk import aws_eks_v2 as eks

import trn_catalog
from constructs_lib.trainium_nodegroup import Interface, TrainiumNodeGroup, TrainiumNodeGroupProps
from trn_catalog.workspace import GPU_NODE_TYPE, GPU_TAINT_KEY


@dataclass(frozen=True)
class GpuNodeGroupProps(TrainiumNodeGroupProps):
    """Props of :class:`GpuNodeGroup`: those of :class:`TrainiumNodeGroupProps`, with
    ``instance_type`` a type of the GPU catalog (:data:`trn_catalog.GPU_CATALOG`, default
    ``p5.48xlarge``) and ``desired_size`` 1 by default."""

    instance_type: str = "p5.48xlarge"
    desired_size: int = 1


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
    PROPS = GpuNodeGroupProps

    def _lookup(self, instance_type: str) -> Any:
        return trn_catalog.get_gpu(instance_type)

    def _interface_layout(self) -> list[Interface]:
        return list(self.spec.efa_layout())
