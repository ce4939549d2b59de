"""LNC on the device-plugin path: a node group setting written by the launch template's user data
to the file the Neuron runtime reads, validated per instance type."""

from __future__ import annotations

import email
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from test_trainium_nodegroup import build

from constructs_lib import GpuNodeGroup
from constructs_lib.trainium_nodegroup import user_data
from tests.conftest import construct_app
from tests.template_parts import launch_data

OLD_USER_DATA = """MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="//"

--//
Content-Type: application/node.eks.aws

apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  instance:
    localStorage:
      strategy: RAID0

--//--
"""


def decoded(data: dict[str, Any]) -> str:
    """The user data text (CloudFormation base64-encodes it at deploy)."""
    return str(data["UserData"]["Fn::Base64"])


def parts(text: str) -> dict[str, str]:
    message = email.message_from_string(text)
    assert message.is_multipart()
    return {p.get_content_type(): str(p.get_payload()) for p in message.get_payload()}


def test_lnc_adds_a_script_that_writes_the_runtime_config_file() -> None:
    _, template = build(instance_type="trn2.48xlarge", lnc=1)

    found = parts(decoded(launch_data(template)))

    assert set(found) == {"application/node.eks.aws", "text/x-shellscript"}
    script = found["text/x-shellscript"]
    assert script.startswith("#!/bin/bash")
    assert "printf 'NEURON_LOGICAL_NC_CONFIG=%s\\n' 1 > /opt/aws/neuron/logical_nc_config" in script
    assert "mkdir -p /opt/aws/neuron" in script


def test_without_lnc_the_user_data_is_unchanged() -> None:
    """Same bytes as before the LNC option: no new launch template version, no node rolled."""
    assert user_data(True, None) == OLD_USER_DATA
    assert user_data(False, None) is None
    _, template = build(instance_type="trn2.48xlarge")
    assert decoded(launch_data(template)) == OLD_USER_DATA


def test_lnc_without_instance_store_is_the_script_alone() -> None:
    found = parts(str(user_data(False, 2)))
    assert list(found) == ["text/x-shellscript"]


def test_lnc_on_trn1_is_refused_naming_lnc() -> None:
    with pytest.raises(ValueError, match=r"lnc 1 is not allowed: trn1\.32xlarge has no logical"):
        build(instance_type="trn1.32xlarge", lnc=1)


def test_an_lnc_other_than_one_or_two_is_refused() -> None:
    with pytest.raises(ValueError, match=r"lnc 4 is not allowed: 4 is not an LNC; use 1 or 2"):
        build(instance_type="trn3.48xlarge", lnc=4)


def test_lnc_on_a_gpu_group_is_refused() -> None:
    stack = cdk.Stack(
        construct_app(), "Gpu", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=1)
    cluster = eks.Cluster.from_cluster_attributes(
        stack, "Cluster", cluster_name="c", vpc=vpc, cluster_security_group_id="sg-0123"
    )
    with pytest.raises(ValueError, match=r"lnc 1 is not allowed: p5\.48xlarge has no NeuronCores"):
        GpuNodeGroup(
            stack,
            "Gpu",
            cluster=cluster,
            subnet=vpc.private_subnets[0],
            instance_type="p5.48xlarge",
            lnc=1,
        )
