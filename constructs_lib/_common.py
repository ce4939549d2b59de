"""Small helpers shared by the constructs: log retention and log-group encryption keys."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import jsii
from aws_cdk import (
    Acknowledgment,
    Duration,
    IStableAnyProducer,
    Lazy,
    RemovalPolicy,
    Stack,
    Token,
    Validations,
)
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct, IConstruct

from trn_catalog.outputs import STACK_ONLY_TAGS

RETENTION_DAYS: dict[int, logs.RetentionDays] = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
    731: logs.RetentionDays.TWO_YEARS,
    1827: logs.RetentionDays.FIVE_YEARS,
    3653: logs.RetentionDays.TEN_YEARS,
}


def retention(field_name: str, days: int) -> logs.RetentionDays:
    """The CloudWatch retention for ``days``.

    Raises:
        ValueError: ``days`` is not one of :data:`RETENTION_DAYS` (the message names the field).
    """
    if days not in RETENTION_DAYS:
        known = ", ".join(map(str, RETENTION_DAYS))
        raise ValueError(
            f"{field_name} {days} is not a supported log retention; use one of {known}"
        )
    return RETENTION_DAYS[days]


def log_group_key(scope: Construct, construct_id: str, removal_policy: RemovalPolicy) -> kms.Key:
    """A rotating KMS key that CloudWatch Logs may use, for this account's log groups only."""
    key = kms.Key(
        scope,
        construct_id,
        description=f"Encrypts CloudWatch log groups of {scope.node.path}",
        enable_key_rotation=True,
        removal_policy=removal_policy,
        pending_window=Duration.days(7),
    )
    stack = Stack.of(scope)
    key.add_to_resource_policy(
        iam.PolicyStatement(
            actions=[
                "kms:Encrypt*",
                "kms:Decrypt*",
                "kms:ReEncrypt*",
                "kms:GenerateDataKey*",
                "kms:Describe*",
            ],
            principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
            resources=["*"],
            conditions={
                "ArnLike": {
                    "kms:EncryptionContext:aws:logs:arn": (
                        f"arn:{stack.partition}:logs:{stack.region}:{stack.account}:log-group:*"
                    )
                }
            },
        )
    )
    return key


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge one cdk-nag AwsSolutions finding on ``scope`` and below, with its reason.

    ``rule`` is the id cdk-nag prints, e.g. ``AwsSolutions-IAM4[Policy::...]``.
    """
    Validations.of(scope).acknowledge(Acknowledgment(id=f"AwsSolutions::{rule}", reason=reason))


def acknowledge_managed_policies(role: iam.IRole, reason: str) -> None:
    """Acknowledge the AwsSolutions-IAM4 finding of each managed policy attached to ``role``."""
    cfn = role.node.default_child
    if not isinstance(cfn, iam.CfnRole):
        raise TypeError(f"{role.node.path} is not a role created in this app")
    for arn in _as_list(Stack.of(role).resolve(cfn.managed_policy_arns)):
        acknowledge(role, f"AwsSolutions-IAM4[Policy::{nag_reference(arn)}]", reason)


# The id CDK gives AwsCustomResource's one Lambda function per stack.
AWS_CUSTOM_RESOURCE_PROVIDER = "AWS679f53fac002430cb0da5b7982bd2287"


def acknowledge_sdk_call_provider(scope: Construct) -> None:
    """Acknowledge the cdk-nag findings of CDK's AwsCustomResource function in ``scope``'s
    stack (made by the first AwsCustomResource there): its AWS-managed logging policy and the
    runtime CDK pins with its handler."""
    provider = Stack.of(scope).node.find_child(AWS_CUSTOM_RESOURCE_PROVIDER)
    role = provider.node.find_child("ServiceRole")
    assert isinstance(role, iam.Role)
    acknowledge_managed_policies(
        role,
        "AWSLambdaBasicExecutionRole: the AWS-maintained policy for the function's own logs.",
    )
    acknowledge(
        provider,
        "AwsSolutions-L1",
        "CDK pins AwsCustomResource's Node.js runtime along with its handler.",
    )


def worker_node_role(scope: Construct, construct_id: str, description: str) -> iam.Role:
    """An EC2 role for EKS worker nodes: join the cluster, pull from ECR, Session Manager.

    No CNI policy: the VPC CNI gets its credentials through Pod Identity instead.
    """
    policies = (
        "AmazonEKSWorkerNodePolicy",
        "AmazonEC2ContainerRegistryReadOnly",
        "AmazonSSMManagedInstanceCore",
    )
    role = iam.Role(
        scope,
        construct_id,
        assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
        description=description,
        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(p) for p in policies],
    )
    acknowledge_managed_policies(
        role,
        f"{', '.join(policies)}: the AWS-maintained policies EKS documents for worker nodes "
        "(join the cluster, pull images, Session Manager instead of SSH).",
    )
    return role


def acknowledge_wildcards(role: iam.Role, reason: str) -> None:
    """Acknowledge each wildcard (AwsSolutions-IAM5) finding of ``role``'s default policy.

    Call it after the last grant. Only references inside the role's own stack render the same
    at construct time as at synth, so keep the granted resources in the role's stack.
    """
    policy = role.node.try_find_child("DefaultPolicy")
    if not isinstance(policy, iam.Policy):
        return
    document = Stack.of(role).resolve(policy.document.to_json())
    for finding in sorted(_wildcard_findings(document)):
        acknowledge(role, f"AwsSolutions-IAM5[{finding}]", reason)


def _wildcard_findings(document: dict[str, Any]) -> set[str]:
    findings = set()
    for statement in document.get("Statement", []):
        if statement.get("Effect") != "Allow":
            continue
        for action in _as_list(statement.get("Action")):
            if "*" in action:
                findings.add(f"Action::{action}")
        for resource in _as_list(statement.get("Resource")):
            flat = nag_reference(resource)
            if "*" in flat:
                findings.add(f"Resource::{flat}")
    return findings


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def nag_reference(node: Any) -> str:
    """A CloudFormation reference as cdk-nag names it in a finding id."""
    if isinstance(node, str):
        return node.replace("${", "<").replace("}", ">")
    if "Fn::Join" in node:
        delimiter, items = node["Fn::Join"]
        return str(delimiter).join(nag_reference(item) for item in items)
    if "Fn::Sub" in node:
        return nag_reference(node["Fn::Sub"])
    if "Fn::GetAtt" in node:
        resource, attribute = node["Fn::GetAtt"]
        return f"<{nag_reference(resource)}.{nag_reference(attribute)}>"
    if "Fn::ImportValue" in node:
        return nag_reference(node["Fn::ImportValue"])
    if "Ref" in node:
        return f"<{nag_reference(node['Ref'])}>"
    return json.dumps(node, separators=(",", ":"))


def deny_other_egress(group: ec2.SecurityGroup) -> None:
    """Keep ``group``'s outbound traffic to its explicit egress rules only.

    CDK drops its inline "no traffic" placeholder once any egress rule is added, even a rule
    that lives in a separate AWS::EC2::SecurityGroupEgress resource (rules naming a group);
    EC2 then adds its default allow-all egress. An inline placeholder rule prevents that.
    """
    cfn = group.node.default_child
    assert isinstance(cfn, ec2.CfnSecurityGroup)
    cfn.add_property_override(
        "SecurityGroupEgress",
        [
            {
                "CidrIp": "255.255.255.255/32",
                "Description": "Disallow all traffic",
                "FromPort": 252,
                "IpProtocol": "icmp",
                "ToPort": 86,
            }
        ],
    )


# IMDSv2 only, and one hop: containers on the node cannot reach the instance's credentials.
IMDSV2_ONE_HOP = {"HttpEndpoint": "enabled", "HttpTokens": "required", "HttpPutResponseHopLimit": 1}


def launch_template(
    scope: Construct,
    construct_id: str,
    data: dict[str, Any],
    instance_tags: Mapping[str, str] | None = None,
) -> ec2.CfnLaunchTemplate:
    """A launch template from raw CloudFormation ``LaunchTemplateData``, IMDSv2 with one hop.

    Raw keys, because the typed L1 silently drops keys it does not model (efa-only interfaces,
    network card indexes). Instances and their volumes carry the stack's tags (a preview's tag
    among them, which its budget filters on) plus ``instance_tags``: tags on a node group do not
    reach its instances. The stack-only tags of :data:`trn_catalog.outputs.STACK_ONLY_TAGS` are
    left out: tag specifications are part of the template version, and a new version makes EKS
    replace every node of the node group. :func:`launch_template_data` gives the same data.
    """
    template = ec2.CfnLaunchTemplate(scope, construct_id, launch_template_data={})
    template.add_property_override("LaunchTemplateData", _with_imds(data))
    # Rendered at synth, once every Tags aspect has tagged the stack.
    template.add_property_override(
        "LaunchTemplateData.TagSpecifications",
        Lazy.any(_TagSpecifications(Stack.of(template), dict(instance_tags or {}))),
    )
    return template


def launch_template_data(
    scope: Construct, data: dict[str, Any], instance_tags: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """What :func:`launch_template` puts in ``LaunchTemplateData`` for ``data``; call it at
    synth (from a Lazy value), when the stack's tags are final."""
    specs = _tag_specifications(Stack.of(scope), dict(instance_tags or {}))
    return {**_with_imds(data), **({"TagSpecifications": specs} if specs else {})}


def _with_imds(data: dict[str, Any]) -> dict[str, Any]:
    return {"MetadataOptions": IMDSV2_ONE_HOP, **data}


def _tag_specifications(stack: Stack, extra: dict[str, str]) -> list[dict[str, Any]] | None:
    stack_tags = stack.tags.tag_values()
    tags = {k: v for k, v in stack_tags.items() if k not in STACK_ONLY_TAGS} | extra
    if not tags:
        return None
    rendered = [{"Key": key, "Value": value} for key, value in sorted(tags.items())]
    return [{"ResourceType": kind, "Tags": rendered} for kind in ("instance", "volume")]


@jsii.implements(IStableAnyProducer)
class _TagSpecifications:
    def __init__(self, stack: Stack, extra: dict[str, str]) -> None:
        self.stack = stack
        self.extra = extra

    def produce(self) -> list[dict[str, Any]] | None:
        return _tag_specifications(self.stack, self.extra)


def subnet_zone(subnet: ec2.ISubnet) -> str | None:
    """The subnet's AZ where it is known at synth: None for a subnet imported without one
    (``ec2.Subnet.from_subnet_id``) or whose AZ is a token (an environment-agnostic stack)."""
    try:
        zone = subnet.availability_zone
    except RuntimeError:
        return None
    return None if Token.is_unresolved(zone) else zone


def check_subnet_zone(prop: str, subnet: ec2.ISubnet, trn_zone: str | None) -> None:
    """Refuse ``subnet``, given as the prop ``prop``, outside ``trn_zone`` where both are known.

    Raises:
        ValueError: the subnet's AZ is another; the message names the prop and both zones.
    """
    zone = subnet_zone(subnet)
    if trn_zone is None or zone is None or zone == trn_zone:
        return
    raise ValueError(
        f"{prop} {subnet.node.path!r} is in {zone!r}, not in trn_availability_zone "
        f"{trn_zone!r}; the trn nodes, their placement group and FSx share the trn AZ"
    )
