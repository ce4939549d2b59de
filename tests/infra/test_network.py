import ipaddress
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

import aws_cdk as cdk
import boto3
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Template
from moto import mock_aws

from constructs_lib import DEFAULT_INTERFACE_ENDPOINTS, TrainingNetwork
from constructs_lib.network import NATIVE_RESERVATION_REGIONS, ZONE_MARKER_NAME
from platform_config.parse import DEFAULT_REGION
from tests.conftest import Synth, construct_app


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


def trn_subnet(synth: Synth) -> tuple[str, dict[str, Any]]:
    """The trn AZ's private subnet: logical id and properties."""
    ((logical_id, props),) = [
        (i, r["Properties"])
        for i, r in synth.resources("network", "AWS::EC2::Subnet").items()
        if r["Properties"]["AvailabilityZone"] == "us-east-2a"
        and {"Key": "aws-cdk:subnet-type", "Value": "Private"} in r["Properties"]["Tags"]
    ]
    return logical_id, props


def sdk_call(resource: dict[str, Any], phase: str, subnet_id: str) -> dict[str, Any]:
    """An AwsCustomResource call as the template renders it, the subnet's Ref filled in."""
    value = resource["Properties"][phase]
    parts = value["Fn::Join"][1] if isinstance(value, dict) else [value]
    call: dict[str, Any] = json.loads(
        "".join(p if isinstance(p, str) else subnet_id for p in parts)
    )
    return call


def test_trn_subnet_keeps_a_prefix_reservation(dev: Synth) -> None:
    """us-east-2's CloudFormation has no AWS::EC2::SubnetCidrReservation: the network makes the
    reservation with EC2's own calls at deploy time."""
    assert not dev.resources("network", "AWS::EC2::SubnetCidrReservation")
    (resource,) = dev.resources("network", "Custom::AWS").values()
    subnet_id, subnet = trn_subnet(dev)
    create = sdk_call(resource, "Create", "SUBNET")
    assert (create["service"], create["action"]) == ("EC2", "CreateSubnetCidrReservation")
    params = create["parameters"]
    assert params["ReservationType"] == "prefix" and params["SubnetId"] == "SUBNET"
    assert ipaddress.ip_network(params["Cidr"]).subnet_of(ipaddress.ip_network(subnet["CidrBlock"]))
    assert ipaddress.ip_network(params["Cidr"]).prefixlen == 20
    # Fixed once deployed (TrainingNetwork's prefix_reservation_mask): another block or
    # description would replace the reservation with one that overlaps it, which EC2 refuses.
    last = list(ipaddress.ip_network(subnet["CidrBlock"]).subnets(new_prefix=20))[-1]
    assert params["Cidr"] == str(last)
    assert params["Description"] == (
        "Contiguous /28 prefixes for VPC CNI prefix delegation on trn nodes"
    )
    assert {"Ref": subnet_id} in resource["Properties"]["Create"]["Fn::Join"][1]
    assert sdk_call(resource, "Update", "SUBNET") == create
    delete = sdk_call(resource, "Delete", "SUBNET")
    assert delete["action"] == "DeleteSubnetCidrReservation"
    # The function may make and delete reservations, nothing else.
    (policy,) = [
        p["Properties"]["PolicyDocument"]["Statement"]
        for i, p in dev.resources("network", "AWS::IAM::Policy").items()
        if "TrnPrefixReservation" in i
    ]
    assert policy == [
        {
            "Action": ["ec2:CreateSubnetCidrReservation", "ec2:DeleteSubnetCidrReservation"],
            "Effect": "Allow",
            "Resource": "*",
        }
    ]


def test_the_reservation_calls_work_against_ec2(
    dev: Synth, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The template's calls, made with boto3 (parameters checked against EC2's API model) on
    moto's EC2: the reservation appears with its block, and the delete call removes it."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    (resource,) = dev.resources("network", "Custom::AWS").values()
    with mock_aws():
        client = boto3.client("ec2", region_name="us-east-2")
        vpc = client.create_vpc(CidrBlock="10.64.0.0/16")["Vpc"]["VpcId"]
        cidr = trn_subnet(dev)[1]["CidrBlock"]
        subnet = client.create_subnet(VpcId=vpc, CidrBlock=cidr)["Subnet"]["SubnetId"]
        create = sdk_call(resource, "Create", subnet)
        response = client.create_subnet_cidr_reservation(**create["parameters"])
        reservation_id = response
        for key in create["physicalResourceId"]["responsePath"].split("."):
            reservation_id = reservation_id[key]
        (held,) = client.get_subnet_cidr_reservations(SubnetId=subnet)["SubnetIpv4CidrReservations"]
        assert (held["Cidr"], held["ReservationType"]) == (
            create["parameters"]["Cidr"],
            "prefix",
        )
        delete = sdk_call(resource, "Delete", subnet)
        params = {
            k: reservation_id if v == "PHYSICAL:RESOURCEID:" else v
            for k, v in delete["parameters"].items()
        }
        client.delete_subnet_cidr_reservation(**params)
        assert not client.get_subnet_cidr_reservations(SubnetId=subnet)[
            "SubnetIpv4CidrReservations"
        ]


@pytest.mark.parametrize("region", sorted(NATIVE_RESERVATION_REGIONS))
def test_where_cloudformation_has_the_type_the_reservation_is_a_resource(region: str) -> None:
    built = network(
        region=region,
        trn_availability_zone=f"{region}a",
        availability_zones=[f"{region}a", f"{region}b"],
    )
    template = Template.from_stack(cdk.Stack.of(built)).to_json()
    types = {r["Type"] for r in template["Resources"].values()}
    assert "AWS::EC2::SubnetCidrReservation" in types
    assert "Custom::AWS" not in types


def test_native_reservations_only_where_cloudformation_offers_the_type() -> None:
    """The regional schemas of the pinned cfn-lint (CloudFormation's own) list the type in every
    region of the list; the default region (which lacks it in cfn-lint 1.58) uses the calls."""
    providers = resources.files("cfnlint") / "data" / "schemas" / "providers"
    offered = {
        path.name.removesuffix(".json")
        for path in providers.iterdir()
        if path.name.endswith(".json")
        and "AWS::EC2::SubnetCidrReservation" in json.loads(path.read_text())
    }
    assert offered >= NATIVE_RESERVATION_REGIONS
    assert DEFAULT_REGION not in NATIVE_RESERVATION_REGIONS


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


def network(region: str = "us-east-2", **overrides: Any) -> TrainingNetwork:
    stack = cdk.Stack(
        construct_app(), "S", env=cdk.Environment(account="123456789012", region=region)
    )
    props: dict[str, Any] = {
        "trn_availability_zone": "us-east-2a",
        "availability_zones": ["us-east-2a", "us-east-2b"],
        **overrides,
    }
    return TrainingNetwork(stack, "N", **props)


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


def reservation_of(template: dict[str, Any]) -> tuple[str, str]:
    """The reserved block and the logical id of its subnet, made as a resource or by a call."""
    for resource in template.values():
        if resource["Type"] == "AWS::EC2::SubnetCidrReservation":
            props = resource["Properties"]
            return props["Cidr"], props["SubnetId"]["Ref"]
    (call,) = [r for r in template.values() if r["Type"] == "Custom::AWS"]
    (subnet,) = [p["Ref"] for p in call["Properties"]["Create"]["Fn::Join"][1] if "Ref" in p]
    return sdk_call(call, "Create", "SUBNET")["parameters"]["Cidr"], subnet


@pytest.mark.parametrize("region", ["us-east-2", "us-west-2"])
def test_trn_az_need_not_be_the_first(region: str) -> None:
    """The trn subnet, its prefix reservation and the subnet the platform's FSx and trn nodes
    use follow the trn AZ wherever it sits in the list, however the reservation is made."""
    built = network(
        region=region,
        trn_availability_zone=f"{region}b",
        availability_zones=[f"{region}a", f"{region}b"],
    )
    assert built.trn_subnet.availability_zone == f"{region}b"
    template = cdk.assertions.Template.from_stack(cdk.Stack.of(built)).to_json()["Resources"]
    cidr, subnet_id = reservation_of(template)
    subnet = template[subnet_id]["Properties"]
    assert subnet["AvailabilityZone"] == f"{region}b"
    assert {"Key": "aws-cdk:subnet-type", "Value": "Private"} in subnet["Tags"]
    assert ipaddress.ip_network(cidr).subnet_of(ipaddress.ip_network(subnet["CidrBlock"]))


def own_vpc(stack: cdk.Stack, zones: list[str]) -> ec2.Vpc:
    return ec2.Vpc(stack, "Theirs", availability_zones=zones, nat_gateways=1)


def test_bring_your_own_vpc_selects_the_trn_az_subnet() -> None:
    stack = cdk.Stack(
        construct_app(), "S", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    vpc = own_vpc(stack, ["us-east-2a", "us-east-2b", "us-east-2c"])
    built = TrainingNetwork(stack, "N", trn_availability_zone="us-east-2b", vpc=vpc)
    assert built.vpc is vpc
    assert built.trn_subnet.availability_zone == "us-east-2b"
    assert built.trn_subnet.node.path in [s.node.path for s in vpc.private_subnets]
    assert built.flow_log_group is None and built.endpoint_security_group is None


def test_bring_your_own_vpc_without_a_private_subnet_in_the_trn_az() -> None:
    stack = cdk.Stack(
        construct_app(), "S", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    vpc = own_vpc(stack, ["us-east-2a", "us-east-2b"])
    message = (
        r"trn_availability_zone 'us-east-2c' has no private subnet in the given vpc; its "
        r"private subnets are in \['us-east-2a', 'us-east-2b'\]"
    )
    with pytest.raises(ValueError, match=message):
        TrainingNetwork(stack, "N", trn_availability_zone="us-east-2c", vpc=vpc)


def test_a_deployed_networks_zones_do_not_move(
    dev: Synth, synth_variant: Callable[[str], Synth]
) -> None:
    """The same environment with its trn zone in us-east-2b (the UltraServer variant): each
    subnet keeps its logical id and block in another zone, so CloudFormation would replace it
    with a subnet of the same block, which collides. The zone marker, which every subnet waits
    for, keeps its name and gets a new description: a custom-named replacement CloudFormation
    refuses, before any subnet is touched, naming the group and with it the way."""
    moved = synth_variant("ultraserver")

    def layout(synth: Synth) -> dict[str, tuple[str, str]]:
        return {
            i: (r["Properties"]["AvailabilityZone"], r["Properties"]["CidrBlock"])
            for i, r in synth.resources("network", "AWS::EC2::Subnet").items()
        }

    before, after = layout(dev), layout(moved)
    assert before.keys() == after.keys()
    assert {i: b for i, (_, b) in before.items()} == {i: b for i, (_, b) in after.items()}
    assert any(before[i][0] != after[i][0] for i in before)

    def marker(synth: Synth) -> tuple[str, dict[str, Any]]:
        ((logical_id, group),) = [
            (i, r["Properties"])
            for i, r in synth.resources("network", "AWS::EC2::SecurityGroup").items()
            if "ZoneMarker" in i
        ]
        return logical_id, group

    marker_id, was = marker(dev)
    _, now = marker(moved)
    assert was["GroupName"] == now["GroupName"] == ZONE_MARKER_NAME
    assert "see docs/deploying.md, Moving the trn zone" in ZONE_MARKER_NAME
    assert was["GroupDescription"].startswith("Zones of this VPC: trn us-east-2a, all ")
    assert now["GroupDescription"].startswith("Zones of this VPC: trn us-east-2b, all ")
    schemas = resources.files("cfnlint") / "data" / "schemas"
    providers = json.loads((schemas / "providers" / "us-east-2.json").read_text())
    schema = json.loads(
        (schemas / "resources" / f"{providers['AWS::EC2::SecurityGroup']}.json").read_text()
    )
    assert {"/properties/GroupName", "/properties/GroupDescription"} <= set(
        schema["createOnlyProperties"]
    )
    for logical_id, subnet in moved.resources("network", "AWS::EC2::Subnet").items():
        assert marker_id in subnet.get("DependsOn", []), logical_id
