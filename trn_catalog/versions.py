"""Pinned versions of everything the cluster installs, each with where it came from.

Re-check a pin against its source before bumping it; the tests assert these exact values reach
the templates, so a bump is one edit here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trn_catalog.instances import CATALOG

KUBERNETES_VERSION = "1.35"


@dataclass(frozen=True)
class AddonPin:
    """An EKS add-on at an exact version, with the configuration values the cluster gives it.

    ``configuration`` is the JSON that EKS checks against the add-on's configuration schema
    (``eks:DescribeAddonConfiguration``); None installs the add-on's defaults.
    ``service_account`` is the (namespace, name) an add-on that calls AWS gets its Pod Identity
    on, as that call names it; None for add-ons that need no AWS access.
    """

    name: str
    version: str
    source: str
    configuration: Mapping[str, Any] | None = None
    service_account: tuple[str, str] | None = None


@dataclass(frozen=True)
class ChartPin:
    release: str
    chart: str
    repository: str
    version: str
    namespace: str
    source: str


# The CloudWatch agent of the amazon-cloudwatch-observability add-on: Container Insights with
# enhanced observability (its Neuron and EFA metrics, "accelerated_compute_metrics", default on
# in agent v1.300066.0, awscontainerinsight/utils.go), and the EMF listener the trainer sends
# its figures to (trn_catalog.observability). A given agent.config replaces the chart's
# defaultConfig (values.yaml at chart 5.3.1), whose Application Signals the platform does not use.
CLOUDWATCH_AGENT_CONFIG: Mapping[str, Any] = {
    "logs": {"metrics_collected": {"kubernetes": {"enhanced_container_insights": True}, "emf": {}}}
}


def neuron_monitor_affinity() -> dict[str, Any]:
    """The add-on's neuron-monitor on the catalog's Trainium types. The chart's own list (chart
    5.3.1 values.yaml, neuronMonitor.affinity) stops at trn2u.48xlarge: without this, trn3 nodes
    would have no Neuron metrics. Helm replaces the whole affinity, so the chart's Fargate
    exclusion is kept."""
    terms = [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": sorted(CATALOG)},
        {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["fargate"]},
    ]
    required = {"nodeSelectorTerms": [{"matchExpressions": terms}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


# EKS add-ons for Kubernetes 1.35, each at an exact version. The first five are the versions
# awslabs/cdk-eks-blueprints pins for 1.35 (2026-04). The other three come from public
# infrastructure code running EKS 1.35 (dates below); no AWS page lists add-on versions per
# Kubernetes version. `trnctl addons` re-checks every pin and configuration against
# eks:DescribeAddonVersions and eks:DescribeAddonConfiguration before a deploy.
ADDONS: tuple[AddonPin, ...] = (
    AddonPin(
        "vpc-cni",
        "v1.21.1-eksbuild.1",
        "cdk-eks-blueprints 1.35 pins; efa-only needs >= 1.18.5",
        # Prefix delegation: each ENI slot takes a /28, so trn nodes never run out of pod IPs.
        {"env": {"ENABLE_PREFIX_DELEGATION": "true", "WARM_PREFIX_TARGET": "1"}},
        ("kube-system", "aws-node"),
    ),
    AddonPin("kube-proxy", "v1.35.0-eksbuild.2", "cdk-eks-blueprints 1.35 pins"),
    AddonPin("eks-pod-identity-agent", "v1.3.10-eksbuild.2", "cdk-eks-blueprints 1.35 pins"),
    AddonPin("coredns", "v1.13.2-eksbuild.3", "cdk-eks-blueprints 1.35 pins"),
    AddonPin(
        "amazon-cloudwatch-observability",
        "v5.3.1-eksbuild.1",
        "cdk-eks-blueprints 1.35 pins; chart 5.3.1 is aws-observability/helm-charts@132c642 "
        "(agent 1.300066.0b1367, operator 3.3.3, neuron-monitor 1.8.0)",
        {
            "agent": {"config": CLOUDWATCH_AGENT_CONFIG},
            "neuronMonitor": {"affinity": neuron_monitor_affinity()},
        },
        ("amazon-cloudwatch", "cloudwatch-agent"),
    ),
    AddonPin(
        "aws-fsx-csi-driver",
        "v1.9.0-eksbuild.1",
        "EKS add-on pinned by a public Trainium/GPU EKS 1.35 Terraform platform (2026-08); "
        "upstream driver v1.9.0, whose chart tolerates all taints on the node plugin",
    ),
    AddonPin(
        "aws-mountpoint-s3-csi-driver",
        "v2.7.0-eksbuild.1",
        "newest build for EKS 1.35 in us-west-2 on 2026-08-11 (public EKS 1.35 security "
        "review); Mountpoint CSI v2, Pod Identity for the driver's service account",
        # The node plugin must run on the Neuron-tainted trn nodes, where the datasets mount is
        # used; v1 of the driver did not tolerate taints by default.
        {"node": {"tolerateAllTaints": True}},
        ("kube-system", "s3-csi-driver-sa"),
    ),
    AddonPin(
        "eks-node-monitoring-agent",
        "v1.6.6-eksbuild.1",
        "running on EKS 1.35 (kube-proxy v1.35.3) in a public add-on compatibility table "
        "(2026-07); upstream release v1.6.6 (2026-06-10), with Neuron checks",
        # v1.6.6's chart (charts/eks-node-monitoring-agent/values.yaml) gives the node agent
        # `operator: Exists` but its DCGM DaemonSet, which the agent's GPU checks talk to on
        # each NVIDIA node, no tolerations: it would never start on the GPU group's tainted
        # nodes. The add-on's configuration schema (charts/configuration.schema.json) takes it.
        # Nor does the chart request CPU or memory for that DaemonSet (`resources: {}`; the
        # schema's dcgmAgent.resources takes requests of cpu and memory): 250m and 128Mi, what
        # amazon-cloudwatch-observability's chart (5.4.0) requests for its DCGM exporter.
        {
            "dcgmAgent": {
                "tolerations": [{"operator": "Exists"}],
                "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}},
            }
        },
    ),
)


def addon(name: str) -> AddonPin:
    """The pin of add-on ``name``.

    Raises:
        KeyError: no add-on of that name is pinned.
    """
    for pin in ADDONS:
        if pin.name == name:
            return pin
    raise KeyError(f"no pinned EKS add-on {name!r}; pinned: {', '.join(p.name for p in ADDONS)}")


def service_account(name: str) -> tuple[str, str]:
    """The (namespace, name) add-on ``name`` gets its Pod Identity on.

    Raises:
        KeyError: no add-on of that name is pinned, or it has no service account.
    """
    account = addon(name).service_account
    if account is None:
        raise KeyError(f"EKS add-on {name!r} has no Pod Identity service account")
    return account


NEURON_CHART = ChartPin(
    release="neuron",
    chart="neuron-helm-chart",
    repository="oci://public.ecr.aws/neuron/neuron-helm-chart",
    version="1.9.0",
    namespace="kube-system",
    source=(
        "aws-neuron/neuron-helm-charts charts/neuron-helm-chart 1.9.0 (Neuron SDK 2.31: device "
        "plugin and scheduler 2.31.0.0, node-problem-detector v1.35.2, node-recovery 1.11.0; "
        "neuronInstances already lists trn3.48xlarge)"
    ),
)

EFA_CHART = ChartPin(
    release="efa-device-plugin",
    chart="aws-efa-k8s-device-plugin",
    repository="https://aws.github.io/eks-charts",
    version="v0.5.30",
    namespace="kube-system",
    source=(
        "aws/eks-charts stable/aws-efa-k8s-device-plugin (2026-07): chart v0.5.30, image v0.5.20"
    ),
)

TRAINER_CHART = ChartPin(
    release="kubeflow-trainer",
    chart="kubeflow-trainer",
    repository="oci://ghcr.io/kubeflow/charts/kubeflow-trainer",
    version="2.3.0",
    namespace="kubeflow-system",
    source=(
        "kubeflow/trainer charts/kubeflow-trainer 2.3.0 (2026-08): JobSet 0.12.0, "
        "Kubernetes >= 1.31"
    ),
)

# Installed only with a GPU node group (context key gpu_instance_type).
NVIDIA_DEVICE_PLUGIN_CHART = ChartPin(
    release="nvidia-device-plugin",
    chart="nvidia-device-plugin",
    repository="https://nvidia.github.io/k8s-device-plugin",
    version="0.20.0",
    namespace="kube-system",
    source=(
        "NVIDIA/k8s-device-plugin tag v0.20.0 (2026-08-19), deployments/helm/"
        "nvidia-device-plugin/Chart.yaml: chart and app version 0.20.0; the chart repository "
        "is the one the project's README names"
    ),
)

# Installed only with devices=dra: the EFA DRA driver (kubernetes-sigs/dranet built by EKS). Its
# README asks for Kubernetes 1.35+, the EKS user guide (device-management-efa) for 1.34+.
DRANET_CHART = ChartPin(
    release="aws-dranet",
    chart="aws-dranet",
    repository="https://aws.github.io/eks-charts",
    version="1.0.0",
    namespace="kube-system",
    source=(
        "aws/eks-charts@c043cef46c7e50a71094e50b43b8225322a750ff stable/aws-dranet (2026-04-30, "
        "the chart's only commit): chart 1.0.0, image dranet v1.2.0-eksbuild.2; creates the "
        "DeviceClass efa.networking.k8s.aws"
    ),
)

# Every cluster installs CHARTS; a cluster with a GPU node group also installs GPU_CHARTS, and a
# cluster with devices=dra also DRA_CHARTS.
CHARTS: tuple[ChartPin, ...] = (NEURON_CHART, EFA_CHART, TRAINER_CHART)
GPU_CHARTS: tuple[ChartPin, ...] = (NVIDIA_DEVICE_PLUGIN_CHART,)
DRA_CHARTS: tuple[ChartPin, ...] = (DRANET_CHART,)
