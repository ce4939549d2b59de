"""Lookups into a synthesized template's JSON that several template tests share."""

from __future__ import annotations

import json
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


def sdk_call(resource: dict[str, Any], phase: str = "Create") -> dict[str, Any]:
    """The AWS SDK call of a ``Custom::AWS`` resource (CDK's AwsCustomResource) for ``phase``,
    with each reference inside it shown as ``<LogicalId>`` or ``<LogicalId.Attribute>``."""
    value = resource["Properties"][phase]
    if isinstance(value, str):
        return dict(json.loads(value))
    separator, parts = value["Fn::Join"]
    text = separator.join(part if isinstance(part, str) else _reference(part) for part in parts)
    return dict(json.loads(text))


def _reference(token: dict[str, Any]) -> str:
    if "Ref" in token:
        return f"<{token['Ref']}>"
    logical_id, attribute = token["Fn::GetAtt"]
    return f"<{logical_id}.{attribute}>"


def scaling(template: dict[str, Any], nodegroup_id: str | None = None) -> dict[str, Any]:
    """The scaling config the node group's ``Size`` call gives it (the template's only node
    group's, or the group of logical id ``nodegroup_id``)."""
    if nodegroup_id is None:
        (nodegroup_id,) = [
            i for i, r in template["Resources"].items() if r["Type"] == "AWS::EKS::Nodegroup"
        ]
    (call,) = [
        sdk_call(r)
        for r in of_type(template, "Custom::AWS")
        if sdk_call(r)["parameters"].get("nodegroupName") == f"<{nodegroup_id}.NodegroupName>"
    ]
    config: dict[str, Any] = call["parameters"]["scalingConfig"]
    return config
