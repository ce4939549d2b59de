"""Draw the deployed architecture from a synthesized cloud assembly (``make diagram``).

Reads ``cdk.out``'s manifest and templates, keeps the resources a reader cares about (network,
storage, cluster, capacity, charts, identity), one box per stack, and draws an edge wherever one
kept resource references another, across stacks included. Prints Graphviz DOT; ``make diagram``
renders it with ``dot`` into docs/architecture.svg.

Usage: python docs/diagram.py [cdk.out] > architecture.dot
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Resource types worth a box, with how to label them.
KEPT: dict[str, str] = {
    "AWS::EC2::VPC": "VPC",
    "AWS::EC2::NatGateway": "NAT gateway",
    "AWS::EC2::VPCEndpoint": "VPC endpoint",
    "AWS::EC2::FlowLog": "Flow logs",
    "AWS::EC2::SubnetCidrReservation": "Prefix reservation",
    # AwsCustomResource; the app's only one makes the prefix reservation through EC2's API where
    # CloudFormation has no reservation type (us-east-2 among those regions).
    "Custom::AWS": "Prefix reservation",
    "AWS::S3::Bucket": "S3 bucket",
    "AWS::FSx::FileSystem": "FSx for Lustre",
    "AWS::FSx::DataRepositoryAssociation": "Data repository association",
    "AWS::KMS::Key": "KMS key",
    "AWS::EKS::Cluster": "EKS cluster",
    "AWS::EKS::Nodegroup": "Node group",
    "AWS::EKS::Addon": "Add-on",
    "AWS::EKS::PodIdentityAssociation": "Pod Identity",
    "AWS::EC2::PlacementGroup": "Placement group",
    "AWS::EC2::LaunchTemplate": "Launch template",
    "Custom::AWSCDK-EKS-HelmChart": "Helm chart",
    "Custom::AWSCDK-EKS-KubernetesResource": "Kubernetes manifests",
    "AWS::ECR::Repository": "ECR repository",
    "AWS::SSM::Parameter": "SSM outputs",
}
_HASH = re.compile(r"[0-9A-F]{8}$")
_EXPORT = re.compile(r"^(?P<stack>[^:]+):ExportsOutput(?:Ref|FnGetAtt)(?P<rest>.+)$")


@dataclass(frozen=True)
class Node:
    stack: str
    logical_id: str
    label: str

    @property
    def key(self) -> str:
        return f"{self.stack}.{self.logical_id}"


def load(assembly: Path) -> dict[str, dict[str, Any]]:
    """Templates by stack name, in the manifest's order."""
    manifest = json.loads((assembly / "manifest.json").read_text())
    templates = {}
    for name, artifact in manifest["artifacts"].items():
        if artifact["type"] == "aws:cloudformation:stack":
            path = assembly / artifact["properties"]["templateFile"]
            templates[name] = json.loads(path.read_text())
    return templates


def label(logical_id: str, resource: dict[str, Any], default: str) -> str:
    props = resource.get("Properties", {})
    detail = (
        _service(props.get("ServiceName"))
        or props.get("AddonName")
        or (f"{props['Release']} {props['Version']}" if "Release" in props else None)
        or props.get("FileSystemPath")
        or props.get("InstanceType")
        or props.get("AmiType")
        or (props.get("LaunchTemplateData") or {}).get("InstanceType")
        or (props.get("Name") if isinstance(props.get("Name"), str) else None)
        or (props.get("Version") if isinstance(props.get("Version"), str) else None)
        or _HASH.sub("", logical_id)
    )
    if resource["Type"] == "AWS::EC2::LaunchTemplate" and "NetworkInterfaces" in (
        props.get("LaunchTemplateData") or {}
    ):
        detail = f"{detail}, {len(props['LaunchTemplateData']['NetworkInterfaces'])} EFA"
    return f"{default}\\n{detail}" if detail else default


def _service(name: Any) -> str | None:
    """The short service of an endpoint (``ecr.api``) from its joined service name."""
    if isinstance(name, dict) and "Fn::Join" in name:
        name = "".join(p for p in name["Fn::Join"][1] if isinstance(p, str))
    if not isinstance(name, str):
        return None
    return re.sub(r"^com\.amazonaws\.([a-z0-9-]*\.)?", "", name)


def references(value: Any) -> Iterator[tuple[str | None, str]]:
    """(stack or None, logical id or export remainder) for each Ref/GetAtt/ImportValue in value."""
    if isinstance(value, dict):
        if "Ref" in value and isinstance(value["Ref"], str):
            yield None, value["Ref"]
        if "Fn::GetAtt" in value:
            yield None, value["Fn::GetAtt"][0]
        if "Fn::ImportValue" in value and isinstance(value["Fn::ImportValue"], str):
            match = _EXPORT.match(value["Fn::ImportValue"])
            if match:
                yield match["stack"], match["rest"]
        for item in value.values():
            yield from references(item)
    elif isinstance(value, list):
        for item in value:
            yield from references(item)


def graph(templates: dict[str, dict[str, Any]]) -> str:
    nodes: dict[str, Node] = {}
    for stack, template in templates.items():
        for logical_id, resource in template.get("Resources", {}).items():
            if _kept(resource):
                node = Node(stack, logical_id, label(logical_id, resource, KEPT[resource["Type"]]))
                nodes[node.key] = node
    edges = set()
    for stack, template in templates.items():
        for logical_id, resource in template.get("Resources", {}).items():
            source = f"{stack}.{logical_id}"
            if source not in nodes:
                continue
            for target in _targets(templates, nodes, stack, resource, depth=2):
                if target != source:
                    edges.add((source, target))
    lines = [
        "digraph platform {",
        '  rankdir=LR; compound=true; node [shape=box, style="rounded,filled", '
        'fillcolor="#f5f7fa", fontname="Helvetica", fontsize=10];',
    ]
    for index, stack in enumerate(templates):
        lines.append(f'  subgraph cluster_{index} {{ label="{stack}"; fontname="Helvetica";')
        for node in nodes.values():
            if node.stack == stack:
                lines.append(f'    "{node.key}" [label="{node.label}"];')
        lines.append("  }")
    for source, target in sorted(edges):
        lines.append(f'  "{source}" -> "{target}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _kept(resource: dict[str, Any]) -> bool:
    if resource["Type"] == "AWS::SSM::Parameter":
        return "Name" in resource.get("Properties", {})
    return resource["Type"] in KEPT


def _targets(
    templates: dict[str, dict[str, Any]],
    nodes: dict[str, Node],
    stack: str,
    resource: dict[str, Any],
    depth: int,
) -> set[str]:
    """Kept resources that ``resource`` references, looking through up to ``depth`` resources
    that are not kept themselves (a subnet leads to its VPC)."""
    found = set()
    for ref_stack, ref in references(resource.get("Properties", {})):
        target_stack = ref_stack or stack
        resources = templates.get(target_stack, {}).get("Resources", {})
        logical_id = ref if ref in resources else _producer(resources, ref)
        if logical_id is None:
            continue
        key = f"{target_stack}.{logical_id}"
        if key in nodes:
            found.add(key)
        elif depth > 0:
            found |= _targets(templates, nodes, target_stack, resources[logical_id], depth - 1)
    return found


def _producer(resources: dict[str, Any], export_rest: str) -> str | None:
    """The resource an export name comes from: its logical id starts the name's remainder."""
    candidates = [lid for lid in resources if export_rest.startswith(lid)]
    return max(candidates, key=len) if candidates else None


def main() -> int:
    assembly = Path(sys.argv[1] if len(sys.argv) > 1 else "cdk.out")
    sys.stdout.write(graph(load(assembly)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
