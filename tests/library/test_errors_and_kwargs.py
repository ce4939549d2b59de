"""Mistakes with imported resources fail in our words, naming the prop; every public construct
takes its props as typed keyword arguments, as aws-cdk-lib's do (tests/library/test_typed_props.py
for what mypy sees)."""

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks

from constructs_lib import (
    GpuNodeGroup,
    TrainingDataPaths,
    TrainingNetwork,
    TrainiumNodeGroup,
)
from tests.conftest import construct_app


def stack_and_vpc() -> tuple[cdk.Stack, ec2.Vpc]:
    stack = cdk.Stack(
        construct_app(), "Theirs", env=cdk.Environment(account="210987654321", region="us-west-2")
    )
    return stack, ec2.Vpc(stack, "Vpc", availability_zones=["us-west-2a", "us-west-2b"])


def test_a_cluster_imported_without_vpc_names_the_prop() -> None:
    stack, vpc = stack_and_vpc()
    cluster = eks.Cluster.from_cluster_attributes(
        stack, "Cluster", cluster_name="research", cluster_security_group_id="sg-0123"
    )
    with pytest.raises(ValueError, match=r"cluster 'Theirs/Cluster' was imported without vpc"):
        TrainiumNodeGroup(stack, "Trn", cluster=cluster, subnet=vpc.private_subnets[0])


def test_a_cluster_imported_without_its_security_group_names_the_prop() -> None:
    stack, vpc = stack_and_vpc()
    cluster = eks.Cluster.from_cluster_attributes(stack, "Cluster", cluster_name="c", vpc=vpc)
    with pytest.raises(ValueError, match=r"imported without cluster_security_group_id"):
        GpuNodeGroup(stack, "Gpu", cluster=cluster, subnet=vpc.private_subnets[0])


def test_a_public_subnet_for_the_node_group_is_refused() -> None:
    stack, vpc = stack_and_vpc()
    cluster = eks.Cluster.from_cluster_attributes(
        stack, "Cluster", cluster_name="c", vpc=vpc, cluster_security_group_id="sg-0123"
    )
    with pytest.raises(ValueError, match=r"subnet 'Theirs/Vpc/PublicSubnet1' is a public subnet"):
        TrainiumNodeGroup(stack, "Trn", cluster=cluster, subnet=vpc.public_subnets[0])


def test_a_vpc_imported_without_cidr_names_the_prop() -> None:
    stack, _ = stack_and_vpc()
    vpc = ec2.Vpc.from_vpc_attributes(
        stack,
        "Imported",
        vpc_id="vpc-0123456789abcdef0",
        availability_zones=["us-west-2a", "us-west-2b"],
        private_subnet_ids=["subnet-0a", "subnet-0b"],
    )
    with pytest.raises(ValueError, match=r"vpc 'Theirs/Imported' was imported without its CIDR"):
        TrainingNetwork(stack, "Net", trn_availability_zone="us-west-2b", vpc=vpc)


def test_trn_subnet_is_the_subnet_and_trn_subnet_selection_the_selection() -> None:
    stack, vpc = stack_and_vpc()
    network = TrainingNetwork(stack, "Net", trn_availability_zone="us-west-2b", vpc=vpc)
    assert network.trn_subnet.availability_zone == "us-west-2b"
    assert network.trn_subnet_selection.availability_zones == ["us-west-2b"]
    assert not hasattr(network, "trn_subnets")


def test_the_construct_keeps_its_keyword_arguments_as_its_props() -> None:
    stack, vpc = stack_and_vpc()
    data = TrainingDataPaths(stack, "Data", vpc=vpc, fsx_subnet=vpc.private_subnets[0])
    assert data.props.vpc is vpc
    assert data.props.fsx_subnet.node.path == vpc.private_subnets[0].node.path
    assert (data.props.fsx_storage_gib, data.props.datasets_bucket) == (1200, None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"vpc": None, "fsx_subnet": None, "colour": "red"},
            r"unexpected keyword argument 'colour'",
        ),
        ({"vpc": None}, r"missing 1 required keyword-only argument: 'fsx_subnet'"),
    ],
)
def test_keyword_mistakes_name_the_keyword(kwargs: dict[str, object], message: str) -> None:
    stack, _ = stack_and_vpc()
    with pytest.raises(TypeError, match=message):
        TrainingDataPaths(stack, "Data", **kwargs)
