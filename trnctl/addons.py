"""`trnctl addons`: check the pinned EKS add-ons against what EKS offers, before a deploy.

The cluster stack installs the add-ons of :data:`trn_catalog.versions.ADDONS`, each at an exact
version with its configuration values and, where it calls AWS, a Pod Identity association. Each
of these fails the deploy (or leaves a driver without credentials) when EKS disagrees, so this
reads ``eks:DescribeAddonVersions`` and ``eks:DescribeAddonConfiguration`` and says, per add-on,
whether the version is offered for the cluster's Kubernetes version, whether the configuration
passes the add-on's own JSON schema, and whether the Pod Identity service account is the one EKS
names. A failing pin comes with the line to paste.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

from trn_catalog import versions
from trnctl.preflight import Check, Status


@dataclass(frozen=True)
class Offered:
    """The versions EKS offers of one add-on for one Kubernetes version."""

    versions: tuple[str, ...]
    default: str | None


@dataclass(frozen=True)
class Configuration:
    """What EKS says of one add-on version: its configuration schema and the service accounts
    its Pod Identity associations go on."""

    schema: Mapping[str, Any]
    service_accounts: tuple[str, ...]


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


def configuration(eks: Any, addon: str, version: str) -> Configuration:
    """The configuration schema and Pod Identity service accounts of ``addon`` at ``version``.

    Raises:
        botocore.exceptions.ClientError: the call failed.
    """
    answer = eks.describe_addon_configuration(addonName=addon, addonVersion=version)
    schema = json.loads(answer.get("configurationSchema") or "{}")
    accounts = tuple(
        entry["serviceAccount"] for entry in answer.get("podIdentityConfiguration", [])
    )
    return Configuration(schema, accounts)


def version_problem(pin: versions.AddonPin, offer: Offered, kubernetes_version: str) -> str:
    """Why EKS would refuse ``pin.version`` for ``kubernetes_version``; empty when offered."""
    if not offer.versions:
        return f"EKS offers no version for Kubernetes {kubernetes_version}"
    if pin.version not in offer.versions:
        return f"pinned {pin.version} is not offered for {kubernetes_version}"
    return ""


def configuration_problems(pin: versions.AddonPin, config: Configuration) -> list[str]:
    """How ``pin``'s configuration values and service account disagree with EKS's."""
    problems: list[str] = []
    if pin.configuration:
        validator = jsonschema.validators.validator_for(config.schema)(config.schema)
        for error in sorted(
            validator.iter_errors(dict(pin.configuration)), key=lambda e: list(e.absolute_path)
        ):
            path = ".".join(str(part) for part in error.absolute_path) or "(root)"
            problems.append(f"configuration at {path}: {error.message}")
    account = pin.service_account
    if account and config.service_accounts and account[1] not in config.service_accounts:
        problems.append(
            f"Pod Identity goes on {account[1]}, but EKS names {', '.join(config.service_accounts)}"
        )
    return problems


def check(
    pin: versions.AddonPin,
    offer: Offered,
    config: Configuration | None,
    kubernetes_version: str,
) -> Check:
    """PASS when EKS offers the pin and accepts its configuration and service account; FAIL
    otherwise, with the fix. ``config`` is None when the version is not offered."""
    paste = f'AddonPin("{pin.name}", "{offer.default}", "eks describe-addon-versions default")'
    problem = version_problem(pin, offer, kubernetes_version)
    if problem and not offer.versions:
        fix = "check the region supports the add-on, or drop it from trn_catalog/versions.py"
        return Check(pin.name, Status.FAIL, problem, fix)
    if problem:
        return Check(pin.name, Status.FAIL, problem, f"pin an offered version, e.g. {paste}")
    problems = configuration_problems(pin, config) if config else []
    if problems:
        fix = f"change {pin.name}'s entry in trn_catalog/versions.py to match EKS"
        return Check(pin.name, Status.FAIL, "; ".join(problems), fix)
    latest = "" if pin.version == offer.default else f" (EKS default: {offer.default})"
    return Check(pin.name, Status.PASS, f"{pin.version} is offered{latest}; configuration valid")


def run(eks: Any, kubernetes_version: str = versions.KUBERNETES_VERSION) -> list[Check]:
    """One check per pinned add-on."""
    checks: list[Check] = []
    for pin in versions.ADDONS:
        offer = offered(eks, pin.name, kubernetes_version)
        # EKS describes the configuration of offered versions only.
        config = (
            configuration(eks, pin.name, pin.version) if pin.version in offer.versions else None
        )
        checks.append(check(pin, offer, config, kubernetes_version))
    return checks
