"""Shared fixtures: synthesize an app variant once per session and read its assembly."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from trn_catalog.outputs import EnvironmentOutputs

ROOT = Path(__file__).resolve().parent.parent

# botocore parses its service models once per session (EC2's takes about half a second), and
# moto and each trnctl command make sessions of their own: share one loader per data path across
# the test process, as one session shares it across its clients. The models are package files,
# the same for every session. (`make test-xla`'s environment has no AWS SDK.)
try:
    import botocore.loaders
    import botocore.session
except ImportError:
    pass
else:
    botocore.session.create_loader = functools.cache(botocore.loaders.create_loader)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The order and grouping of tests on xdist workers (tests/scheduling.py).
from tests.scheduling import pytest_collection_modifyitems  # noqa: E402, F401

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
# moto's EC2 backend loads its bundled catalog of public AMIs (thousands per region) at its first
# call in each mock: about 0.8 CPU-s of a test's time. Neither trnctl nor a test looks an image up
# in EC2 (node groups take EKS's AMI types), so the catalog stays unloaded.
os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")


def pytest_report_header() -> str | None:
    """Which ATen CPU kernels torch runs where ``ATEN_CPU_CAPABILITY`` chooses them (``make
    test-isa``), as torch itself reports them: a run's log then says that the choice took."""
    asked = os.environ.get("ATEN_CPU_CAPABILITY")
    if asked is None:
        return None
    import torch

    return (
        f"ATen CPU kernels: {torch.backends.cpu.get_cpu_capability()} (ATEN_CPU_CAPABILITY={asked})"
    )


CDK_JSON_CONTEXT: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]

# Variants the security gate and the template tests cover: every profile, EFA FSx, the
# reservation-based capacity modes, a GPU node group beside the trn nodes (the per-type and
# per-capacity GPU templates are construct-level, tests/infra/test_gpu_nodegroup.py), and devices
# by DRA on the default trn3 type (trn2 under DRA: tests/infra/test_dra.py), and UltraServer
# Capacity Blocks.
VARIANTS: dict[str, dict[str, str]] = {
    "dev": {},
    "prod": {"env": "prod", "project": "nlp", "model_registry": "sagemaker"},
    "preview": {"preview": "alpha", "ttl_hours": "24"},
    "efa-fsx": {"efa_fsx": "true", "fsx_storage_gib": "4800", "fsx_throughput_per_tib": "1000"},
    "capacity-block": {
        "capacity": "capacity-block",
        "capacity_reservation_id": "cr-0123456789abcdef0",
        "instance_type": "trn2.48xlarge",
    },
    "odcr": {
        "capacity": "odcr",
        "capacity_reservation_id": "cr-0123456789abcdef1",
        "instance_type": "trn1.32xlarge",
        "admin_role_arn": "arn:aws:iam::123456789012:role/PlatformAdmin",
    },
    "gpu": {"gpu_instance_type": "p5.48xlarge", "gpu_nodes": "2"},
    "dra": {"devices": "dra"},
    # Two UltraServer Capacity Blocks, a node group each (tests/infra/test_ultraserver_nodegroups).
    "ultraserver": {
        "instance_type": "trn2u.48xlarge",
        "availability_zone": "us-east-2b",
        "ultraserver_reservation_ids": "cr-0123456789abcdef2,cr-0123456789abcdef3",
    },
}


def construct_app(**props: Any) -> Any:
    """A ``cdk.App`` for a construct test, without CDK's built-in CloudFormation validation, as
    the platform's own app (app.py). Here the plugin only warns (the
    ``@aws-cdk/core:validateAgainstDefaultRules`` flag is not set), cfn-lint checks every
    variant's templates (tests/security/test_gate.py), and it costs the jsii runtime about ten
    CPU-seconds on a test process's first synth and a third of each later one. Another team's app
    keeps CDK's defaults: tests/test_library.py synthesizes the documented examples and another
    app against the wheel with them."""
    import aws_cdk as cdk

    return cdk.App(builtin_cloud_formation_validation=False, **props)


def context_with(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """cdk.json's context (feature flags, AZ cache) plus ``overrides``, as the CDK CLI passes it."""
    return {**CDK_JSON_CONTEXT, **overrides}


@dataclass
class Synth:
    """One synthesized app: its directory, templates by stack name and the validation report."""

    outdir: Path
    app: Any
    platform: Any
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def report(self) -> dict[str, Any]:
        return json.loads((self.outdir / "validation-report.json").read_text())

    def template(self, suffix: str) -> dict[str, Any]:
        (name,) = [n for n in self.templates if n.endswith(f"-{suffix}")]
        return self.templates[name]

    def resources(self, suffix: str, resource_type: str) -> dict[str, dict[str, Any]]:
        return {
            logical_id: resource
            for logical_id, resource in self.template(suffix)["Resources"].items()
            if resource["Type"] == resource_type
        }

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.outdir / "manifest.json").read_text())


def synthesize(overrides: Mapping[str, Any], outdir: Path) -> Synth:
    from app import build_app

    app, platform = build_app(context_with(overrides), outdir=str(outdir))
    app.synth()
    synth = Synth(outdir=outdir, app=app, platform=platform)
    for path in sorted(outdir.glob("*.template.json")):
        synth.templates[path.name.removesuffix(".template.json")] = json.loads(path.read_text())
    return synth


@pytest.fixture(scope="session")
def synth_variant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Synth]]:
    cache: dict[str, Synth] = {}

    def get(name: str) -> Synth:
        if name not in cache:
            cache[name] = synthesize(VARIANTS[name], tmp_path_factory.mktemp(f"cdk-{name}"))
        return cache[name]

    yield get


@pytest.fixture(scope="session")
def dev(synth_variant: Callable[[str], Synth]) -> Synth:
    return synth_variant("dev")


@pytest.fixture(scope="session")
def prod(synth_variant: Callable[[str], Synth]) -> Synth:
    return synth_variant("prod")


_SAMPLE_OUTPUTS = EnvironmentOutputs(
    environment="trn-dev",
    region="us-east-2",
    cluster_name="trn-dev",
    trn_nodegroup="trn-dev-trn-0a1b2c3d",
    node_role_arn="arn:aws:iam::123456789012:role/trn-dev-node",
    fsx_file_system_id="fs-0123456789abcdef0",
    fsx_mount_name="abcdefgh",
    fsx_dns_name="fs-0123456789abcdef0.fsx.us-east-2.amazonaws.com",
    datasets_bucket="trn-dev-datasets",
    checkpoints_bucket="trn-dev-checkpoints",
    compile_cache_url="s3://trn-dev-checkpoints/neuron-cache/",
    image_uri="123456789012.dkr.ecr.us-east-2.amazonaws.com/trainer:1",
    namespace="training",
    service_account="trainer",
    instance_type="trn2.48xlarge",
    trn_nodes=2,
)


def sample_outputs(**changes: Any) -> EnvironmentOutputs:
    """An environment's outputs as trnctl reads them (what a rendered job depends on is the
    namespace, images and instance types; tests change those they check)."""
    return replace(_SAMPLE_OUTPUTS, **changes)
