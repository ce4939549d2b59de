"""A subnet outside the trn AZ is refused, naming the prop, wherever its AZ is known at synth."""

from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks

from constructs_lib import GpuNodeGroup, TrainingDataPaths, TrainiumNodeGroup
from tests.conftest import construct_app

ZONES = ["us-east-2a", "us-east-2b"]


def setup() -> tuple[cdk.Stack, ec2.Vpc, Any]:
    stack = cdk.Stack(
        construct_app(), "S", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    vpc = ec2.Vpc(stack, "Vpc", availability_zones=ZONES, nat_gateways=1)
    cluster = eks.Cluster.from_cluster_attributes(
        stack, "Cluster", cluster_name="c", vpc=vpc, cluster_security_group_id="sg-0123"
    )
    return stack, vpc, cluster


def in_zone(stack: cdk.Stack, zone: str | None) -> ec2.ISubnet:
    if zone is None:
        return ec2.Subnet.from_subnet_id(stack, "Theirs", "subnet-0123456789abcdef0")
    return ec2.Subnet.from_subnet_attributes(
        stack, "Theirs", subnet_id="subnet-0123456789abcdef0", availability_zone=zone
    )


@pytest.mark.parametrize("group_class", [TrainiumNodeGroup, GpuNodeGroup])
def test_a_node_group_subnet_of_another_zone_is_refused(
    group_class: type[TrainiumNodeGroup],
) -> None:
    stack, vpc, cluster = setup()
    with pytest.raises(
        ValueError,
        match=r"subnet 'S/Vpc/PrivateSubnet1' is in 'us-east-2a', not in "
        r"trn_availability_zone 'us-east-2b'",
    ):
        group_class(
            stack,
            "Trn",
            cluster=cluster,
            subnet=vpc.private_subnets[0],
            trn_availability_zone="us-east-2b",
        )


def test_an_imported_subnet_with_its_zone_is_checked() -> None:
    stack, _, cluster = setup()
    with pytest.raises(ValueError, match=r"subnet 'S/Theirs' is in 'us-east-2a', not in"):
        TrainiumNodeGroup(
            stack,
            "Trn",
            cluster=cluster,
            subnet=in_zone(stack, "us-east-2a"),
            trn_availability_zone="us-east-2b",
        )


@pytest.mark.parametrize(
    ("zone", "trn_zone"), [("us-east-2b", "us-east-2b"), (None, "us-east-2b"), ("us-east-2a", None)]
)
def test_a_subnet_in_the_zone_or_of_unknown_zone_is_taken(
    zone: str | None, trn_zone: str | None
) -> None:
    stack, _, cluster = setup()
    group = TrainiumNodeGroup(
        stack, "Trn", cluster=cluster, subnet=in_zone(stack, zone), trn_availability_zone=trn_zone
    )
    assert group.nodegroup_name


def test_an_fsx_subnet_of_another_zone_is_refused() -> None:
    stack, vpc, _ = setup()
    with pytest.raises(
        ValueError,
        match=r"fsx_subnet 'S/Vpc/PrivateSubnet2' is in 'us-east-2b', not in "
        r"trn_availability_zone 'us-east-2a'",
    ):
        TrainingDataPaths(
            stack,
            "Data",
            vpc=vpc,
            fsx_subnet=vpc.private_subnets[1],
            trn_availability_zone="us-east-2a",
        )


def test_mounting_from_a_node_group_of_another_zone_is_refused() -> None:
    stack, vpc, cluster = setup()
    nodes = TrainiumNodeGroup(stack, "Trn", cluster=cluster, subnet=vpc.private_subnets[0])
    data = TrainingDataPaths(stack, "Data", vpc=vpc, fsx_subnet=vpc.private_subnets[1])
    with pytest.raises(
        ValueError,
        match=r"allow_mount_from: node group 'S/Trn' is in 'us-east-2a' and fsx_subnet in "
        r"'us-east-2b'",
    ):
        data.allow_mount_from(nodes)
