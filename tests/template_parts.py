"""Lookups into a synthesized template's JSON that several template tests share."""

from __future__ import annotations

from typing import Any


def of_type(template: dict[str, Any], resource_type: str) -> list[dict[str, Any]]:
    return [r for r in template["Resources"].values() if r["Type"] == resource_type]


def launch_data(template: dict[str, Any]) -> dict[str, Any]:
    """The LaunchTemplateData of the template's only launch template."""
    (resource,) = of_type(template, "AWS::EC2::LaunchTemplate")
    data: dict[str, Any] = resource["Properties"]["LaunchTemplateData"]
    return data


def nodegroup(template: dict[str, Any]) -> dict[str, Any]:
    """The properties of the template's only managed node group."""
    (group,) = of_type(template, "AWS::EKS::Nodegroup")
    props: dict[str, Any] = group["Properties"]
    return props
