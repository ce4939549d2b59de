"""Pinned versions of everything the cluster installs, each with where it came from.

Re-check a pin against its source before bumping it; the tests assert these exact values reach
the templates, so a bump is one edit here.
"""

from __future__ import annotations

from dataclasses import dataclass

KUBERNETES_VERSION = "1.35"


@dataclass(frozen=True)
class AddonPin:
    """An EKS add-on; ``version`` None means EKS's default for the cluster version."""

    name: str
    version: str | None
    source: str


@dataclass(frozen=True)
class ChartPin:
    release: str
    chart: str
    repository: str
    version: str
    namespace: str
    source: str


# EKS add-ons for Kubernetes 1.35. The first five are the versions awslabs/cdk-eks-blueprints
# pins for 1.35 (2026-04). The other three have no source we could check offline; a wrong pin
# fails the deploy, so they take EKS's default version for 1.35 until pinned: `trnctl addons`
# (eks:DescribeAddonVersions) prints the line to paste and fails on a pin EKS does not offer.
ADDONS: tuple[AddonPin, ...] = (
    AddonPin(
        "vpc-cni", "v1.21.1-eksbuild.1", "cdk-eks-blueprints 1.35 pins; efa-only needs >= 1.18.5"
    ),
    AddonPin("kube-proxy", "v1.35.0-eksbuild.2", "cdk-eks-blueprints 1.35 pins"),
    AddonPin("eks-pod-identity-agent", "v1.3.10-eksbuild.2", "cdk-eks-blueprints 1.35 pins"),
    AddonPin("coredns", "v1.13.2-eksbuild.3", "cdk-eks-blueprints 1.35 pins"),
    AddonPin(
        "amazon-cloudwatch-observability", "v5.3.1-eksbuild.1", "cdk-eks-blueprints 1.35 pins"
    ),
    AddonPin("aws-fsx-csi-driver", None, "EKS default for 1.35; not pinned (no checkable source)"),
    AddonPin(
        "aws-mountpoint-s3-csi-driver",
        None,
        "EKS default for 1.35; not pinned (no checkable source)",
    ),
    AddonPin(
        "eks-node-monitoring-agent", None, "EKS default for 1.35; not pinned (no checkable source)"
    ),
)

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

CHARTS: tuple[ChartPin, ...] = (NEURON_CHART, EFA_CHART, TRAINER_CHART)
