"""TrainingDataPaths adopted by another app: kept by default, your buckets and keys, and FSx
opened to a node group in one call."""

import json
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Template

from constructs_lib import TrainingDataPaths, TrainiumNodeGroup
from tests.conftest import construct_app

THEIR_KEY = "arn:aws:kms:us-west-2:210987654321:key/11111111-2222-3333-4444-555555555555"
STATEFUL = ("AWS::S3::Bucket", "AWS::FSx::FileSystem", "AWS::KMS::Key")


def stack_and_vpc() -> tuple[cdk.Stack, ec2.Vpc]:
    stack = cdk.Stack(
        construct_app(), "Theirs", env=cdk.Environment(account="210987654321", region="us-west-2")
    )
    return stack, ec2.Vpc(stack, "Vpc", availability_zones=["us-west-2a", "us-west-2b"])


def resources(stack: cdk.Stack, resource_type: str | None = None) -> dict[str, dict[str, Any]]:
    every: dict[str, dict[str, Any]] = Template.from_stack(stack).to_json()["Resources"]
    return {i: r for i, r in every.items() if resource_type in (None, r["Type"])}


def policy_statements(stack: cdk.Stack, role_prefix: str) -> list[dict[str, Any]]:
    return [
        statement
        for logical_id, r in resources(stack, "AWS::IAM::Policy").items()
        if logical_id.startswith(role_prefix)
        for statement in r["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_data_is_retained_unless_asked() -> None:
    stack, vpc = stack_and_vpc()
    TrainingDataPaths(stack, "Data", vpc=vpc, fsx_subnet=vpc.private_subnets[0])
    for resource_type in STATEFUL:
        found = resources(stack, resource_type)
        assert found, resource_type
        for resource in found.values():
            assert resource["DeletionPolicy"] == "Retain", resource_type
            assert resource["UpdateReplacePolicy"] == "Retain", resource_type
    assert not resources(stack, "Custom::S3AutoDeleteObjects")

    stack, vpc = stack_and_vpc()
    TrainingDataPaths(
        stack,
        "Data",
        vpc=vpc,
        fsx_subnet=vpc.private_subnets[0],
        removal_policy=cdk.RemovalPolicy.DESTROY,
    )
    for resource_type in STATEFUL:
        for resource in resources(stack, resource_type).values():
            assert resource["DeletionPolicy"] == "Delete", resource_type
    assert len(resources(stack, "Custom::S3AutoDeleteObjects")) == 4


def test_your_log_bucket_checkpoints_bucket_and_key() -> None:
    stack, vpc = stack_and_vpc()
    logs = s3.Bucket.from_bucket_name(stack, "CentralLogs", "central-access-logs")
    checkpoints = s3.Bucket.from_bucket_name(stack, "Checkpoints", "research-checkpoints")
    key = kms.Key.from_key_arn(stack, "Key", THEIR_KEY)
    paths = TrainingDataPaths(
        stack,
        "Data",
        vpc=vpc,
        fsx_subnet=vpc.private_subnets[0],
        access_logs_bucket=logs,
        checkpoints_bucket=checkpoints,
        encryption_key=key,
    )
    assert (paths.access_logs, paths.checkpoints, paths.key) == (logs, checkpoints, key)
    buckets = resources(stack, "AWS::S3::Bucket")
    # Only the datasets and compile-cache buckets are made, both logging to your bucket.
    assert len(buckets) == 2
    for bucket in buckets.values():
        assert bucket["Properties"]["LoggingConfiguration"]["DestinationBucketName"] == (
            "central-access-logs"
        )
    assert not resources(stack, "AWS::KMS::Key")
    (association,) = [
        r["Properties"]
        for r in resources(stack, "AWS::FSx::DataRepositoryAssociation").values()
        if r["Properties"]["FileSystemPath"] == "/checkpoints"
    ]
    assert association["DataRepositoryPath"] == "s3://research-checkpoints"
    job = json.dumps(policy_statements(stack, "DataJobRole"))
    assert "research-checkpoints/*" in job and "s3:PutObject" in job


def decrypts(statements: list[dict[str, Any]], key_arn: str) -> bool:
    return any(
        s["Resource"] == key_arn and "kms:Decrypt" in s["Action"] and s["Effect"] == "Allow"
        for s in statements
    )


@pytest.mark.parametrize("how", ["bucket carries its key", "datasets_key"])
def test_a_kms_datasets_bucket_of_yours_gets_decrypt_grants(how: str) -> None:
    stack, vpc = stack_and_vpc()
    key = kms.Key.from_key_arn(stack, "DatasetsKey", THEIR_KEY)
    if how == "datasets_key":
        bucket = s3.Bucket.from_bucket_name(stack, "Datasets", "research-datasets")
        extra: dict[str, Any] = {"datasets_key": key}
    else:
        bucket = s3.Bucket.from_bucket_attributes(
            stack, "Datasets", bucket_name="research-datasets", encryption_key=key
        )
        extra = {}
    TrainingDataPaths(
        stack, "Data", vpc=vpc, fsx_subnet=vpc.private_subnets[0], datasets_bucket=bucket, **extra
    )
    for role in ("DataJobRole", "DataMountpointRole"):
        assert decrypts(policy_statements(stack, role), THEIR_KEY), role


def test_without_its_key_a_kms_bucket_gets_no_decrypt() -> None:
    """Why the prop exists: a bucket imported by name alone says nothing of its key."""
    stack, vpc = stack_and_vpc()
    bucket = s3.Bucket.from_bucket_name(stack, "Datasets", "research-datasets")
    TrainingDataPaths(
        stack, "Data", vpc=vpc, fsx_subnet=vpc.private_subnets[0], datasets_bucket=bucket
    )
    assert not decrypts(policy_statements(stack, "DataJobRole"), THEIR_KEY)


@pytest.mark.parametrize("kind", ["datasets", "checkpoints"])
def test_a_bucket_key_needs_your_bucket(kind: str) -> None:
    stack, vpc = stack_and_vpc()
    key = kms.Key.from_key_arn(stack, "TheirKey", THEIR_KEY)
    with pytest.raises(
        ValueError,
        match=rf"^{kind}_key is the key of your {kind}_bucket; without {kind}_bucket the "
        r"construct's own bucket uses encryption_key$",
    ):
        TrainingDataPaths(
            stack, "Data", vpc=vpc, fsx_subnet=vpc.private_subnets[0], **{f"{kind}_key": key}
        )


def test_jobs_read_and_write_a_kms_checkpoints_bucket_of_yours() -> None:
    """S3 needs kms:GenerateDataKey to write an SSE-KMS object and kms:Decrypt to read one."""
    stack, vpc = stack_and_vpc()
    key = kms.Key.from_key_arn(stack, "CheckpointsKey", THEIR_KEY)
    bucket = s3.Bucket.from_bucket_name(stack, "Checkpoints", "research-checkpoints")
    TrainingDataPaths(
        stack,
        "Data",
        vpc=vpc,
        fsx_subnet=vpc.private_subnets[0],
        checkpoints_bucket=bucket,
        checkpoints_key=key,
    )
    on_key = [
        action
        for s in policy_statements(stack, "DataJobRole")
        if s["Resource"] == THEIR_KEY and s["Effect"] == "Allow"
        for action in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    ]
    assert sorted(on_key) == ["kms:Decrypt", "kms:GenerateDataKey*"]
    assert not decrypts(policy_statements(stack, "DataMountpointRole"), THEIR_KEY)


def rules_between(stack: cdk.Stack, kind: str, group_id: str, peer_id: str) -> set[tuple[int, int]]:
    """(from, to) ports of the ``kind`` rules on ``group_id`` naming ``peer_id``."""
    peer_key = "SourceSecurityGroupId" if kind == "Ingress" else "DestinationSecurityGroupId"
    found = set()
    for r in resources(stack, f"AWS::EC2::SecurityGroup{kind}").values():
        props = r["Properties"]
        if (
            props["GroupId"] == {"Fn::GetAtt": [group_id, "GroupId"]}
            and props[peer_key] == {"Fn::GetAtt": [peer_id, "GroupId"]}
            and props["IpProtocol"] == "tcp"
        ):
            found.add((props["FromPort"], props["ToPort"]))
    return found


def test_fsx_access_from_a_node_group_is_one_call() -> None:
    """TCP 988 and 1018-1023 both ways between the file system and the node group's group,
    the ports FSx for Lustre's user guide names for Lustre clients."""
    stack, vpc = stack_and_vpc()
    cluster = eks.Cluster.from_cluster_attributes(
        stack, "Cluster", cluster_name="research", vpc=vpc, cluster_security_group_id="sg-0123"
    )
    nodes = TrainiumNodeGroup(stack, "Trn", cluster=cluster, subnet=vpc.private_subnets[0])
    paths = TrainingDataPaths(stack, "Data", vpc=vpc, fsx_subnet=vpc.private_subnets[0])
    fsx_group = stack.resolve(paths.lustre_security_group.security_group_id)["Fn::GetAtt"][0]
    node_group = stack.resolve(nodes.efa_security_group.security_group_id)["Fn::GetAtt"][0]
    paths.allow_mount_from(nodes)

    lustre = {(988, 988), (1018, 1023)}
    assert rules_between(stack, "Ingress", fsx_group, node_group) == lustre
    assert rules_between(stack, "Egress", fsx_group, node_group) == lustre
    assert rules_between(stack, "Ingress", node_group, fsx_group) == lustre
    assert rules_between(stack, "Egress", node_group, fsx_group) == lustre
    assert paths.connections.default_port is not None
    assert stack.resolve(paths.connections.default_port.to_rule_json())["fromPort"] == 988


def test_an_efa_file_system_refuses_a_cidr_client() -> None:
    stack, vpc = stack_and_vpc()
    paths = TrainingDataPaths(
        stack,
        "Data",
        vpc=vpc,
        fsx_subnet=vpc.private_subnets[0],
        efa_fsx=True,
        fsx_storage_gib=4800,
        fsx_throughput_per_tib=1000,
    )
    with pytest.raises(ValueError, match=r"allow_mount_from: .*efa_fsx .*no CIDR rules"):
        paths.allow_mount_from(ec2.Peer.ipv4("10.0.0.0/16"))
