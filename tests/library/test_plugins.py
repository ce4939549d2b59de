"""NeuronPlugins on a cluster of yours: the charts, node recovery and a Trainium node group."""

import json
from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template

import trn_catalog
from constructs_lib import NeuronPlugins, TrainiumNodeGroup
from tests.conftest import construct_app
from trn_catalog import versions


def their_cluster(
    *, kubectl: bool = True, region: str | None = "us-west-2"
) -> tuple[cdk.Stack, ec2.Vpc, eks.ICluster]:
    """A stack with a VPC and an imported EKS cluster, as a platform team that owns both has
    (``region`` None: an environment-agnostic stack)."""
    env = cdk.Environment(account="210987654321", region=region) if region else None
    stack = cdk.Stack(construct_app(), "Theirs", env=env)
    zones = [f"{region}a", f"{region}b"] if region else None
    vpc = ec2.Vpc(stack, "Vpc", availability_zones=zones, nat_gateways=1)
    # Their kubectl provider: the handler function and the role their cluster admits.
    provider = (
        eks.KubectlProvider.from_kubectl_provider_attributes(
            stack,
            "Kubectl",
            service_token="arn:aws:lambda:us-west-2:210987654321:function:research-kubectl",
            role=iam.Role.from_role_arn(
                stack, "KubectlRole", "arn:aws:iam::210987654321:role/research-kubectl"
            ),
        )
        if kubectl
        else None
    )
    cluster = eks.Cluster.from_cluster_attributes(
        stack,
        "Cluster",
        cluster_name="research",
        vpc=vpc,
        cluster_security_group_id="sg-0123456789abcdef0",
        kubectl_provider=provider,
    )
    return stack, vpc, cluster


def charts(template: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        r["Properties"]["Release"]: r["Properties"]
        for r in template["Resources"].values()
        if r["Type"] == "Custom::AWSCDK-EKS-HelmChart"
    }


EFA_IMAGE = "eks/aws-efa-k8s-device-plugin"


@pytest.mark.parametrize(
    ("region", "registry"),
    [
        ("us-west-2", "602401143452.dkr.ecr.us-west-2.amazonaws.com"),
        ("af-south-1", "877085696533.dkr.ecr.af-south-1.amazonaws.com"),
    ],
)
def test_the_efa_and_dranet_images_come_from_the_stacks_region(region: str, registry: str) -> None:
    stack, _, cluster = their_cluster(region=region)
    plugins = NeuronPlugins(stack, "Plugins", cluster=cluster, devices="dra")

    installed = charts(Template.from_stack(stack).to_json())

    assert plugins.image_registry == registry
    efa = json.loads(installed[versions.EFA_CHART.release]["Values"])
    dranet = json.loads(installed[versions.DRANET_CHART.release]["Values"])
    assert efa["image"] == {"repository": f"{registry}/{EFA_IMAGE}"}
    assert dranet["image"] == {"repository": f"{registry}/eks/dranet"}


def test_a_stack_without_a_region_looks_the_registry_up_at_deploy_time() -> None:
    stack, _, cluster = their_cluster(region=None)
    NeuronPlugins(stack, "Plugins", cluster=cluster)

    template = Template.from_stack(stack).to_json()

    registries_map = template["Mappings"]["EksImageRegistries"]
    assert registries_map["us-east-2"] == {
        "Registry": "602401143452.dkr.ecr.us-east-2.amazonaws.com"
    }
    values = charts(template)[versions.EFA_CHART.release]["Values"]
    assert {"Fn::FindInMap": ["EksImageRegistries", {"Ref": "AWS::Region"}, "Registry"]} in (
        values["Fn::Join"][1]
    )


def test_a_region_without_a_listed_registry_is_refused() -> None:
    stack, _, cluster = their_cluster(region="mx-central-1")

    with pytest.raises(ValueError, match="region 'mx-central-1' has no EKS image registry"):
        NeuronPlugins(stack, "Plugins", cluster=cluster)


def test_your_cluster_our_node_group_gets_the_device_plugins() -> None:
    stack, vpc, cluster = their_cluster()
    plugins = NeuronPlugins(stack, "Plugins", cluster=cluster)
    TrainiumNodeGroup(
        stack, "Trn2", cluster=cluster, subnet=vpc.private_subnets[1], instance_type="trn2.48xlarge"
    )
    template = Template.from_stack(stack).to_json()
    installed = charts(template)
    assert set(installed) == {
        versions.NEURON_CHART.release,
        versions.EFA_CHART.release,
        versions.TRAINER_CHART.release,
    }
    for pin in (versions.NEURON_CHART, versions.EFA_CHART, versions.TRAINER_CHART):
        chart = installed[pin.release]
        assert (chart["Chart"], chart["Version"], chart["Repository"]) == (
            pin.chart,
            pin.version,
            pin.repository,
        )
        assert chart["ClusterName"] == "research"
    neuron = json.loads(installed[versions.NEURON_CHART.release]["Values"])
    assert "trn2.48xlarge" in neuron["neuronInstances"]
    efa = json.loads(installed[versions.EFA_CHART.release]["Values"])
    assert "trn2.48xlarge" in efa["supportedInstanceLabels"]["values"]
    # Their nodes carry no label of ours: nothing is pinned to a system node group.
    trainer = json.loads(installed[versions.TRAINER_CHART.release]["Values"])
    assert "nodeSelector" not in trainer["manager"]
    # Node recovery's role reaches the node problem detector through Pod Identity.
    (association,) = [
        r["Properties"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::EKS::PodIdentityAssociation"
    ]
    assert association["ServiceAccount"] == "node-problem-detector"
    assert association["ClusterName"] == "research"
    assert plugins.npd_role.role_arn


def test_job_engine_is_optional_and_the_gpu_plugin_added_once() -> None:
    stack, _, cluster = their_cluster()
    plugins = NeuronPlugins(stack, "Plugins", cluster=cluster, job_engine=False)
    assert plugins.add_nvidia_device_plugin() is plugins.add_nvidia_device_plugin()
    installed = charts(Template.from_stack(stack).to_json())
    assert set(installed) == {
        versions.NEURON_CHART.release,
        versions.EFA_CHART.release,
        versions.NVIDIA_DEVICE_PLUGIN_CHART.release,
    }


def test_system_node_labels_place_the_job_engine() -> None:
    stack, _, cluster = their_cluster()
    NeuronPlugins(stack, "Plugins", cluster=cluster, system_node_labels={"role": "system"})
    installed = charts(Template.from_stack(stack).to_json())
    trainer = json.loads(installed[versions.TRAINER_CHART.release]["Values"])
    assert trainer["manager"]["nodeSelector"] == {"role": "system"}


def test_a_cluster_without_kubectl_provider_is_refused_naming_the_prop() -> None:
    stack, _, cluster = their_cluster(kubectl=False)
    with pytest.raises(ValueError, match=r"cluster 'Theirs/Cluster' has no kubectl provider"):
        NeuronPlugins(stack, "Plugins", cluster=cluster)


def test_a_workspace_needs_the_job_engine() -> None:
    stack, _, cluster = their_cluster()
    plugins = NeuronPlugins(stack, "Plugins", cluster=cluster, job_engine=False)
    with pytest.raises(ValueError, match="job_engine is False"):
        plugins.add_workspace("Workspace")


def test_neuron_values_cover_the_catalog() -> None:
    from constructs_lib.plugins import neuron_values

    assert neuron_values()["neuronInstances"] == sorted(trn_catalog.CATALOG)
