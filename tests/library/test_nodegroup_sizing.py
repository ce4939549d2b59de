"""Node groups sized like eks.Nodegroup (min_size, desired_size, max_size), with overridable
taints and labels."""

from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk.assertions import Template

from constructs_lib import GpuNodeGroup, TrainiumNodeGroup
from constructs_lib.trainium_nodegroup import CREATED_SCALING
from tests.conftest import construct_app
from tests.template_parts import of_type, scaling

GROUPS = (TrainiumNodeGroup, GpuNodeGroup)


def template(group_class: type[TrainiumNodeGroup] = TrainiumNodeGroup, **props: Any) -> Any:
    """The template of a stack with one group built with ``props``."""
    stack = cdk.Stack(
        construct_app(), "Nodes", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=1)
    cluster = eks.Cluster.from_cluster_attributes(
        stack, "Cluster", cluster_name="c", vpc=vpc, cluster_security_group_id="sg-0123"
    )
    group_class(stack, "Group", cluster=cluster, subnet=vpc.private_subnets[0], **props)
    return Template.from_stack(stack).to_json()


def nodegroup(group_class: type[TrainiumNodeGroup] = TrainiumNodeGroup, **props: Any) -> Any:
    """The AWS::EKS::Nodegroup's properties of one group built with ``props``."""
    (group,) = of_type(template(group_class, **props), "AWS::EKS::Nodegroup")
    return group["Properties"]


def sized(group_class: type[TrainiumNodeGroup] = TrainiumNodeGroup, **props: Any) -> Any:
    """The sizes a group built with ``props`` gets once active; its resource is created empty."""
    built = template(group_class, **props)
    (group,) = of_type(built, "AWS::EKS::Nodegroup")
    assert group["Properties"]["ScalingConfig"] == CREATED_SCALING
    return scaling(built)


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({}, {"minSize": 0, "desiredSize": 2, "maxSize": 2}),
        ({"desired_size": 0}, {"minSize": 0, "desiredSize": 0, "maxSize": 1}),
        (
            {"min_size": 1, "desired_size": 2, "max_size": 8},
            {"minSize": 1, "desiredSize": 2, "maxSize": 8},
        ),
        ({"desired_size": 4, "max_size": 4}, {"minSize": 0, "desiredSize": 4, "maxSize": 4}),
    ],
)
def test_a_trainium_group_takes_min_desired_and_max(props: dict[str, int], expected: Any) -> None:
    assert sized(**props) == expected


def test_a_gpu_group_takes_them_too() -> None:
    assert sized(GpuNodeGroup) == {"minSize": 0, "desiredSize": 1, "maxSize": 1}
    assert sized(GpuNodeGroup, min_size=2, desired_size=3, max_size=6) == {
        "minSize": 2,
        "desiredSize": 3,
        "maxSize": 6,
    }


@pytest.mark.parametrize("group_class", GROUPS)
@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"min_size": 3, "desired_size": 2}, r"min_size 3 is greater than desired_size 2"),
        ({"desired_size": 5, "max_size": 4}, r"desired_size 5 is greater than max_size 4"),
        ({"min_size": -1, "desired_size": 0}, r"min_size -1 is not allowed; use 0 or more"),
        ({"desired_size": -1, "max_size": 2}, r"desired_size -1 is not allowed; use 0 or more"),
        ({"desired_size": 0, "max_size": 0}, r"max_size 0 is not allowed; use 1 to 64"),
        ({"max_size": 65}, r"max_size 65 is not allowed; use 1 to 64"),
        ({"desired_size": 65}, r"max_size 65 is not allowed; use 1 to 64"),
    ],
)
def test_sizes_out_of_order_are_refused(
    group_class: type[TrainiumNodeGroup], props: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        nodegroup(group_class, **props)


def test_the_old_nodes_keyword_is_gone() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'nodes'"):
        nodegroup(nodes=2)


NEURON = {"Key": "aws.amazon.com/neuron", "Value": "true", "Effect": "NO_SCHEDULE"}
GPU = {"Key": "nvidia.com/gpu", "Value": "true", "Effect": "NO_SCHEDULE"}
TEAM = eks.TaintSpec(key="team", value="nlp", effect=eks.TaintEffect.NO_EXECUTE)
TEAM_CFN = {"Key": "team", "Value": "nlp", "Effect": "NO_EXECUTE"}


@pytest.mark.parametrize(
    ("group_class", "default"), [(TrainiumNodeGroup, NEURON), (GpuNodeGroup, GPU)]
)
def test_taints_default_replace_extend_or_none(
    group_class: type[TrainiumNodeGroup], default: dict[str, str]
) -> None:
    assert nodegroup(group_class)["Taints"] == [default]
    assert nodegroup(group_class, taints=[TEAM])["Taints"] == [TEAM_CFN]
    extended = nodegroup(group_class, taints=[*group_class.default_taints(), TEAM])
    assert extended["Taints"] == [default, TEAM_CFN]
    assert nodegroup(group_class, taints=[]).get("Taints", []) == []


@pytest.mark.parametrize(
    ("taints", "message"),
    [
        (
            [eks.TaintSpec(value="x", effect=eks.TaintEffect.NO_SCHEDULE)],
            r"taints: key '' value 'x'",
        ),
        ([eks.TaintSpec(key="k" * 64)], r"taints: key 'k{64}' .*1 to 63 characters"),
        ([eks.TaintSpec(key="k", value="v" * 64)], r"taints: key 'k' value 'v{64}' is not allowed"),
        ([TEAM, TEAM], r"taints: key 'team' appears twice with one effect"),
    ],
)
def test_bad_taints_are_refused(taints: list[eks.TaintSpec], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        nodegroup(taints=taints)


def test_labels_extend_and_override_the_defaults() -> None:
    labels = nodegroup(labels={"team": "nlp", "trn-platform/capacity": "reserved"})["Labels"]
    assert labels == {
        "trn-platform/node-type": "trainium",
        "trn-platform/efa-interfaces": "16",
        "trn-platform/capacity": "reserved",
        "team": "nlp",
    }


@pytest.mark.parametrize("group_class", GROUPS)
def test_labels_fit_eks_and_the_node_type_label_is_kept(
    group_class: type[TrainiumNodeGroup],
) -> None:
    with pytest.raises(
        ValueError,
        match=r"labels: 'team'='' is not allowed; EKS takes a label key and value of 1 to 63 "
        "characters each",
    ):
        nodegroup(group_class, labels={"team": ""})
    with pytest.raises(ValueError, match=r"labels: 'x{64}'='a' is not allowed"):
        nodegroup(group_class, labels={"x" * 64: "a"})
    with pytest.raises(ValueError, match=r"labels: trn-platform/node-type='cpu' is not allowed"):
        nodegroup(group_class, labels={"trn-platform/node-type": "cpu"})
