"""Each construct takes its props as typed keyword arguments, so that mypy finds a misspelled or
mistyped prop in an app, and keeps them in a record (``.props``) of exactly those arguments."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path

import pytest
from mypy import api

import constructs_lib
from constructs_lib import (
    GpuNodeGroup,
    NeuronCluster,
    NeuronPlugins,
    NodeGroupOptions,
    PipelineAccess,
    PreviewLifecycle,
    TrainingDataPaths,
    TrainingImage,
    TrainingNetwork,
    TrainingObservability,
    TrainingPipeline,
    TrainingWorkspace,
    TrainiumNodeGroup,
    WorkspaceOptions,
)

CONSTRUCTS = [
    (NeuronCluster, constructs_lib.NeuronClusterProps),
    (NeuronPlugins, constructs_lib.NeuronPluginsProps),
    (TrainiumNodeGroup, constructs_lib.TrainiumNodeGroupProps),
    (GpuNodeGroup, constructs_lib.TrainiumNodeGroupProps),
    (TrainingNetwork, constructs_lib.TrainingNetworkProps),
    (TrainingDataPaths, constructs_lib.TrainingDataPathsProps),
    (TrainingWorkspace, constructs_lib.TrainingWorkspaceProps),
    (TrainingImage, constructs_lib.TrainingImageProps),
    (TrainingObservability, constructs_lib.TrainingObservabilityProps),
    (PreviewLifecycle, constructs_lib.PreviewLifecycleProps),
    (PipelineAccess, constructs_lib.PipelineAccessProps),
    (TrainingPipeline, constructs_lib.TrainingPipelineProps),
]
# The same app twice: as written, and with a prop misspelled or mistyped in each kind of call (a
# construct, a method that adds a node group, a method that adds a workspace).
APP = """
import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk.lambda_layer_kubectl_v35 import KubectlV35Layer

from constructs_lib import (
    NeuronCluster,
    PipelineAccess,
    TrainingDataPaths,
    TrainingNetwork,
    TrainingPipeline,
    TrainiumNodeGroup,
)

stack = cdk.Stack(cdk.App(), "Training")
network = TrainingNetwork(
    stack, "Network", trn_availability_zone="us-west-2b", availability_zones=["us-west-2a"]
)
cluster = NeuronCluster(
    stack, "Cluster", vpc=network.vpc, kubectl_layer=KubectlV35Layer(stack, "Kubectl")
)
nodes = cluster.add_trainium_nodegroup("Trn", subnet=network.trn_subnet, desired_size=4)
TrainiumNodeGroup(
    stack, "More", cluster=cluster.icluster, subnet=network.trn_subnet, max_size=8
)
data = TrainingDataPaths(stack, "Data", vpc=network.vpc, fsx_subnet=network.trn_subnet)
cluster.plugins.add_workspace(
    "Workspace",
    file_system=data.file_system,
    datasets=data.datasets,
    job_role=data.job_role,
    mountpoint_role=data.mountpoint_role,
    image_uri="210987654321.dkr.ecr.us-west-2.amazonaws.com/trainer:v1",
    instance_type="trn3.48xlarge",
    compile_cache_url=data.compile_cache_url,
    nodes=2,
)
access = PipelineAccess(
    stack,
    "Access",
    cluster=cluster.icluster,
    namespace="training",
    environment="trn-dev",
    role=data.pipeline_role,
    alert_topic=cdk.aws_sns.Topic(stack, "Alerts"),
    alert_key=cdk.aws_kms.Key(stack, "Key"),
)
TrainingPipeline(
    stack,
    "Weekly",
    access=access,
    pipeline_name="support",
    schedule="@weekly",
    model="models/llama",
    data="datasets/tickets",
    eval_data="datasets/tickets-eval",
    gate="eval_loss <= current - 0.01",
    image="210987654321.dkr.ecr.us-west-2.amazonaws.com/trainer:v1",
    max_steps=50,
)
"""
MISTAKES = {
    "desired_size=4)": "desired_sise=4)",
    "max_size=8": 'max_size="8"',
    "nodes=2,": "node=2,",
    "max_steps=50,": 'max_steps="50",',
}
# mypy reads our code but not aws-cdk-lib's (tens of megabytes of generated Python): the props'
# names and our own types are what an app's mistakes are checked against.
CONFIG = """
[mypy]
python_version = 3.11
[mypy-aws_cdk.*,constructs.*,jsii.*,cdk_ecr_deployment.*,publication.*,typeguard.*]
follow_imports = skip
"""


def _params(function: typing.Callable[..., object]) -> dict[str, str]:
    signature = inspect.signature(function)
    return {
        name: str(param.annotation)
        for name, param in signature.parameters.items()
        if param.kind is inspect.Parameter.KEYWORD_ONLY
    }


@pytest.mark.parametrize(("construct", "record"), CONSTRUCTS, ids=lambda c: c.__name__)
def test_the_record_holds_exactly_the_keyword_arguments(construct: type, record: type) -> None:
    fields = {field.name: str(field.type) for field in dataclasses.fields(record)}
    assert _params(construct.__init__) == fields


@pytest.mark.parametrize(
    ("options", "construct", "given"),
    [
        (NodeGroupOptions, TrainiumNodeGroup, {"cluster", "subnet"}),
        (WorkspaceOptions, TrainingWorkspace, {"cluster"}),
    ],
)
def test_the_options_of_the_adding_methods_are_the_constructors(
    options: type, construct: type, given: set[str]
) -> None:
    """The keyword arguments that add_trainium_nodegroup, add_gpu_nodegroup,
    add_ultraserver_nodegroups and add_workspace pass on, each typed as the constructor's."""
    hints = {name: hint.__forward_arg__ for name, hint in options.__annotations__.items()}
    typed = {name: re.sub(r"^Required\[(.*)\]$", r"\1", hint) for name, hint in hints.items()}
    params = inspect.signature(construct.__init__).parameters
    taken = {k: p for k, p in params.items() if p.kind is p.KEYWORD_ONLY and k not in given}
    assert typed == {name: str(param.annotation) for name, param in taken.items()}
    # Required there, Required here (read from the text: the module's annotations are strings).
    required = {name for name, hint in hints.items() if hint.startswith("Required[")}
    assert required == {name for name, param in taken.items() if param.default is param.empty}


def test_mypy_finds_a_misspelled_or_mistyped_prop_in_an_app(tmp_path: Path) -> None:
    (tmp_path / "mypy.ini").write_text(CONFIG)
    (tmp_path / "good.py").write_text(APP)
    bad = APP
    for right, wrong in MISTAKES.items():
        bad = bad.replace(right, wrong)
    (tmp_path / "bad.py").write_text(bad)
    report, errors, status = api.run(
        [
            *("--config-file", str(tmp_path / "mypy.ini")),
            *("--cache-dir", str(tmp_path / "cache")),
            *(str(tmp_path / "good.py"), str(tmp_path / "bad.py")),
        ]
    )
    found = [line for line in report.splitlines() if ": error:" in line]
    assert status == 1 and not errors
    assert not [line for line in found if "good.py" in line], report
    assert [re.sub(r"^.*?bad\.py:\d+: error: ", "", line) for line in found] == [
        'Unexpected keyword argument "desired_sise" for "add_trainium_nodegroup" of '
        '"NeuronCluster"; did you mean "desired_size"?  [call-arg]',
        'Argument "max_size" to "TrainiumNodeGroup" has incompatible type "str"; expected '
        '"int | None"  [arg-type]',
        'Unexpected keyword argument "node" for "add_workspace" of "NeuronPlugins"; did you mean '
        '"nodes"?  [call-arg]',
        'Argument "max_steps" to "TrainingPipeline" has incompatible type "str"; expected '
        '"int | None"  [arg-type]',
    ], report
