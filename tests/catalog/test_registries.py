"""The EKS image registry of each region, as the EKS user guide lists them."""

import re

import pytest

from trn_catalog import registries, versions


@pytest.mark.parametrize(
    ("region", "host"),
    [
        # Rows of the guide's table (add-ons-images), one per kind of account and domain.
        ("us-east-2", "602401143452.dkr.ecr.us-east-2.amazonaws.com"),
        ("us-west-2", "602401143452.dkr.ecr.us-west-2.amazonaws.com"),
        ("ap-southeast-4", "491585149902.dkr.ecr.ap-southeast-4.amazonaws.com"),
        ("af-south-1", "877085696533.dkr.ecr.af-south-1.amazonaws.com"),
        ("il-central-1", "066635153087.dkr.ecr.il-central-1.amazonaws.com"),
        ("us-gov-west-1", "013241004608.dkr.ecr.us-gov-west-1.amazonaws.com"),
        ("cn-north-1", "918309763551.dkr.ecr.cn-north-1.amazonaws.com.cn"),
    ],
)
def test_a_regions_registry_is_the_guides(region: str, host: str) -> None:
    assert registries.eks_registry(region) == host


def test_every_account_is_twelve_digits_and_the_source_is_dated() -> None:
    assert all(re.fullmatch(r"\d{12}", a) for a in registries.EKS_REGISTRY_ACCOUNTS.values())
    assert "add-ons-images" in registries.SOURCE and "2024-12-18" in registries.SOURCE
    # Every region where the catalog's trn types run (its region list is EC2's) has one.
    assert {"us-east-1", "us-east-2", "us-west-2", "ap-northeast-1", "eu-north-1"} <= set(
        registries.EKS_REGISTRY_ACCOUNTS
    )


def test_a_region_the_guide_does_not_list_is_refused_naming_the_page() -> None:
    with pytest.raises(registries.UnknownRegistryRegionError, match="mx-central-1") as caught:
        registries.eks_registry("mx-central-1")
    assert "View Amazon container image registries" in str(caught.value)


def test_the_images_are_the_pinned_charts_own() -> None:
    """The tags each chart's values.yaml sets at the commit its pin names (trn_catalog.versions)."""
    assert registries.EFA_DEVICE_PLUGIN_IMAGE.tag in versions.EFA_CHART.source
    assert f"dranet {registries.DRANET_IMAGE.tag}" in versions.DRANET_CHART.source
