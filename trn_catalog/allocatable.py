"""What a node of each catalog type offers pods: its allocatable CPU and memory, computed as the
EKS-optimized AL2023 AMI's nodeadm configures the kubelet, and the room kept there for the node's
agents (DaemonSets) beside the one training pod. Standard library only.

The figures, each with its source:

- [NODEADM] awslabs/amazon-eks-ami tag v20260724, ``nodeadm/internal/kubelet/config.go``:
  ``kubeReserved`` CPU is 6% of the first core, 1% of the second, 0.5% of the third and fourth
  and 0.25% of every further one (``getCPUMillicoresToReserve``); memory is 11 MiB per pod of
  ``maxPods`` plus 255 MiB (``getMemoryMebibytesToReserve``); ``evictionHard`` keeps
  ``memory.available`` 100Mi; no ``systemReserved``.
- [MAXPODS] the same repository's ``max-pods-calculator.sh`` (tag v20260304, the last with the
  AL2 templates): the maximum Pods EKS recommends is capped at 250 above 30 vCPUs and at 110 at
  or below. nodeadm's own default at v20260724 (``eni_max_pods.go`` over ``instance-info.jsonl``:
  ENIs x (IPv4 addresses per ENI - 1) + 2) is another figure, above the cap for g6e.48xlarge;
  types nodeadm does not list (trn2u, trn3) it asks EC2 for at boot. The reserve here is taken
  at the larger of the two, the most a node can reserve.
- [KUBELET] kubernetes ``pkg/kubelet/nodestatus/setters.go`` (``MachineInfo``): every
  pre-allocated huge page size is taken out of allocatable memory.
- [EFA-HP] the EFA installer pre-allocates 5128 huge pages of 2 MiB on an EFA node
  (platform-facts; the workspace's pods ask for 5120Mi of them).
- [VM] aws/karpenter-provider-aws ``pkg/operator/options/options.go``:
  ``VM_MEMORY_OVERHEAD_PERCENT`` defaults to 0.075, the share of EC2's memory figure Karpenter
  assumes the kubelet does not see (the kernel's ``MemTotal`` is below it); used here for the
  same reason, as no source gives ``MemTotal`` per type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trn_catalog.hosts import HostSpec

MIB_PER_GIB = 1024
# [NODEADM] getCPUMillicoresToReserve: (upper bound of the range in millicores, basis points).
_CPU_RESERVE_RANGES = ((1000, 600), (2000, 100), (4000, 50), (math.inf, 25))
EVICTION_HARD_MIB = 100  # [NODEADM]
MAX_PODS_HIGH_CPU, MAX_PODS_LOW_CPU, HIGH_CPU_ABOVE = 250, 110, 30  # [MAXPODS]
EFA_HUGEPAGES = 5128  # [EFA-HP], 2 MiB each
HUGEPAGE_MIB = 2
VM_MEMORY_OVERHEAD = 0.075  # [VM]

# Room kept on a training node for its agents' requests: on a trn node the VPC CNI (aws-node
# 25m), kube-proxy, the Pod Identity agent, the CloudWatch agent (250m, 128Mi), Fluent Bit (50m,
# 25Mi) and Neuron monitor (256m, 128Mi) of amazon-cloudwatch-observability, the FSx and
# Mountpoint CSI node plugins (10m and 40Mi each, their sidecars 10m and 32Mi), the node
# monitoring agent (10m, 30Mi), the Neuron device plugin (10m, 64Mi), node problem detector
# (10m, 80Mi) and node recovery (10m, 150Mi), the EFA device plugin (10m, 20Mi); the DRA drivers
# (aws-dranet 100m, 50Mi; Neuron's 10m, 128Mi) or the GPU group's DCGM exporter in their place.
# Those total under 1 CPU and 1 GiB; twice that leaves room for the requests no chart states
# (kube-proxy's, the Pod Identity agent's) and for the Mountpoint Pods, which ask for none
# (Mountpoint's docs advise against it, awslabs/mountpoint-s3-csi-driver v2.7.0
# docs/CONFIGURATION.md) but run beside the training pod.
AGENTS_MILLICPU = 2000
AGENTS_MIB = 4 * MIB_PER_GIB


@dataclass(frozen=True)
class Allocatable:
    """A node's allocatable CPU (millicores) and memory (MiB), as its kubelet reports them."""

    millicpu: int
    memory_mib: int


# [MAXPODS] nodeadm's ENI-based default of the catalog types instance-info.jsonl lists.
NODEADM_MAX_PODS = {
    "trn1.32xlarge": 5 * 49 + 2,
    "trn1n.32xlarge": 5 * 49 + 2,
    "trn2.3xlarge": 2 * 14 + 2,
    "trn2.48xlarge": 2 * 49 + 2,
    "p5.48xlarge": 2 * 49 + 2,
    "p5en.48xlarge": 4 * 49 + 2,
    "p6-b200.48xlarge": 4 * 49 + 2,
    "g6e.48xlarge": 10 * 49 + 2,
}


def max_pods(spec: HostSpec) -> int:
    """The most Pods a node of ``spec`` may be configured for: EKS's recommended cap or
    nodeadm's default, whichever is larger ([MAXPODS])."""
    cap = MAX_PODS_HIGH_CPU if spec.vcpus > HIGH_CPU_ABOVE else MAX_PODS_LOW_CPU
    return max(cap, NODEADM_MAX_PODS.get(spec.name, 0))


def kube_reserved_millicpu(vcpus: int) -> int:
    """nodeadm's ``kubeReserved`` CPU for ``vcpus`` cores, in millicores ([NODEADM])."""
    total, lower, reserved = vcpus * 1000, 0, 0
    for upper, basis_points in _CPU_RESERVE_RANGES:
        if total > lower:
            reserved += int((min(total, upper) - lower) * basis_points // 10000)
        lower = int(min(upper, total))
    return reserved


def kube_reserved_mib(pods: int) -> int:
    """nodeadm's ``kubeReserved`` memory for ``pods`` Pods, in MiB ([NODEADM])."""
    return 11 * pods + 255


def node_allocatable(spec: HostSpec) -> Allocatable:
    """The allocatable CPU and memory of a node of ``spec``, at the fewest a node reports: the
    kernel's share taken off EC2's memory figure, huge pages of EFA types, the kubelet's reserve
    at the most Pods and its hard eviction threshold."""
    capacity_mib = int(spec.memory_gib * MIB_PER_GIB * (1 - VM_MEMORY_OVERHEAD))
    hugepages_mib = EFA_HUGEPAGES * HUGEPAGE_MIB if spec.efa_interfaces else 0
    memory = capacity_mib - hugepages_mib - kube_reserved_mib(max_pods(spec)) - EVICTION_HARD_MIB
    return Allocatable(spec.vcpus * 1000 - kube_reserved_millicpu(spec.vcpus), memory)


def for_the_training_pod(spec: HostSpec) -> Allocatable:
    """What the node's allocatable leaves a training pod once its agents have theirs."""
    node = node_allocatable(spec)
    return Allocatable(node.millicpu - AGENTS_MILLICPU, node.memory_mib - AGENTS_MIB)
