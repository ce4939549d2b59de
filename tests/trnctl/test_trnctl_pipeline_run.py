"""A pipeline's run (`trnctl pipeline tick`) end to end against moto (S3, SNS, SageMaker) and the
fake API server, which moves the run's TrainJobs through their states: the export TrainJob
leaves the model where FSx exports it, each eval TrainJob's pod logs a `trn-train eval` line.
Promoted when better, rejected when worse (and published), skipped with no new data or no
capacity, and one training on a retry."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
import test_trnctl_kube
from fake_kube import FakeKube
from test_trnctl_aws import OUTPUTS
from test_trnctl_model_stage import model_dir

from constructs_lib import pipeline as pipeline_access
from trnctl import kube, models, pipeline_run, registry, versioning
from trnctl.pipelines import Pipeline

__all__ = ["model_dir"]  # a fixture shared with test_trnctl_model_stage

fake = test_trnctl_kube.fake
BUCKET = OUTPUTS.datasets_bucket
CHECKPOINTS = OUTPUTS.checkpoints_bucket
SUPPORT = versioning.Ref("models", "support")
PIPELINE = Pipeline(
    name="support",
    environment="trn-dev",
    schedule="0 3 * * 1",
    model="models/llama",
    data="datasets/tickets",
    eval_data="datasets/tickets-eval",
    gate="eval_loss <= current - 0.01",
    capacity_wait_minutes=1,
    training={"max_steps": 20},
)


class Killed(BaseException):
    """The controller's pod is killed (a node drained): nothing in the run catches it."""


class Cluster:
    """What the fake API server does to the run's TrainJobs when they are created: each
    finishes after ``polls`` reads; ``losses`` is what each eval prints, by step; an export
    leaves ``model`` where FSx exports it; ``pending`` TrainJobs get Pending pods and never
    start."""

    def __init__(self, state: FakeKube, model: Path) -> None:
        self.state = state
        self.model = model
        self.losses = {"eval-new": 1.5, "eval-base": 1.7}
        # Further figures each eval prints (classification data's accuracy), by step.
        self.extra: dict[str, dict[str, float]] = {}
        self.pending: set[str] = set()
        self.failed: set[str] = set()
        state.on_create = self.created

    def created(self, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        step = name.split("-", 2)[-1]
        if step in self.pending:
            self.state.add_pod(name, 0, "", phase="Pending")
            return
        kind = "Failed" if step in self.failed else "Complete"
        self.state.statuses[name] = [{"conditions": []}, test_trnctl_kube._finished(kind)]
        if step == "export":
            train = job["metadata"]["labels"]["trn-platform/source-job"]
            s3 = boto3.client("s3")
            for item in models.inspect(self.model).files:
                s3.upload_file(str(self.model / item), CHECKPOINTS, f"{train}/export/{name}/{item}")
        if step in self.losses:
            result = {"loss": self.losses[step], "examples": 12, **self.extra.get(step, {})}
            line = json.dumps(result)
            self.state.add_pod(name, 0, f"eval: nothing cut\n{line}\n")

    def creates(self, step: str) -> int:
        return sum(
            1
            for r in self.state.requests
            if r.method == "POST" and r.path.endswith("/trainjobs")
            and r.body["metadata"]["name"].endswith(f"-{step}")
        )  # fmt: skip


@pytest.fixture
def env(fake: FakeKube, model_dir: Path, trnctl: Any) -> dict[str, Any]:
    """trn-dev with its buckets, alert topic (a queue subscribed to read what is published), the
    base model models/llama@v1 staged, and datasets tickets v1 and tickets-eval v1."""
    s3 = boto3.client("s3")
    for bucket in (BUCKET, CHECKPOINTS):
        s3.create_bucket(
            Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-east-2"}
        )
    assert trnctl("model", "stage", "--env", "trn-dev", str(model_dir), "llama").exit_code == 0
    for name in ("tickets", "tickets-eval"):
        dataset(s3, name, 1)
    sns, sqs = boto3.client("sns"), boto3.client("sqs")
    topic = sns.create_topic(Name="trn-dev-alerts")["TopicArn"]
    queue = sqs.create_queue(QueueName="alerts")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn["QueueArn"])
    return {
        "s3": s3,
        "outputs": replace(OUTPUTS, alert_topic_arn=topic),
        "queue": queue,
        "cluster": Cluster(fake, model_dir),
    }


def dataset(s3: Any, name: str, number: int) -> None:
    """Version ``number`` of datasets/``name``, complete and latest (as data stage leaves it)."""
    ref = versioning.Ref("datasets", name, number)
    record = {"state": "complete", "manifest_sha256": f"{number:064x}"}
    versioning.put_json(s3, BUCKET, ref.record_key(), record)
    versioning.put_json(s3, BUCKET, f"{ref.root}/latest", {"version": f"v{number}"})


def run(
    env: dict[str, Any], job: str, pipeline: Pipeline = PIPELINE, **services: Any
) -> dict[str, Any]:
    api = kube.connect(OUTPUTS.cluster_name, OUTPUTS.region)
    ticks = iter(range(0, 10_000, 30))
    made = pipeline_run.Services(
        s3=env["s3"],
        cluster=kube.Cluster(api, OUTPUTS.namespace),
        events=kube.CronJobs(api, OUTPUTS.namespace),
        sns=boto3.client("sns"),
        sleep=lambda _: None,
        clock=lambda: float(next(ticks)),
        poll=0,
    )
    for key, value in services.items():
        setattr(made, key, value)
    return pipeline_run.Run(pipeline, env["outputs"], job, made).execute()


def published(env: dict[str, Any]) -> list[dict[str, Any]]:
    sqs = boto3.client("sqs")
    got = sqs.receive_message(QueueUrl=env["queue"], MaxNumberOfMessages=10)
    return [json.loads(m["Body"]) for m in got.get("Messages", [])]


def manifest(s3: Any, number: int) -> dict[str, Any]:
    found = versioning.get_json(s3, BUCKET, SUPPORT.at(number).record_key())
    assert found is not None
    return found[0]


def test_a_better_candidate_is_registered_and_promoted(env: dict[str, Any], fake: FakeKube) -> None:
    record = run(env, "support-29000000")

    rid = pipeline_run.run_id("support-29000000")
    assert record["status"] == "promoted"
    assert record["reason"] == (
        "models/support@v1: eval_loss 1.5000 <= 1.6900 (current 1.7000 - 0.0100): holds"
    )
    assert [s["step"] for s in record["steps"]] == [
        "data", "train", "trained", "exported", "evaluated", "registered", "promoted",
    ]  # fmt: skip
    assert record["evaluation"]["current"]["model"] == "models/llama/v1"  # no support yet
    saved = manifest(env["s3"], 1)
    assert saved["status"] == "promoted" and saved["evaluation"] == record["evaluation"]
    assert saved["lineage"]["job"] == f"support-{rid}-train"
    assert saved["lineage"]["base_model"] == "models/llama/v1"
    assert saved["lineage"]["dataset"] == "datasets/tickets/v1"
    assert registry.resolve(env["s3"], BUCKET, "models/support", "trn-dev").path == (
        "models/support/v1"
    )
    train = fake.trainjobs[f"support-{rid}-train"]
    assert "/datasets/models/llama/v1" in train["spec"]["trainer"]["args"]
    assert "/datasets/datasets/tickets/v1" in train["spec"]["trainer"]["args"]
    base = fake.trainjobs[f"support-{rid}-eval-base"]["spec"]["trainer"]
    assert base["command"] == ["python3", "-m", "trainer", "eval"]
    assert base["args"][:4] == ["--model", "/datasets/models/llama/v1", "--data",
                                "/datasets/datasets/tickets-eval/v1"]  # fmt: skip
    new = fake.trainjobs[f"support-{rid}-eval-new"]["spec"]["trainer"]["args"]
    assert new[1] == f"/fsx/checkpoints/support-{rid}-train/export/support-{rid}-export"
    assert published(env) == []
    reasons = [e["reason"] for e in fake.events]
    assert reasons[0] == "PipelineData" and reasons[-1] == "PipelinePromoted"
    assert {e["involvedObject"]["kind"] for e in fake.events} == {"CronJob"}


def test_a_worse_candidate_is_rejected_against_the_model_in_service_and_published(
    env: dict[str, Any], trnctl: Any
) -> None:
    assert run(env, "support-29000000")["status"] == "promoted"
    dataset(env["s3"], "tickets", 2)
    env["cluster"].losses = {"eval-new": 1.8, "eval-base": 1.5}

    record = run(env, "support-29010080")

    assert record["status"] == "rejected"
    assert record["evaluation"]["current"]["model"] == "models/support/v1"
    assert manifest(env["s3"], 2)["status"] == "rejected"
    assert registry.resolve(env["s3"], BUCKET, "models/support", "trn-dev").path == (
        "models/support/v1"
    )
    (message,) = published(env)
    assert message["Subject"].endswith(f"run {record['run']} rejected")
    assert json.loads(message["Message"])["reason"].startswith(
        "models/support@v2: eval_loss 1.8000 <= 1.4900"
    )
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=env["outputs"].to_json(), Type="String",
        Overwrite=True,
    )  # fmt: skip
    history = trnctl("pipeline", "history", "support", "--env", "trn-dev")
    lines = history.stdout.splitlines()
    rejected = next(line for line in lines if "rejected" in line)
    promoted = next(line for line in lines if "│ promoted" in line)
    assert "datasets/tickets@v2" in rejected and "1.8000" in rejected
    assert "models/support/v1 1.5000" in rejected
    assert "datasets/tickets@v1" in promoted and "models/llama/v1 1.7000" in promoted


def test_no_new_data_is_skipped_without_training(env: dict[str, Any]) -> None:
    assert run(env, "support-29000000")["status"] == "promoted"

    record = run(env, "support-29010080")

    assert record["status"] == "skipped"
    assert record["reason"] == "no new data: datasets/tickets@v1 is what the last run trained on"
    assert env["cluster"].creates("train") == 1
    assert published(env) == []


@pytest.mark.parametrize("kill_at", [0, 1, 2])
def test_a_retried_run_never_trains_twice(env: dict[str, Any], kill_at: int) -> None:
    """The pod is killed while the training (0), the export (1) or an eval (2) runs; the Job's
    next pod resumes the same run: it finds its TrainJobs, or its record says they are done."""
    calls = iter(range(100))

    def killed_once(_: float) -> None:
        if next(calls) == kill_at:  # each TrainJob is read twice: one wait each
            raise Killed

    with pytest.raises(Killed):
        run(env, "support-29000000", sleep=killed_once)
    first = versioning.get_json(
        env["s3"],
        BUCKET,
        pipeline_run.record_key("support", pipeline_run.run_id("support-29000000")),
    )
    assert first is not None and first[0]["status"] == "running"

    record = run(env, "support-29000000")
    again = run(env, "support-29000000")

    assert record["status"] == "promoted"
    assert again == record
    assert env["cluster"].creates("train") == 1
    assert env["cluster"].creates("export") == 1
    assert set(versioning.records(env["s3"], BUCKET, SUPPORT)) == {1}


def test_no_capacity_is_skipped_after_the_wait_and_published(
    env: dict[str, Any], fake: FakeKube
) -> None:
    env["cluster"].pending = {"train"}

    record = run(env, "support-29000000")

    rid = pipeline_run.run_id("support-29000000")
    assert record["status"] == "skipped"
    assert record["reason"] == (
        f"no capacity: TrainJob support-{rid}-train's pods found no free trn node in 1 minutes"
    )
    assert fake.deleted == [f"support-{rid}-train"]
    assert published(env)[0]["Subject"].endswith("skipped")
    dataset(env["s3"], "tickets", 1)
    env["cluster"].pending = set()
    assert run(env, "support-29010080")["status"] == "promoted"  # a skip is not a trained run


def test_a_failed_training_fails_the_run_and_is_published(env: dict[str, Any]) -> None:
    env["cluster"].failed = {"train"}

    record = run(env, "support-29000000")

    assert record["status"] == "failed"
    assert record["reason"].startswith(
        f"TrainJob support-{pipeline_run.run_id('support-29000000')}-train failed: "
    )
    assert published(env)[0]["Subject"].endswith("failed")
    assert versioning.records(env["s3"], BUCKET, SUPPORT) == {}


def test_a_classification_gate_reads_accuracy_and_fails_without_it(env: dict[str, Any]) -> None:
    gated = replace(PIPELINE, gate="accuracy >= current + 0.02")
    env["cluster"].extra = {"eval-new": {"accuracy": 0.93}, "eval-base": {"accuracy": 0.90}}

    promoted = run(env, "support-29000000", gated)
    dataset(env["s3"], "tickets", 2)
    env["cluster"].extra = {}
    failed = run(env, "support-29010080", gated)

    assert promoted["status"] == "promoted"
    assert promoted["reason"].endswith("accuracy 0.9300 >= 0.9200 (current 0.9000 + 0.0200): holds")
    assert failed["status"] == "failed"
    assert failed["reason"] == (
        "the gate needs accuracy, which trn-train eval did not report for "
        "datasets/tickets-eval (it reports accuracy and macro_f1 of classification data only)"
    )


def authorized_as(request: Any) -> tuple[str, str, str, str | None]:
    """What the API server's RBAC authorizer checks for ``request``: its API group, resource
    (``pods/log`` for a subresource), verb (GET of one object ``get``, of a collection ``list``
    or with ``watch=true`` ``watch``; POST ``create``; PUT ``update``; PATCH ``patch``; DELETE
    ``delete`` or of a collection ``deletecollection``) and namespace (None: cluster-wide)."""
    parts = request.path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = "/".join(rest[::2])
    one = len(rest) > 1
    if request.method == "GET":
        watched = request.query.get("watch") == ["true"]
        verb = "watch" if watched else "get" if one else "list"
    elif request.method == "DELETE":
        verb = "delete" if one else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}[request.method]
    return group, resource, verb, namespace


def allowed(request: Any) -> bool:
    """Whether PipelineAccess's Role lets the controller make ``request``."""
    group, resource, verb, namespace = authorized_as(request)
    return namespace == OUTPUTS.namespace and any(
        group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
        for rule in pipeline_access.RULES
    )


def test_every_call_the_controller_makes_is_one_its_role_allows(
    env: dict[str, Any], fake: FakeKube
) -> None:
    """A run skipped for capacity (its TrainJob deleted), one promoted and one rejected (pods
    and their logs read, events recorded): each request the controller sent to the API server is
    one the trn-pipelines Role (constructs_lib.pipeline.RULES) allows, in the namespace; the
    RBAC a cluster enforces, which the fake API server does not."""
    fake.requests.clear()
    env["cluster"].pending = {"train"}
    assert run(env, "support-29000000")["status"] == "skipped"
    env["cluster"].pending = set()
    assert run(env, "support-29010080")["status"] == "promoted"
    dataset(env["s3"], "tickets", 2)
    env["cluster"].losses = {"eval-new": 1.8, "eval-base": 1.5}
    assert run(env, "support-29020160")["status"] == "rejected"

    made = {authorized_as(r) for r in fake.requests}
    assert {verb for _, _, verb, _ in made} >= {"create", "get", "list", "delete"}
    assert [authorized_as(r) for r in fake.requests if not allowed(r)] == []
    # What the Role does not allow is seen as such: nodes are cluster-wide, CronJobs not its own.
    nodes = replace(fake.requests[0], method="GET", path="/api/v1/nodes", query={})
    cronjob = replace(nodes, path=f"/apis/batch/v1/namespaces/{OUTPUTS.namespace}/cronjobs/x")
    assert authorized_as(nodes) == ("", "nodes", "list", None)
    assert authorized_as(cronjob) == ("batch", "cronjobs", "get", OUTPUTS.namespace)
    assert not allowed(nodes) and not allowed(cronjob)
