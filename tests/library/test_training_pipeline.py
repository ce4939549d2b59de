"""TrainingPipeline and PipelineAccess in another team's app: the CronJob in the synthesized
template is the object ``trnctl pipeline create --dry-run`` prints for the same settings, both
strictly valid against Kubernetes 1.35; every refused prop is named with its value and what is
allowed; cdk-nag finds nothing unacknowledged."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aws_cdk as cdk
import boto3
import pytest
import yaml
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from cdk_nag import AwsSolutionsChecks
from moto import mock_aws
from typer.testing import CliRunner

from constructs_lib import PipelineAccess, TrainingPipeline
from tests.conformance import kube_objects
from tests.conftest import ROOT, construct_app, sample_outputs
from trn_catalog import pipelines as shared
from trnctl.cli import app as trnctl_app

OUTPUTS = sample_outputs()
IMAGE = "123456789012.dkr.ecr.us-east-2.amazonaws.com/trainer:pinned"
# One pipeline, as the construct's props and as `trnctl pipeline create`'s options.
PROPS: dict[str, Any] = {
    "pipeline_name": "support",
    "schedule": "0 3 * * 1",
    "model": "models/llama",
    "data": "datasets/tickets",
    "eval_data": "datasets/tickets-eval",
    "gate": "eval_loss <= current - 0.01",
    "image": IMAGE,
    "time_zone": "Europe/Berlin",
    "nodes": 2,
    "max_steps": 50,
    "lora_rank": 8,
    "lora_alpha": 16.0,
}
CREATE = (
    "pipeline", "create", "support", "--env", OUTPUTS.environment, "--schedule", "0 3 * * 1",
    "--model", "models/llama", "--data", "datasets/tickets", "--eval-data",
    "datasets/tickets-eval", "--gate", "eval_loss <= current - 0.01", "--image", IMAGE,
    "--time-zone", "Europe/Berlin", "--nodes", "2", "--max-steps", "50", "--lora-rank", "8",
    "--lora-alpha", "16", "--dry-run",
)  # fmt: skip


def their_stack(app: cdk.App) -> tuple[cdk.Stack, PipelineAccess]:
    """A stack with an imported cluster and PipelineAccess on it, in the outputs' region."""
    stack = cdk.Stack(
        app, "Pipelines", env=cdk.Environment(account="123456789012", region=OUTPUTS.region)
    )
    vpc = ec2.Vpc.from_vpc_attributes(
        stack, "Vpc", vpc_id="vpc-0123456789abcdef0", availability_zones=["us-east-2a"]
    )
    provider = eks.KubectlProvider.from_kubectl_provider_attributes(
        stack,
        "Kubectl",
        service_token="arn:aws:lambda:us-east-2:123456789012:function:kubectl",
        role=iam.Role.from_role_arn(stack, "KubectlRole", "arn:aws:iam::123456789012:role/k"),
    )
    cluster = eks.Cluster.from_cluster_attributes(
        stack, "Cluster", cluster_name=OUTPUTS.cluster_name, vpc=vpc, kubectl_provider=provider
    )
    key = kms.Key(stack, "AlertKey", enable_key_rotation=True)
    access = PipelineAccess(
        stack,
        "Access",
        cluster=cluster,
        namespace=OUTPUTS.namespace,
        environment=OUTPUTS.environment,
        role=iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com")),
        alert_topic=sns.Topic(stack, "Alerts", master_key=key, enforce_ssl=True),
        alert_key=key,
        sagemaker=True,
    )
    return stack, access


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """The stack's template and the directory of its validation report, synthesized once with
    cdk-nag's AwsSolutions checks."""
    outdir = tmp_path_factory.mktemp("pipeline")
    app = construct_app(outdir=str(outdir))
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stack, access = their_stack(app)
    TrainingPipeline(stack, "Support", access=access, **PROPS)
    app.synth()
    return json.loads((outdir / "Pipelines.template.json").read_text()), outdir


def _cronjob(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (found,) = [
        a for a in kube_objects.manifests({"Pipelines": template}) if a.obj["kind"] == "CronJob"
    ]
    return found.origin, dict(found.obj)


def _dry_run(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What `trnctl pipeline create --dry-run` prints, against moto's SSM with the outputs."""
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_REGION", OUTPUTS.region)
    with mock_aws():
        boto3.client("ssm", OUTPUTS.region).put_parameter(
            Name=f"/trn-platform/{OUTPUTS.environment}/outputs",
            Value=OUTPUTS.to_json(),
            Type="String",
        )
        run = CliRunner().invoke(trnctl_app, list(CREATE), catch_exceptions=False)
    assert run.exit_code == 0, run.stderr
    printed: dict[str, Any] = yaml.safe_load(run.stdout)
    return printed


def test_the_cronjob_is_the_one_trnctl_applies_and_strictly_valid(
    synthesized: tuple[dict[str, Any], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, cronjob = _cronjob(synthesized[0])
    labels = cronjob["metadata"]["labels"]
    # CDK's KubernetesManifest labels what it applies (prune=True), to delete the CronJob when
    # the pipeline is renamed or removed; it is the one difference.
    (prune,) = [k for k in labels if k.startswith("aws.cdk.eks/prune-")]
    assert labels.pop(prune) == ""

    assert cronjob == _dry_run(monkeypatch)
    assert kube_objects.problems(cronjob) == []
    pipeline = shared.Pipeline.from_json(cronjob["metadata"]["annotations"][shared.SPEC_ANNOTATION])
    assert pipeline.training == {"max_steps": 50, "lora_rank": 8, "lora_alpha": 16.0}
    assert pipeline.image == IMAGE and pipeline.environment == OUTPUTS.environment


def test_the_cronjob_is_applied_after_the_service_account(
    synthesized: tuple[dict[str, Any], Path],
) -> None:
    template = synthesized[0]
    origin, _ = _cronjob(template)
    logical_id = origin.split("/")[1]
    (access_id,) = [
        k
        for k, r in template["Resources"].items()
        if r["Type"] == kube_objects.MANIFEST_TYPE and k.startswith("AccessManifest")
    ]

    assert access_id in template["Resources"][logical_id]["DependsOn"]


def test_cdk_nag_finds_nothing_unacknowledged(synthesized: tuple[dict[str, Any], Path]) -> None:
    report = json.loads((synthesized[1] / "validation-report.json").read_text())

    (plugin,) = report["pluginReports"]
    assert plugin["violations"] == []
    assert all(len(s["reason"]) >= 20 for s in plugin.get("suppressedViolations", []))


def test_a_token_image_reaches_the_controller_and_the_definition() -> None:
    """TrainingImage's image_uri is a token at synth: it resolves in both places."""
    app = construct_app()
    stack, access = their_stack(app)
    image = cdk.Fn.join(":", [cdk.Fn.import_value("TrainerRepository"), "v1"])
    TrainingPipeline(stack, "Support", access=access, **{**PROPS, "image": image})
    template = app.synth().get_stack_by_name("Pipelines").template
    _, cronjob = _cronjob(template)

    container = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    # The import resolves at deploy; here it reads as the placeholder, the tag kept.
    resolved = f"{kube_objects.PLACEHOLDER}:v1"
    assert container["image"] == resolved
    spec = shared.Pipeline.from_json(cronjob["metadata"]["annotations"][shared.SPEC_ANNOTATION])
    assert spec.image == resolved
    assert json.loads(container["env"][0]["value"])["image"] == resolved


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"pipeline_name": "Support"},
            "pipeline_name 'Support' is not allowed: use lowercase letters, digits and '-'",
        ),
        (
            {"schedule": "0 3 * *"},
            "schedule '0 3 * *' has 4 fields; a cron schedule has 5: minute hour day-of-month",
        ),
        (
            {"schedule": "TZ=Europe/Berlin 0 3 * * 1"},
            "a time zone goes in time_zone, not the schedule",
        ),
        ({"time_zone": "Mars/Olympus"}, "time_zone 'Mars/Olympus' is not an IANA time zone"),
        ({"model": "llama"}, "model 'llama' is not models/NAME or models/NAME@vN"),
        ({"data": "datasets/tickets@v2"}, "data 'datasets/tickets@v2': a pipeline trains on"),
        ({"eval_data": "evals/x"}, "eval_data 'evals/x': name a versioned dataset"),
        ({"gate": "loss <= current"}, "gate 'loss <= current': unknown metric 'loss'; use"),
        ({"register_as": "Bad"}, "register_as 'models/Bad': 'Bad' cannot name a versioned"),
        ({"image": "trainer latest"}, "image 'trainer latest' is not an image reference"),
        ({"nodes": 0}, "nodes 0 is not allowed; use 1 to 128"),
        ({"nodes": "2"}, "nodes '2' is not allowed; use 1 to 128"),
        ({"capacity_wait_minutes": 1441}, "capacity_wait_minutes 1441 is not allowed; use 1 to"),
        ({"epochs": 1}, "max_steps and epochs exclude each other: epochs derives the steps"),
        ({"max_steps": 0}, "max_steps 0 is not allowed; use 1 or more"),
        ({"max_steps": 2.5}, "max_steps 2.5 is not allowed; use a whole number of 1 or more"),
        ({"seed": True}, "seed True is not allowed; use a whole number"),
        ({"lora_rank": None}, "lora_alpha needs lora_rank"),
        ({"lora_alpha": 0.0}, "lora_alpha 0 is not allowed; use a number above 0"),
        ({"eval_batches": 0}, "eval_batches 0 is not allowed; use 1 or more"),
        ({"suspend": "yes"}, "suspend 'yes' is not allowed; use True or False"),
    ],
)
def test_a_refused_prop_is_named_with_its_value_and_what_is_allowed(
    changes: dict[str, Any], message: str
) -> None:
    stack, access = their_stack(construct_app())

    with pytest.raises(ValueError, match=re.escape(message)):
        TrainingPipeline(stack, "Support", access=access, **{**PROPS, **changes})


def test_access_refuses_an_environment_that_names_nothing() -> None:
    with pytest.raises(ValueError, match=re.escape("environment 'trn dev' is not allowed")):
        _access_in("trn dev")


def _access_in(environment: str) -> None:
    app = construct_app()
    stack = cdk.Stack(app, "Pipelines")
    cluster = eks.Cluster.from_cluster_attributes(stack, "Cluster", cluster_name="c")
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    PipelineAccess(
        stack,
        "Access",
        cluster=cluster,
        namespace="training",
        environment=environment,
        role=iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com")),
        alert_topic=sns.Topic(stack, "Alerts", master_key=key),
        alert_key=key,
    )


def test_the_docs_example_synthesizes_the_pipeline_it_shows() -> None:
    page = (ROOT / "docs" / "pipelines.md").read_text()
    section = page.split("### In CDK code")[1].split("\n#")[0]
    (example,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    app = construct_app()
    stack, access = their_stack(app)
    names = {
        "stack": stack,
        "workloads": SimpleNamespace(pipelines=access),
        "image": SimpleNamespace(image_uri=IMAGE),
    }

    exec(example, names)

    _, cronjob = _cronjob(app.synth().get_stack_by_name("Pipelines").template)
    assert kube_objects.problems(cronjob) == []
    spec = shared.Pipeline.from_json(cronjob["metadata"]["annotations"][shared.SPEC_ANNOTATION])
    assert spec.training == {"epochs": 2, "lora_rank": 16, "lora_alpha": 32}
