"""GpuNodeGroup: each GPU type's EFA layout from the GPU catalog, the NVIDIA AMI and taint, and
each capacity mode's placement or reservation targeting, in a bare stack per variant."""

from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk.assertions import Template

import trn_catalog
from constructs_lib import GpuNodeGroup
from tests.conftest import construct_app
from tests.template_parts import launch_data, nodegroup, of_type, scaling

RESERVATION = "cr-0123456789abcdef0"
TYPES = ("p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "g6e.48xlarge")
MODES = ("on-demand", "capacity-block", "odcr")
VARIANTS = [(t, "on-demand") for t in TYPES] + [(TYPES[2], m) for m in MODES[1:]]


def _stack() -> tuple[cdk.Stack, ec2.Vpc, eks.ICluster]:
    stack = cdk.Stack(
        construct_app(), "Gpu", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=1)
    cluster = eks.Cluster.from_cluster_attributes(
        stack, "Cluster", cluster_name="c", vpc=vpc, cluster_security_group_id="sg-0123"
    )
    return stack, vpc, cluster


def _props(vpc: ec2.Vpc, cluster: eks.ICluster, **overrides: Any) -> dict[str, Any]:
    props: dict[str, Any] = {"cluster": cluster, "subnet": vpc.private_subnets[0], **overrides}
    if props.get("capacity", "on-demand") != "on-demand":
        props.setdefault("capacity_reservation_id", RESERVATION)
    return props


def _own(template: dict[str, Any], group: GpuNodeGroup) -> dict[str, Any]:
    """The part of the shared template that ``group`` made (its resources' logical ids start
    with its construct id)."""
    prefix = group.node.id
    return {"Resources": {k: v for k, v in template["Resources"].items() if k.startswith(prefix)}}


@pytest.fixture(scope="module")
def synthesized() -> dict[str, tuple[GpuNodeGroup, dict[str, Any]]]:
    """Every variant as a node group of one bare stack, synthesized once."""
    stack, vpc, cluster = _stack()
    groups = {
        f"{instance_type}/{mode}": GpuNodeGroup(
            stack,
            f"G{index}",
            **_props(vpc, cluster, instance_type=instance_type, capacity=mode),
        )
        for index, (instance_type, mode) in enumerate(VARIANTS)
    }
    groups["named"] = GpuNodeGroup(stack, "Named", **_props(vpc, cluster, name_prefix="x-gpu"))
    template = Template.from_stack(stack).to_json()
    return {key: (group, _own(template, group)) for key, group in groups.items()}


@pytest.fixture(scope="module")
def variants(
    synthesized: dict[str, tuple[GpuNodeGroup, dict[str, Any]]],
) -> dict[tuple[str, str], dict[str, Any]]:
    return {(t, m): synthesized[f"{t}/{m}"][1] for t, m in VARIANTS}


@pytest.mark.parametrize(("instance_type", "mode"), VARIANTS)
def test_efa_interfaces_follow_the_documented_layout(
    variants: dict[tuple[str, str], dict[str, Any]], instance_type: str, mode: str
) -> None:
    spec = trn_catalog.get_gpu(instance_type)
    interfaces = launch_data(variants[instance_type, mode])["NetworkInterfaces"]
    layout = [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces]
    # The ENA primary on card 0; an EFA-only interface on card 0 device 1 and on device 0 of
    # every other card.
    assert layout == [
        (0, 0, "interface"),
        (0, 1, "efa-only"),
        *((card, 0, "efa-only") for card in range(1, spec.network_cards)),
    ]
    assert all(len(i["Groups"]) == 2 and i["DeleteOnTermination"] for i in interfaces)


def test_efa_device_counts_per_type(variants: dict[tuple[str, str], dict[str, Any]]) -> None:
    efa = {
        t: sum(
            i["InterfaceType"] == "efa-only"
            for i in launch_data(variants[t, "on-demand"])["NetworkInterfaces"]
        )
        for t in TYPES
    }
    assert efa == {
        "p5.48xlarge": 32,
        "p5en.48xlarge": 16,
        "p6-b200.48xlarge": 8,
        "g6e.48xlarge": 4,
    }


@pytest.mark.parametrize(("instance_type", "mode"), VARIANTS)
def test_nvidia_ami_taint_labels_and_hardening(
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
    assert root["Ebs"]["Encrypted"] is True and root["Ebs"]["VolumeType"] == "gp3"
    assert "KeyName" not in data
    assert "RAID0" in str(data["UserData"])
    group = nodegroup(variants[instance_type, mode])
    assert group["AmiType"] == "AL2023_x86_64_NVIDIA"
    assert group["Taints"] == [{"Effect": "NO_SCHEDULE", "Key": "nvidia.com/gpu", "Value": "true"}]
    assert group["Labels"] == {
        "trn-platform/node-type": "gpu",
        "trn-platform/efa-interfaces": str(trn_catalog.get_gpu(instance_type).efa_interfaces),
        "trn-platform/capacity": mode,
    }
    assert "RemoteAccess" not in group and "InstanceTypes" not in group
    assert group["UpdateConfig"] == {"MaxUnavailable": 1, "UpdateStrategy": "MINIMAL"}
    assert scaling(variants[instance_type, mode]) == {"desiredSize": 1, "maxSize": 1, "minSize": 0}
    tags = {t["Key"]: t["Value"] for t in data["TagSpecifications"][0]["Tags"]}
    assert tags["trn-platform/node-type"] == "gpu"


def test_placement_group_only_for_on_demand(
    variants: dict[tuple[str, str], dict[str, Any]],
) -> None:
    for (_, mode), template in variants.items():
        groups = of_type(template, "AWS::EC2::PlacementGroup")
        data = launch_data(template)
        if mode == "on-demand":
            assert [g["Properties"]["Strategy"] for g in groups] == ["cluster"]
            assert "Placement" in data and "CapacityReservationSpecification" not in data
            assert nodegroup(template)["CapacityType"] == "ON_DEMAND"
        else:
            assert groups == [] and "Placement" not in data


def test_capacity_block_and_odcr_target_the_reservation(
    variants: dict[tuple[str, str], dict[str, Any]],
) -> None:
    block = variants["p6-b200.48xlarge", "capacity-block"]
    assert launch_data(block)["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert launch_data(block)["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": RESERVATION}
    }
    assert nodegroup(block)["CapacityType"] == "CAPACITY_BLOCK"
    odcr = variants["p6-b200.48xlarge", "odcr"]
    assert launch_data(odcr)["CapacityReservationSpecification"] == {
        "CapacityReservationPreference": "capacity-reservations-only",
        "CapacityReservationTarget": {"CapacityReservationId": RESERVATION},
    }
    assert "InstanceMarketOptions" not in launch_data(odcr)
    assert nodegroup(odcr)["CapacityType"] == "ON_DEMAND"


def test_replacement_safe_name(
    synthesized: dict[str, tuple[GpuNodeGroup, dict[str, Any]]],
) -> None:
    group, template = synthesized["named"]
    name = nodegroup(template)["NodegroupName"]
    assert name.startswith("x-gpu-") and len(name) == len("x-gpu-") + 8
    # A plain string at synth, which the workloads stack's outputs take.
    assert cdk.Stack.of(group).resolve(group.nodegroup_name) == name


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"instance_type": "trn2.48xlarge"},
            r"instance_type: instance type 'trn2\.48xlarge' is not in the GPU instance catalog",
        ),
        ({"desired_size": 65}, r"max_size 65 is not allowed; use 1 to 64"),
        ({"capacity": "odcr", "capacity_reservation_id": "cr-1"}, r"capacity_reservation_id"),
        ({"capacity_reservation_id": RESERVATION}, r"only used with capacity"),
    ],
)
def test_bad_props_are_refused(overrides: dict[str, Any], message: str) -> None:
    stack, vpc, cluster = _stack()
    with pytest.raises(ValueError, match=message):
        GpuNodeGroup(stack, "Bad", **_props(vpc, cluster, **overrides))
