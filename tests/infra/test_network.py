import ipaddress
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2

from constructs_lib import DEFAULT_INTERFACE_ENDPOINTS, TrainingNetwork, TrainingNetworkProps
from tests.conftest import Synth


def subnets(synth: Synth, kind: str) -> list[dict[str, Any]]:
    return [
        r["Properties"]
        for r in synth.resources("network", "AWS::EC2::Subnet").values()
        if any(t == {"Key": "aws-cdk:subnet-type", "Value": kind} for t in r["Properties"]["Tags"])
    ]


def test_vpc_spans_the_trn_az_and_the_profile_count(dev: Synth, prod: Synth) -> None:
    for synth, count in ((dev, 2), (prod, 3)):
        zones = [s["AvailabilityZone"] for s in subnets(synth, "Private")]
        assert len(zones) == count and "us-east-2a" in zones
        assert len(set(zones)) == count


def test_private_subnets_are_sized_for_prefix_delegation(dev: Synth) -> None:
    for subnet in subnets(dev, "Private"):
        assert ipaddress.ip_network(subnet["CidrBlock"]).prefixlen == 18
        assert subnet["MapPublicIpOnLaunch"] is False


def test_trn_subnet_keeps_a_prefix_reservation(dev: Synth) -> None:
    (reservation,) = dev.resources("network", "AWS::EC2::SubnetCidrReservation").values()
    props = reservation["Properties"]
    assert props["ReservationType"] == "prefix"
    (trn_subnet,) = [s for s in subnets(dev, "Private") if s["AvailabilityZone"] == "us-east-2a"]
    assert ipaddress.ip_network(props["Cidr"]).subnet_of(
        ipaddress.ip_network(trn_subnet["CidrBlock"])
    )
    subnet_ids = [
        logical_id
        for logical_id, r in dev.resources("network", "AWS::EC2::Subnet").items()
        if r["Properties"]["CidrBlock"] == trn_subnet["CidrBlock"]
    ]
    assert props["SubnetId"] == {"Ref": subnet_ids[0]}


def test_nat_per_profile(dev: Synth, prod: Synth) -> None:
    assert len(dev.resources("network", "AWS::EC2::NatGateway")) == 1
    assert len(prod.resources("network", "AWS::EC2::NatGateway")) == 3


def test_endpoints(dev: Synth) -> None:
    endpoints = dev.resources("network", "AWS::EC2::VPCEndpoint")
    kinds = [r["Properties"].get("VpcEndpointType") for r in endpoints.values()]
    assert kinds.count("Gateway") == 1 and kinds.count("Interface") == len(
        DEFAULT_INTERFACE_ENDPOINTS
    )
    names = str([r["Properties"]["ServiceName"] for r in endpoints.values()])
    for service in (
        ".s3",
        ".ecr.api",
        ".ecr.dkr",
        ".sts",
        ".eks-auth",
        ".eks",
        ".ec2",
        ".logs",
        ".ssm",
        ".ssmmessages",
    ):
        assert f"{service}'" in names, service
    for r in endpoints.values():
        if r["Properties"].get("VpcEndpointType") == "Interface":
            assert r["Properties"]["PrivateDnsEnabled"] is True


def test_endpoint_group_allows_https_from_the_vpc_only(dev: Synth) -> None:
    groups = dev.resources("network", "AWS::EC2::SecurityGroup")
    (group,) = [
        g for g in groups.values() if "Interface endpoints" in g["Properties"]["GroupDescription"]
    ]
    assert group["Properties"]["SecurityGroupIngress"] == [
        {
            "CidrIp": "10.64.0.0/16",
            "Description": "HTTPS from the VPC",
            "FromPort": 443,
            "IpProtocol": "tcp",
            "ToPort": 443,
        }
    ]
    assert group["Properties"]["SecurityGroupEgress"][0]["CidrIp"] == "255.255.255.255/32"


def test_flow_logs_capture_all_traffic_into_an_encrypted_group(dev: Synth, prod: Synth) -> None:
    (flow_log,) = dev.resources("network", "AWS::EC2::FlowLog").values()
    assert flow_log["Properties"]["TrafficType"] == "ALL"
    assert flow_log["Properties"]["ResourceType"] == "VPC"
    for synth, days in ((dev, 30), (prod, 365)):
        (group,) = synth.resources("network", "AWS::Logs::LogGroup").values()
        assert group["Properties"]["RetentionInDays"] == days
        assert "KmsKeyId" in group["Properties"]
    (key,) = dev.resources("network", "AWS::KMS::Key").values()
    assert key["Properties"]["EnableKeyRotation"] is True


def test_default_security_group_is_stripped(dev: Synth) -> None:
    assert dev.resources("network", "Custom::VpcRestrictDefaultSG")


def test_prod_retains_the_flow_logs(dev: Synth, prod: Synth) -> None:
    (dev_group,) = dev.resources("network", "AWS::Logs::LogGroup").values()
    (prod_group,) = prod.resources("network", "AWS::Logs::LogGroup").values()
    assert dev_group["DeletionPolicy"] == "Delete"
    assert prod_group["DeletionPolicy"] == "Retain"


def network(**overrides: Any) -> TrainingNetwork:
    stack = cdk.Stack(
        cdk.App(), "S", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    props: dict[str, Any] = {
        "trn_availability_zone": "us-east-2a",
        "availability_zones": ["us-east-2a", "us-east-2b"],
        **overrides,
    }
    return TrainingNetwork(stack, "N", props=TrainingNetworkProps(**props))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"availability_zones": ["us-east-2a"]},
            r"availability_zones \['us-east-2a'\] must name at least two",
        ),
        ({"availability_zones": ["us-east-2a", "us-east-2a"]}, r"at least two distinct"),
        (
            {"trn_availability_zone": "us-east-2c"},
            r"trn_availability_zone 'us-east-2c' must be one of",
        ),
        ({"cidr": "10.64.0.0/33"}, r"cidr '10.64.0.0/33' is not an IPv4 network"),
        (
            {"cidr": "10.64.0.0/24"},
            r"cidr '10.64.0.0/24' must have a prefix length from /16 to /20",
        ),
        ({"private_subnet_mask": 16}, r"private_subnet_mask 16 does not fit 2 private"),
        ({"prefix_reservation_mask": 29}, r"prefix_reservation_mask 29 must lie between"),
        ({"nat_gateways": 3}, r"nat_gateways 3 must be from 0 to the number of AZs \(2\)"),
        (
            {"interface_endpoints": ["ecr.api", "sagemaker"]},
            r"interface_endpoints \['sagemaker'\] are unknown",
        ),
        (
            {"flow_log_retention_days": 31},
            r"flow_log_retention_days 31 is not a supported log retention",
        ),
    ],
)
def test_construct_rejects_bad_props(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        network(**overrides)


def test_construct_exposes_the_trn_subnet() -> None:
    built = network()
    assert isinstance(built.vpc, ec2.Vpc)
    assert built.trn_subnet.availability_zone == "us-east-2a"
    assert built.cidr == "10.64.0.0/16"


def test_trn_az_need_not_be_the_first() -> None:
    """The trn subnet, its prefix reservation and the subnet the platform's FSx and trn nodes
    use follow the trn AZ wherever it sits in the list."""
    built = network(
        trn_availability_zone="us-east-2b", availability_zones=["us-east-2a", "us-east-2b"]
    )
    assert built.trn_subnet.availability_zone == "us-east-2b"
    template = cdk.assertions.Template.from_stack(cdk.Stack.of(built)).to_json()["Resources"]
    (reservation,) = [
        r["Properties"] for r in template.values() if r["Type"] == "AWS::EC2::SubnetCidrReservation"
    ]
    subnet = template[reservation["SubnetId"]["Ref"]]["Properties"]
    assert subnet["AvailabilityZone"] == "us-east-2b"
    assert {"Key": "aws-cdk:subnet-type", "Value": "Private"} in subnet["Tags"]
    assert ipaddress.ip_network(reservation["Cidr"]).subnet_of(
        ipaddress.ip_network(subnet["CidrBlock"])
    )


def own_vpc(stack: cdk.Stack, zones: list[str]) -> ec2.Vpc:
    return ec2.Vpc(stack, "Theirs", availability_zones=zones, nat_gateways=1)


def test_bring_your_own_vpc_selects_the_trn_az_subnet() -> None:
    stack = cdk.Stack(
        cdk.App(), "S", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    vpc = own_vpc(stack, ["us-east-2a", "us-east-2b", "us-east-2c"])
    built = TrainingNetwork(
        stack, "N", props=TrainingNetworkProps(trn_availability_zone="us-east-2b", vpc=vpc)
    )
    assert built.vpc is vpc
    assert built.trn_subnet.availability_zone == "us-east-2b"
    assert built.trn_subnet.node.path in [s.node.path for s in vpc.private_subnets]
    assert built.flow_log_group is None and built.endpoint_security_group is None


def test_bring_your_own_vpc_without_a_private_subnet_in_the_trn_az() -> None:
    stack = cdk.Stack(
        cdk.App(), "S", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    vpc = own_vpc(stack, ["us-east-2a", "us-east-2b"])
    message = (
        r"trn_availability_zone 'us-east-2c' has no private subnet in the given vpc; its "
        r"private subnets are in \['us-east-2a', 'us-east-2b'\]"
    )
    with pytest.raises(ValueError, match=message):
        TrainingNetwork(
            stack, "N", props=TrainingNetworkProps(trn_availability_zone="us-east-2c", vpc=vpc)
        )
