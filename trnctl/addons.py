"""`trnctl addons`: check the pinned EKS add-on versions against what EKS offers.

The cluster stack installs the add-ons of :data:`trn_catalog.versions.ADDONS`. A pin that EKS
does not offer for the cluster's Kubernetes version fails the deploy, and an unpinned add-on
takes whatever EKS's default is on the day; this reads ``eks:DescribeAddonVersions`` so both
are caught before ``cdk deploy``, with the exact line to paste.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trn_catalog import versions
from trnctl.preflight import Check, Status


@dataclass(frozen=True)
class Offered:
    """The versions EKS offers of one add-on for one Kubernetes version."""

    versions: tuple[str, ...]
    default: str | None


def offered(eks: Any, addon: str, kubernetes_version: str) -> Offered:
    """What EKS offers of ``addon`` for ``kubernetes_version`` (all pages).

    Raises:
        botocore.exceptions.ClientError: the call failed (access denied, throttling).
    """
    found: list[str] = []
    default = None
    for page in eks.get_paginator("describe_addon_versions").paginate(
        addonName=addon, kubernetesVersion=kubernetes_version
    ):
        for entry in page.get("addons", []):
            for version in entry.get("addonVersions", []):
                found.append(version["addonVersion"])
                for compatibility in version.get("compatibilities", []):
                    if compatibility.get("defaultVersion"):
                        default = version["addonVersion"]
    return Offered(tuple(found), default)


def check(pin: versions.AddonPin, offer: Offered, kubernetes_version: str) -> Check:
    """PASS for an offered pin, FAIL for a pin EKS does not offer, WARN for no pin."""
    paste = f'AddonPin("{pin.name}", "{offer.default}", "eks describe-addon-versions default")'
    if not offer.versions:
        return Check(
            pin.name,
            Status.FAIL,
            f"EKS offers no version for Kubernetes {kubernetes_version}",
            "check the region supports the add-on, or drop it from trn_catalog/versions.py",
        )
    if pin.version is None:
        return Check(
            pin.name,
            Status.WARN,
            f"not pinned; EKS's default for {kubernetes_version} is {offer.default}",
            f"pin it in trn_catalog/versions.py: {paste}",
        )
    if pin.version not in offer.versions:
        return Check(
            pin.name,
            Status.FAIL,
            f"pinned {pin.version} is not offered for {kubernetes_version}",
            f"pin an offered version, e.g. the default: {paste}",
        )
    latest = "" if pin.version == offer.default else f" (EKS default: {offer.default})"
    return Check(pin.name, Status.PASS, f"{pin.version} is offered{latest}")


def run(eks: Any, kubernetes_version: str = versions.KUBERNETES_VERSION) -> list[Check]:
    """One check per pinned add-on."""
    return [
        check(pin, offered(eks, pin.name, kubernetes_version), kubernetes_version)
        for pin in versions.ADDONS
    ]
