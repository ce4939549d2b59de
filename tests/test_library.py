"""constructs_lib as a library: installed from a wheel into another app, and stable ids."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, Synth

OTHER_APP = """
import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks

import constructs_lib
from constructs_lib import TrainingNetwork, TrainingNetworkProps
from constructs_lib import TrainiumNodeGroup, TrainiumNodeGroupProps

assert "site" in constructs_lib.__file__, constructs_lib.__file__
app = cdk.App()
stack = cdk.Stack(app, "TheirApp", env=cdk.Environment(account="210987654321", region="us-west-2"))
vpc = ec2.Vpc(stack, "TheirVpc", availability_zones=["us-west-2a", "us-west-2b"], nat_gateways=1)
network = TrainingNetwork(
    stack, "Training", props=TrainingNetworkProps(trn_availability_zone="us-west-2b", vpc=vpc)
)
cluster = eks.Cluster.from_cluster_attributes(
    stack, "TheirCluster", cluster_name="research", vpc=network.vpc,
    cluster_security_group_id="sg-0123456789abcdef0",
)
TrainiumNodeGroup(
    stack, "Trn2", props=TrainiumNodeGroupProps(
        cluster=cluster, subnet=network.trn_subnet, instance_type="trn2.48xlarge", nodes=4,
        capacity="capacity-block", capacity_reservation_id="cr-0123456789abcdef0",
    ),
)
app.synth()
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project built as a wheel and installed, without dependencies, into a bare folder."""
    work = tmp_path_factory.mktemp("library")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(work / "wheels"),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (work / "wheels").glob("*.whl")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(work / "site"),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    return work


def test_wheel_carries_types_and_the_reaper(installed: Path) -> None:
    site = installed / "site"
    assert (site / "constructs_lib" / "py.typed").exists()
    assert (site / "trn_catalog" / "py.typed").exists()
    assert (site / "constructs_lib" / "preview_reaper" / "handler.py").exists()
    assert (site / "trn_catalog" / "crds" / "trainer.kubeflow.org-v1alpha1.json").exists()


def test_another_app_composes_the_installed_constructs(installed: Path) -> None:
    app_dir = installed / "their-app"
    app_dir.mkdir()
    (app_dir / "app.py").write_text(OTHER_APP)
    env = {
        **os.environ,
        "PYTHONPATH": str(installed / "site"),
        "CDK_OUTDIR": str(app_dir / "out"),
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    }
    result = subprocess.run(
        [sys.executable, "-s", "app.py"],
        cwd=app_dir,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    template = json.loads((app_dir / "out" / "TheirApp.template.json").read_text())
    groups = [r for r in template["Resources"].values() if r["Type"] == "AWS::EKS::Nodegroup"]
    (group,) = groups
    assert group["Properties"]["CapacityType"] == "CAPACITY_BLOCK"
    vpcs = [r for r in template["Resources"].values() if r["Type"] == "AWS::EC2::VPC"]
    assert len(vpcs) == 1  # theirs; the construct created none


def test_importing_the_library_has_no_side_effects() -> None:
    code = (
        "import sys, os\n"
        "before = set(os.listdir('.'))\n"
        "import constructs_lib\n"
        "assert set(os.listdir('.')) == before\n"
        "assert 'aws_cdk' in sys.modules\n"
        "print(sorted(constructs_lib.__all__))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    exported = set(json.loads(result.stdout.strip().replace("'", '"')))
    assert {
        "TrainingNetwork",
        "TrainingDataPaths",
        "NeuronCluster",
        "TrainiumNodeGroup",
        "TrainingImage",
        "PreviewLifecycle",
        "CATALOG",
        "instance_spec",
    } <= exported


# Changing one of these replaces a stateful resource (and its data) on the next deploy.
STATEFUL_IDS = {
    "data": {
        "AWS::FSx::FileSystem": {"DataPathsFileSystemF22FB407"},
        "AWS::S3::Bucket": {
            "DataPathsAccessLogs9FF08411",
            "DataPathsDatasets9CD8D47B",
            "DataPathsCheckpoints3A0F6633",
            "DataPathsCompileCache78ECA761",
        },
        "AWS::KMS::Key": {"DataPathsDataKeyBA4D10B4"},
    },
    "image": {"AWS::ECR::Repository": {"TrainingImageRepositoryA4686A09"}},
}


def test_stateful_logical_ids_are_stable(dev: Synth) -> None:
    for stack, by_type in STATEFUL_IDS.items():
        for resource_type, expected in by_type.items():
            assert set(dev.resources(stack, resource_type)) == expected, resource_type
