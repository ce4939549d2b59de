import itertools
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template

import trn_catalog
from constructs_lib import TrainiumNodeGroup
from constructs_lib.trainium_nodegroup import REPLACING_PROPERTIES
from tests.conftest import construct_app
from tests.template_parts import launch_data, nodegroup, of_type, scaling

RESERVATION = "cr-0123456789abcdef0"
TYPES = ("trn3.48xlarge", "trn2.48xlarge", "trn1.32xlarge")
MODES = ("on-demand", "capacity-block", "odcr")


Tweak = Callable[[cdk.Stack, ec2.Vpc], dict[str, Any]]


def build(tweak: Tweak | None = None, **overrides: Any) -> tuple[TrainiumNodeGroup, dict[str, Any]]:
    """A node group in a stack of its own; ``tweak`` adds props made in that stack."""
    stack = cdk.Stack(
        construct_app(), "Nodes", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=1)
    cluster = eks.Cluster.from_cluster_attributes(
        stack, "Cluster", cluster_name="c", vpc=vpc, cluster_security_group_id="sg-0123"
    )
    props: dict[str, Any] = {"cluster": cluster, "subnet": vpc.private_subnets[0], **overrides}
    props.update(tweak(stack, vpc) if tweak else {})
    if props.get("capacity", "on-demand") != "on-demand":
        props.setdefault("capacity_reservation_id", RESERVATION)
    group = TrainiumNodeGroup(stack, "Trn", **props)
    return group, Template.from_stack(stack).to_json()


@pytest.fixture(scope="module")
def variants() -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (instance_type, mode): build(instance_type=instance_type, capacity=mode)[1]
        for instance_type, mode in itertools.product(TYPES, MODES)
    }


@pytest.mark.parametrize(("instance_type", "mode"), list(itertools.product(TYPES, MODES)))
def test_one_efa_interface_per_network_card_from_the_catalog(
    variants: dict[tuple[str, str], dict[str, Any]], instance_type: str, mode: str
) -> None:
    interfaces = launch_data(variants[instance_type, mode])["NetworkInterfaces"]
    expected = trn_catalog.get(instance_type).efa_interfaces
    assert len(interfaces) == expected
    assert sorted(i["NetworkCardIndex"] for i in interfaces) == list(range(expected))
    (primary,) = [i for i in interfaces if i["NetworkCardIndex"] == 0]
    assert (primary["DeviceIndex"], primary["InterfaceType"]) == (0, "efa")
    others = [i for i in interfaces if i["NetworkCardIndex"] != 0]
    assert all(i["InterfaceType"] == "efa-only" and i["DeviceIndex"] == 0 for i in others)
    assert all(len(i["Groups"]) == 2 for i in interfaces)


def test_known_efa_counts(variants: dict[tuple[str, str], dict[str, Any]]) -> None:
    counts = {t: len(launch_data(variants[t, "on-demand"])["NetworkInterfaces"]) for t in TYPES}
    assert counts == {"trn3.48xlarge": 16, "trn2.48xlarge": 16, "trn1.32xlarge": 8}


@pytest.mark.parametrize(("instance_type", "mode"), list(itertools.product(TYPES, MODES)))
def test_launch_template_carries_type_imds_and_encrypted_root(
    variants: dict[tuple[str, str], dict[str, Any]], instance_type: str, mode: str
) -> None:
    data = launch_data(variants[instance_type, mode])
    assert data["InstanceType"] == instance_type
    assert data["MetadataOptions"] == {
        "HttpEndpoint": "enabled",
        "HttpTokens": "required",
        "HttpPutResponseHopLimit": 1,
    }
    (root,) = data["BlockDeviceMappings"]
    assert root["Ebs"]["VolumeType"] == "gp3" and root["Ebs"]["Encrypted"] is True
    assert root["Ebs"]["VolumeSize"] == 512
    assert "KeyName" not in data
    group = nodegroup(variants[instance_type, mode])
    assert group["AmiType"] == "AL2023_x86_64_NEURON"
    assert "InstanceTypes" not in group
    assert group["Taints"] == [
        {"Effect": "NO_SCHEDULE", "Key": "aws.amazon.com/neuron", "Value": "true"}
    ]
    assert group["NodeRepairConfig"] == {"Enabled": True}
    # Old nodes go before new ones launch: a reservation or placement group has no spare room.
    assert group["UpdateConfig"] == {"MaxUnavailable": 1, "UpdateStrategy": "MINIMAL"}
    assert len(group["Subnets"]) == 1
    assert "RemoteAccess" not in group


def test_instance_store_nvme_is_used_through_nodeadm(
    variants: dict[tuple[str, str], dict[str, Any]],
) -> None:
    user_data = launch_data(variants["trn2.48xlarge", "on-demand"])["UserData"]
    text = str(user_data)
    assert "localStorage" in text and "RAID0" in text and "application/node.eks.aws" in text


def test_placement_group_only_for_on_demand(
    variants: dict[tuple[str, str], dict[str, Any]],
) -> None:
    for (_, mode), template in variants.items():
        groups = of_type(template, "AWS::EC2::PlacementGroup")
        data = launch_data(template)
        if mode == "on-demand":
            assert [g["Properties"]["Strategy"] for g in groups] == ["cluster"]
            assert "Placement" in data
            assert "CapacityReservationSpecification" not in data
            assert nodegroup(template)["CapacityType"] == "ON_DEMAND"
        else:
            assert groups == [] and "Placement" not in data


def test_capacity_block(variants: dict[tuple[str, str], dict[str, Any]]) -> None:
    template = variants["trn3.48xlarge", "capacity-block"]
    data = launch_data(template)
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": RESERVATION}
    }
    group = nodegroup(template)
    assert group["CapacityType"] == "CAPACITY_BLOCK"
    assert scaling(template) == {"desiredSize": 2, "maxSize": 2, "minSize": 0}


def test_odcr(variants: dict[tuple[str, str], dict[str, Any]]) -> None:
    template = variants["trn2.48xlarge", "odcr"]
    data = launch_data(template)
    assert "InstanceMarketOptions" not in data
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationPreference": "capacity-reservations-only",
        "CapacityReservationTarget": {"CapacityReservationId": RESERVATION},
    }
    assert nodegroup(template)["CapacityType"] == "ON_DEMAND"


def test_efa_security_group_is_open_to_itself_only(
    variants: dict[tuple[str, str], dict[str, Any]],
) -> None:
    template = variants["trn3.48xlarge", "on-demand"]
    (ingress,) = of_type(template, "AWS::EC2::SecurityGroupIngress")
    (egress,) = of_type(template, "AWS::EC2::SecurityGroupEgress")
    assert ingress["Properties"]["IpProtocol"] == "-1"
    assert ingress["Properties"]["SourceSecurityGroupId"] == ingress["Properties"]["GroupId"]
    assert egress["Properties"]["IpProtocol"] == "-1"
    assert egress["Properties"]["DestinationSecurityGroupId"] == egress["Properties"]["GroupId"]
    (group,) = of_type(template, "AWS::EC2::SecurityGroup")
    assert "SecurityGroupIngress" not in group["Properties"]
    assert group["Properties"]["SecurityGroupEgress"][0]["CidrIp"] == "255.255.255.255/32"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"instance_type": "p5.48xlarge"}, r"instance_type: .*'p5\.48xlarge' is not in the"),
        ({"desired_size": 65}, r"max_size 65 is not allowed; use 1 to 64"),
        (
            {"capacity": "odcr", "capacity_reservation_id": "cr-1"},
            r"capacity_reservation_id 'cr-1'",
        ),
        ({"capacity_reservation_id": RESERVATION}, r"only used with capacity 'capacity-block'"),
        ({"capacity": "spot"}, r"capacity 'spot' is not allowed"),
        ({"root_volume_gib": 50}, r"root_volume_gib 50 is not allowed; use >= 100"),
        ({"name_prefix": "-trn"}, r"name_prefix '-trn' is not allowed; use 1 to 54 letters"),
        ({"name_prefix": "t" * 55}, r"name_prefix 't{55}' is not allowed"),
        ({"name_prefix": "trn.dev"}, r"name_prefix 'trn\.dev' is not allowed"),
    ],
)
def test_rejects_bad_props(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build(**overrides)


def name_of(tweak: Tweak | None = None, **overrides: Any) -> str:
    group, template = build(tweak, name_prefix="trn-dev-trn", **overrides)
    name: str = nodegroup(template)["NodegroupName"]
    assert cdk.Stack.of(group).resolve(group.nodegroup_name) == name
    return name


def test_replacing_properties_are_cloudformations_create_only_ones() -> None:
    """The digest covers what the resource schema (cfn-lint 1.58's copy of CloudFormation's)
    says replaces a node group."""
    schemas = resources.files("cfnlint") / "data" / "schemas"
    providers = json.loads((schemas / "providers" / "us-east-2.json").read_text())
    digest = providers["AWS::EKS::Nodegroup"]
    schema = json.loads((schemas / "resources" / f"{digest}.json").read_text())
    create_only = {p.removeprefix("/properties/") for p in schema["createOnlyProperties"]}
    assert create_only == {*REPLACING_PROPERTIES, "NodegroupName"}


@pytest.fixture(scope="module")
def base_names() -> dict[str, str]:
    """The names of an on-demand and a Capacity Block group, each built twice: the same."""
    names = {"on-demand": name_of(), "capacity-block": name_of(**CAPACITY_BLOCK)}
    assert names == {"on-demand": name_of(), "capacity-block": name_of(**CAPACITY_BLOCK)}
    return names


def other_subnet(stack: cdk.Stack, vpc: ec2.Vpc) -> dict[str, Any]:
    return {"subnet": vpc.private_subnets[1]}


def other_role(stack: cdk.Stack, vpc: ec2.Vpc) -> dict[str, Any]:
    return {"node_role": iam.Role.from_role_arn(stack, "Other", "arn:aws:iam::123456789012:role/o")}


@pytest.mark.parametrize(
    ("tweak", "overrides"),
    [
        (other_subnet, {}),
        (other_role, {}),
        (None, {"capacity": "capacity-block", "capacity_reservation_id": RESERVATION}),
    ],
    ids=["subnet", "node-role", "capacity-type"],
)
def test_a_replaced_node_group_gets_a_new_name(
    base_names: dict[str, str], tweak: Tweak | None, overrides: dict[str, Any]
) -> None:
    """CloudFormation cannot replace a resource whose custom name stays the same."""
    assert name_of(tweak, **overrides) != base_names["on-demand"]


@pytest.mark.parametrize("overrides", [{"desired_size": 4}, {"labels": {"a": "b"}}])
def test_a_size_or_label_change_keeps_the_group(
    base_names: dict[str, str], overrides: dict[str, Any]
) -> None:
    """The size goes through the group's Size call and labels through EKS's config update: the
    same group, its launch template version untouched."""
    assert name_of(**overrides) == base_names["on-demand"]


CAPACITY_BLOCK = {"capacity": "capacity-block", "capacity_reservation_id": RESERVATION}
ODCR = {"capacity": "odcr", "capacity_reservation_id": RESERVATION}


@pytest.mark.parametrize("mode", [{}, ODCR, CAPACITY_BLOCK], ids=["on-demand", "odcr", "block"])
@pytest.mark.parametrize(
    "overrides",
    [
        {"instance_type": "trn2.48xlarge"},
        {"root_volume_gib": 1024},
        {"lnc": 1},
    ],
)
def test_a_launch_template_change_makes_a_new_group(
    base_names: dict[str, str], mode: dict[str, str], overrides: dict[str, Any]
) -> None:
    """CloudFormation refuses a node group update that changes the launch template version
    together with any other property (aws/containers-roadmap#1258), so the version never changes
    in place: a new launch template makes a new group, in every capacity mode (and EKS updates
    a Capacity Block group only at desired size 0)."""
    base = name_of(**mode)
    assert name_of(**{**mode, **overrides}) != base


def test_a_new_capacity_block_makes_a_new_group(base_names: dict[str, str]) -> None:
    changed = {**CAPACITY_BLOCK, "capacity_reservation_id": "cr-0123456789abcdef9"}
    assert name_of(**changed) != base_names["capacity-block"]


def test_a_capacity_block_group_scales_in_place(base_names: dict[str, str]) -> None:
    assert name_of(**CAPACITY_BLOCK, desired_size=0) == base_names["capacity-block"]


def test_a_capacity_block_group_follows_the_stack_tags_of_its_instances(
    base_names: dict[str, str],
) -> None:
    def tagged(stack: cdk.Stack, vpc: ec2.Vpc) -> dict[str, Any]:
        cdk.Tags.of(stack).add("team", "nlp")
        return {}

    assert name_of(tagged, **CAPACITY_BLOCK) != base_names["capacity-block"]


def test_without_a_prefix_cloudformation_names_the_group() -> None:
    group, template = build()
    assert "NodegroupName" not in nodegroup(template)
    assert cdk.Stack.of(group).resolve(group.nodegroup_name) == {
        "Ref": next(
            k for k, r in template["Resources"].items() if r["Type"] == "AWS::EKS::Nodegroup"
        )
    }
