"""Amazon EKS's container image registries, one per region, and the EKS-built images the
platform pulls from them (the EFA device plugin and aws-dranet).

The charts of both images default to the us-west-2 registry: in any other region every node
would pull them across regions, through the NAT gateway. EKS replicates the images of its
registry "to a repository in each Amazon EKS supported AWS Region", each region's registry in
the account the EKS user guide lists, pulled with the node role's
AmazonEC2ContainerRegistryReadOnly policy (and through the VPC's ECR endpoints). Standard
library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

GUIDE = "the EKS user guide page 'View Amazon container image registries for Amazon EKS add-ons'"
SOURCE = (
    f"{GUIDE} (add-ons-images): awsdocs/amazon-eks-user-guide@"
    "4d52b4d05e3478582e7d10a73cbd9ba9194dd5f7 latest/ug/workloads/add-ons-images.adoc "
    "(2024-12-18); ap-southeast-5, ap-southeast-6 and ap-southeast-7 from the page as "
    "published on docs.aws.amazon.com (read 2026-12-02)"
)

# Region -> the account of its EKS registry (SOURCE). Left out: ap-east-2, whose row on the
# published page names a registry host of ap-east-1, and regions the page does not list.
EKS_REGISTRY_ACCOUNTS: Mapping[str, str] = MappingProxyType(
    {
        "af-south-1": "877085696533",
        "ap-east-1": "800184023465",
        "ap-northeast-1": "602401143452",
        "ap-northeast-2": "602401143452",
        "ap-northeast-3": "602401143452",
        "ap-south-1": "602401143452",
        "ap-south-2": "900889452093",
        "ap-southeast-1": "602401143452",
        "ap-southeast-2": "602401143452",
        "ap-southeast-3": "296578399912",
        "ap-southeast-4": "491585149902",
        "ap-southeast-5": "151610086707",
        "ap-southeast-6": "333609536671",
        "ap-southeast-7": "121268973566",
        "ca-central-1": "602401143452",
        "ca-west-1": "761377655185",
        "cn-north-1": "918309763551",
        "cn-northwest-1": "961992271922",
        "eu-central-1": "602401143452",
        "eu-central-2": "900612956339",
        "eu-north-1": "602401143452",
        "eu-south-1": "590381155156",
        "eu-south-2": "455263428931",
        "eu-west-1": "602401143452",
        "eu-west-2": "602401143452",
        "eu-west-3": "602401143452",
        "il-central-1": "066635153087",
        "me-central-1": "759879836304",
        "me-south-1": "558608220178",
        "sa-east-1": "602401143452",
        "us-east-1": "602401143452",
        "us-east-2": "602401143452",
        "us-gov-east-1": "151742754352",
        "us-gov-west-1": "013241004608",
        "us-west-1": "602401143452",
        "us-west-2": "602401143452",
    }
)


@dataclass(frozen=True)
class EksImage:
    """An image of EKS's registry: its repository there and the tag the chart pin runs."""

    repository: str
    tag: str


# The images of the pinned charts (trn_catalog.versions: EFA_CHART v0.5.30 sets tag v0.5.20,
# DRANET_CHART 1.0.0 sets v1.2.0-eksbuild.2; each chart's values.yaml at the commit its pin
# names), by chart.
EFA_DEVICE_PLUGIN_IMAGE = EksImage("eks/aws-efa-k8s-device-plugin", "v0.5.20")
DRANET_IMAGE = EksImage("eks/dranet", "v1.2.0-eksbuild.2")


class UnknownRegistryRegionError(KeyError):
    """Raised for a region whose EKS registry the catalog does not list."""

    def __init__(self, region: str) -> None:
        self.region = region
        super().__init__(region)

    def __str__(self) -> str:
        return (
            f"region {self.region!r} has no EKS image registry in trn_catalog/registries.py; "
            f"add its account from {GUIDE}"
        )


def eks_registry(region: str) -> str:
    """The host of ``region``'s EKS registry, e.g. ``602401143452.dkr.ecr.us-east-2.amazonaws.com``
    (``amazonaws.com.cn`` in the China regions).

    Raises:
        UnknownRegistryRegionError: the catalog lists no registry for ``region``.
    """
    try:
        account = EKS_REGISTRY_ACCOUNTS[region]
    except KeyError:
        raise UnknownRegistryRegionError(region) from None
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{account}.dkr.ecr.{region}.{suffix}"
