"""Pipelines: their definition and every refusal with its message, the gate, the CronJob they
run as (strictly valid against Kubernetes 1.35 with kubernetes-validate) and the commands that
manage them, against moto and the fake API server with the real kubernetes client."""

from __future__ import annotations

import json
import math
from typing import Any

import boto3
import pytest
import test_trnctl_kube
import yaml
from fake_kube import FakeKube
from test_trnctl_aws import OUTPUTS

from constructs_lib import _eks
from tests.conformance import kube_objects
from trnctl import pipelines, versioning
from trnctl.errors import ExitCode, TrnctlError
from trnctl.pipelines import Gate, Pipeline

fake = test_trnctl_kube.fake
BUCKET = OUTPUTS.datasets_bucket

BASE: dict[str, Any] = {
    "name": "support",
    "environment": "trn-dev",
    "schedule": "0 3 * * 1",
    "model": "models/llama",
    "data": "datasets/tickets",
    "eval_data": "datasets/tickets-eval",
    "gate": "eval_loss <= current - 0.01",
}


def pipeline(**changes: Any) -> Pipeline:
    return Pipeline(**{**BASE, **changes})


CREATE = (
    "pipeline", "create", "support", "--env", "trn-dev", "--schedule", "0 3 * * 1",
    "--model", "models/llama", "--data", "datasets/tickets", "--eval-data",
    "datasets/tickets-eval", "--gate", "eval_loss <= current - 0.01", "--max-steps", "50",
)  # fmt: skip


# --- the gate ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "candidate", "current", "holds"),
    [
        ("eval_loss <= current - 0.01", 1.69, 1.70, True),
        ("eval_loss <= current - 0.01", 1.695, 1.70, False),
        ("eval_loss<current", 1.69, 1.70, True),
        ("eval_loss < current", 1.70, 1.70, False),
        ("eval_loss <= current + 0.05", 1.74, 1.70, True),
        ("eval_loss <= 1.5", 1.5, None, True),
        ("eval_loss >= 1.5", 1.4, None, False),
        ("eval_loss <= current", math.nan, 1.70, False),
        ("accuracy >= current + 0.02", 0.93, 0.91, True),
        ("macro_f1 > current", 0.80, 0.80, False),
    ],
)
def test_the_gate_compares_the_candidate_with_the_model_in_service(
    text: str, candidate: float, current: float | None, holds: bool
) -> None:
    assert Gate.parse(text).holds(candidate, current) is holds


def test_the_gate_says_what_it_compared() -> None:
    gate = Gate.parse("eval_loss <= current - 0.01")

    assert gate.describe(1.62, 1.71) == (
        "eval_loss 1.6200 <= 1.7000 (current 1.7100 - 0.0100): holds"
    )
    assert str(gate) == "eval_loss <= current - 0.01"
    assert str(Gate.parse("eval_loss < 2")) == "eval_loss < 2"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "loss <= current",
            "--gate 'loss <= current': unknown metric 'loss'; use eval_loss, accuracy, macro_f1 "
            "(accuracy and macro_f1 of classification data)",
        ),
        ("eval_loss == current", f"--gate 'eval_loss == current' is not {pipelines.GATE_FORM}"),
        ("eval_loss <= current * 0.9", "is not METRIC OP current"),
        ("", "is not METRIC OP current"),
    ],
)
def test_a_bad_gate_is_refused(text: str, message: str) -> None:
    with pytest.raises(TrnctlError, match=_re(message)):
        Gate.parse(text)


def _re(text: str) -> str:
    import re

    return re.escape(text)


# --- the schedule and the definition ----------------------------------------------------------


@pytest.mark.parametrize(
    "schedule",
    ["0 3 * * 1", "*/15 * * * *", "0 0 1,15 * ?", "30 2 * JAN-MAR mon-fri", "0 0-23/2 * * *",
     "@weekly", "@midnight"],
)  # fmt: skip
def test_schedules_kubernetes_takes(schedule: str) -> None:
    assert pipeline(schedule=schedule).schedule == schedule


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (
            "0 3 * *",
            "--schedule '0 3 * *' has 4 fields; a cron schedule has 5: minute hour day-of-month "
            "month day-of-week, e.g. '0 3 * * 1' (Mondays at 03:00)",
        ),
        (
            "60 3 * * 1",
            "--schedule '60 3 * * 1': minute '60' is not a cron field of 0-59 (*, ?, lists a,b, "
            "ranges a-b and steps /n)",
        ),
        ("0 3 0 * *", "day of month '0' is not a cron field of 1-31"),
        ("0 3 * 13 *", "month '13' is not a cron field of 1-12 or JAN-DEC"),
        ("0 3 * * 7", "day of week '7' is not a cron field of 0-6 or SUN-SAT"),
        ("0 3 * * 5-1", "day of week '5-1'"),
        ("*/0 * * * *", "minute '*/0'"),
        # Digits the API server's parser (Go's strconv.Atoi) does not read: refused, not a crash.
        ("*/\u00b2 * * * *", "minute '*/\u00b2' is not a cron field of 0-59"),
        ("\u0663 3 * * 1", "minute '\u0663' is not a cron field of 0-59"),
        ("0 3 * * \uff11", "day of week '\uff11' is not a cron field of 0-6"),
        ("@fortnightly", "use one of @yearly, @annually, @monthly, @weekly, @daily"),
        (
            "TZ=Europe/Berlin 0 3 * * 1",
            "a time zone goes in --time-zone, not the schedule (Kubernetes refuses TZ= and "
            "CRON_TZ= there)",
        ),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_field(schedule: str, message: str) -> None:
    with pytest.raises(TrnctlError, match=_re(message)) as error:
        pipeline(schedule=schedule)
    assert error.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "Support"}, "pipeline name 'Support' is not allowed: use lowercase letters"),
        ({"name": "s" * 34}, f"at most {pipelines.MAX_NAME} characters"),
        (
            {"data": "datasets/tickets@v2"},
            "--data 'datasets/tickets@v2': a pipeline trains on the newest version of a "
            "versioned dataset: datasets/NAME",
        ),
        ({"data": "corpora/x"}, "--data 'corpora/x': a pipeline trains on the newest version"),
        ({"eval_data": "evals/x"}, "--eval-data 'evals/x': name a versioned dataset"),
        ({"model": "llama"}, "--model 'llama' is not models/NAME or models/NAME@vN"),
        ({"register_as": "Bad"}, "--register-as 'models/Bad': 'Bad' cannot name a versioned"),
        ({"nodes": 0}, "--nodes 0 is not allowed; use 1 to 128"),
        ({"capacity_wait_minutes": 0}, "--capacity-wait-minutes 0 is not allowed; use 1 to 1440"),
        (
            {"training": {"max_steps": 5, "epochs": 1}},
            "--max-steps and --epochs exclude each other",
        ),
        ({"training": {"lora_rank": 0}}, "--lora-rank 0 is not allowed; use 1 or more"),
        ({"training": {"warmup": 3}}, "training settings ['warmup'] are unknown"),
    ],
)
def test_a_bad_pipeline_is_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(TrnctlError, match=_re(message)):
        pipeline(**changes)


def test_a_pipeline_travels_as_json_and_registers_under_its_name_by_default() -> None:
    made = pipeline(training={"max_steps": 50, "lora_rank": 8})

    assert Pipeline.from_json(made.to_json()) == made
    assert made.register_as == "support"
    assert str(made.registered) == "models/support"
    with pytest.raises(TrnctlError, match="not a pipeline definition"):
        Pipeline.from_json('{"name": "x"}')


# --- the CronJob ------------------------------------------------------------------------------


def test_the_cronjob_runs_the_controller_once_at_a_time_under_its_service_account() -> None:
    cronjob = pipelines.render_cronjob(pipeline(), OUTPUTS)

    spec = cronjob["spec"]
    assert spec["schedule"] == "0 3 * * 1" and spec["timeZone"] == "Etc/UTC"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] == 600
    assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (5, 5)
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trn-pipelines"
    assert pod["nodeSelector"] == _eks.SYSTEM_LABEL
    (container,) = pod["containers"]
    assert container["image"] == OUTPUTS.image_uri
    assert container["command"] + container["args"] == [
        "python3", "-m", "trnctl", "pipeline", "tick", "support", "--env", "trn-dev",
    ]  # fmt: skip
    env = {e["name"]: e for e in container["env"]}
    assert Pipeline.from_json(env["TRN_PIPELINE"]["value"]) == pipeline()
    assert env["TRN_PIPELINE_JOB"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['batch.kubernetes.io/job-name']"
    )
    assert pipelines.pipeline_of(cronjob) == pipeline()


def test_the_cronjob_and_a_manual_job_are_strictly_valid_kubernetes_objects() -> None:
    cronjob = pipelines.render_cronjob(pipeline(), OUTPUTS, suspend=True)
    served = {**cronjob, "metadata": {**cronjob["metadata"], "uid": "0b4d5c1e-uid"}}
    manual = pipelines.manual_job(served, "support-now-1202080000")

    assert kube_objects.problems(cronjob) == []
    assert kube_objects.problems(manual) == []


def test_a_manual_job_needs_the_cronjob_as_the_api_server_returns_it() -> None:
    """Its owner reference names the CronJob's uid, which only the API server knows."""
    cronjob = pipelines.render_cronjob(pipeline(), OUTPUTS)

    with pytest.raises(ValueError, match=_re("CronJob 'support' has no metadata.uid")):
        pipelines.manual_job(cronjob, "support-now-1202080000")


def test_an_unknown_field_would_be_caught() -> None:
    """The check is strict: a field Kubernetes 1.35 does not know is a problem."""
    cronjob = pipelines.render_cronjob(pipeline(), OUTPUTS)
    cronjob["spec"]["concurrency"] = "Forbid"

    assert kube_objects.problems(cronjob) != []


def test_dry_run_prints_the_cronjob_and_calls_nothing(trnctl: Any, moto: None) -> None:
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=OUTPUTS.to_json(), Type="String"
    )

    run = trnctl(*CREATE, "--dry-run")

    assert run.exit_code == 0, run.stderr
    cronjob = yaml.safe_load(run.stdout)
    assert kube_objects.problems(cronjob) == []
    assert pipelines.pipeline_of(cronjob).training == {"max_steps": 50}


# --- the commands against the fake API server -------------------------------------------------


def staged(s3: Any) -> None:
    """The base model and both datasets, as versions the registry and data stage record."""
    for area, name, status in (
        ("models", "llama", {"status": "promoted"}),
        ("datasets", "tickets", {}),
        ("datasets", "tickets-eval", {}),
    ):
        ref = versioning.Ref(area, name, 1)
        versioning.put_json(s3, BUCKET, ref.record_key(), {"state": "complete", **status})
        if area == "datasets":
            versioning.put_json(s3, BUCKET, f"{ref.root}/latest", {"version": "v1"})


@pytest.fixture
def s3(fake: FakeKube) -> Any:
    client = boto3.client("s3")
    client.create_bucket(
        Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-east-2"}
    )
    return client


def test_create_applies_the_cronjob_and_again_replaces_it(
    trnctl: Any, fake: FakeKube, s3: Any
) -> None:
    staged(s3)

    first = trnctl(*CREATE)
    second = trnctl(*CREATE[:-1], "80")

    assert first.exit_code == 0, first.stderr
    assert first.stdout.startswith(
        "created pipeline support (CronJob support in training): 0 3 * * 1 Etc/UTC, "
        "datasets/tickets -> models/support gated on eval_loss <= current - 0.01;"
    )
    assert second.stdout.startswith("replaced pipeline support")
    stored = fake.cronjobs["support"]
    assert pipelines.pipeline_of(stored).training == {"max_steps": 80}
    assert kube_objects.problems({k: v for k, v in stored.items() if k != "status"}) == []


def test_create_refuses_data_that_is_not_staged(trnctl: Any, fake: FakeKube, s3: Any) -> None:
    run = trnctl(*CREATE)

    assert run.exit_code == ExitCode.NOT_FOUND
    assert "model models/llama is not staged" in run.stderr
    assert fake.cronjobs == {}


def test_list_show_pause_resume_run_now_and_delete(trnctl: Any, fake: FakeKube, s3: Any) -> None:
    staged(s3)
    assert trnctl(*CREATE).exit_code == 0

    paused = trnctl("pipeline", "pause", "support", "--env", "trn-dev")
    listed = trnctl("pipeline", "list", "--env", "trn-dev")
    shown = json.loads(trnctl("pipeline", "show", "support", "--env", "trn-dev").stdout)
    resumed = trnctl("pipeline", "resume", "support", "--env", "trn-dev")
    uid = fake.cronjobs["support"]["metadata"]["uid"]
    now = trnctl("pipeline", "run-now", "support", "--env", "trn-dev")
    deleted = trnctl("pipeline", "delete", "support", "--env", "trn-dev")
    gone = trnctl("pipeline", "show", "support", "--env", "trn-dev")

    assert paused.stdout == "paused pipeline support\n"
    row = next(line for line in listed.stdout.splitlines() if "support" in line)
    assert "0 3 * * 1 Etc/UTC" in row and "yes" in row and "datasets/tickets" in row
    assert shown["paused"] is True and shown["pipeline"]["gate"] == BASE["gate"]
    assert shown["last_run"] is None
    assert resumed.exit_code == 0
    (job,) = fake.batch_jobs.values()
    assert job["metadata"]["annotations"] == {"cronjob.kubernetes.io/instantiate": "manual"}
    # As kubectl create job --from: the CronJob controls it (history limits, deleted with it).
    assert job["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "name": "support",
            "uid": uid,
            "controller": True,
        }
    ]
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "trn-pipelines"
    assert now.stdout.startswith("started run ")
    assert deleted.exit_code == 0 and fake.cronjobs == {}
    assert gone.exit_code == ExitCode.NOT_FOUND
    assert (
        gone.stderr == "trnctl: pipeline 'support' not found (no CronJob support in 'training')\n"
    )


def test_history_of_a_pipeline_without_runs_is_not_found(
    trnctl: Any, fake: FakeKube, s3: Any
) -> None:
    run = trnctl("pipeline", "history", "support", "--env", "trn-dev")

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr == (
        f"trnctl: pipeline support has no runs in s3://{BUCKET}/pipelines/support/runs/\n"
    )


def test_tick_outside_a_pipeline_pod_is_refused(trnctl: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("TRN_PIPELINE", raising=False)
    monkeypatch.delenv("TRN_PIPELINE_JOB", raising=False)

    run = trnctl("pipeline", "tick", "support", "--env", "trn-dev")

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr == (
        "trnctl: pipeline tick runs in the pipeline's pod: TRN_PIPELINE_JOB and TRN_PIPELINE "
        "are not set\n"
    )


def test_in_a_pod_trnctl_uses_its_service_account(monkeypatch: Any, tmp_path: Any) -> None:
    """The controller's pod reaches the API server as its ServiceAccount (token and CA mounted by
    the kubelet), not through EKS and STS; outside a pod nothing says it is in one."""
    from trnctl import kube

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert kube.in_cluster() is False
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "ca.crt").write_text("ca")
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT_DIR", str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.100.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")

    api = kube.connect_in_cluster()

    assert kube.in_cluster() is True
    config = api.configuration
    assert config.host == "https://10.100.0.1:443"
    assert config.ssl_ca_cert == str(tmp_path / "ca.crt")
    assert config.get_api_key_with_prefix("BearerToken") == "Bearer sa-token"


def test_the_controller_command_runs_as_the_cronjob_starts_it() -> None:
    """`python3 -m trnctl pipeline tick` (the CronJob's command) reaches the command."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "trnctl", "pipeline", "tick", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert "Run (or resume) one run of the pipeline" in done.stdout
