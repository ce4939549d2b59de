"""What users of `job` and `validate` meet: Kubernetes 401/403/5xx answers, one node's log among
several pods, a validation whose nodes pass while its job failed, and an environment whose
instance type is no longer in the catalog. The real CLI against the fake Kubernetes API."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
import test_trnctl_kube
from fake_kube import FakeKube
from test_trnctl_aws import OUTPUTS
from test_trnctl_kube import SUBMIT, VALIDATE, _finished, _line, _validation_job

from trnctl.errors import ExitCode

# trn-dev whose API server is the fake one of the job tests.
fake = test_trnctl_kube.fake
Trnctl = Callable[..., Any]

UNAUTHORIZED = "the IAM principal has no access entry on the cluster, or the clock is off\n"


@pytest.mark.parametrize(
    ("route", "args", "what"),
    [
        ("get", ("job", "status", "run-1", "--env", "trn-dev"), "read TrainJob run-1 in training"),
        ("runtime", SUBMIT, "read TrainingRuntime neuron-torch in training"),
        ("create", VALIDATE, "create TrainJob v in training"),
    ],
    ids=["status", "submit", "validate"],
)
def test_a_rejected_token_is_one_line_naming_access_entry_and_clock(
    fake: FakeKube, trnctl: Trnctl, route: str, args: tuple[str, ...], what: str
) -> None:
    """EKS answers 401 to a token it cannot map to an access entry and to one signed with a
    skewed clock; trnctl names both causes and exits 3, without a traceback."""
    fake.trainjobs["run-1"] = {"metadata": {"name": "run-1"}}
    fake.errors[route] = (401, "Unauthorized")

    run = trnctl(*args)

    assert run.exit_code == ExitCode.AWS
    assert run.stderr.splitlines()[-1] + "\n" == (
        f"trnctl: the Kubernetes API did not accept the EKS token to {what} (401): " + UNAUTHORIZED
    )
    assert "Traceback" not in run.stderr


def test_forbidden_log_read_is_one_line(fake: FakeKube, trnctl: Trnctl) -> None:
    fake.trainjobs["run-1"] = {"metadata": {"name": "run-1"}}
    fake.add_pod("run-1", 0, "step 1\n")
    fake.errors["log"] = (
        403,
        'pods "run-1-node-0-0-abcde" is forbidden: User "dev" cannot get resource "pods/log"',
    )

    run = trnctl("job", "logs", "run-1", "--env", "trn-dev")

    assert run.exit_code == ExitCode.AWS
    assert run.stderr == (
        "trnctl: the Kubernetes API refused to read the log of pod run-1-node-0-0-abcde in "
        'training (403 Forbidden): pods "run-1-node-0-0-abcde" is forbidden: User "dev" cannot '
        'get resource "pods/log"; grant the IAM principal an EKS access entry with rights in '
        "the namespace\n"
    )


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (500, "Internal error occurred: etcdserver: request timed out"),
        (503, "the server is currently unable to handle the request"),
    ],
)
def test_server_errors_are_one_line_and_exit_1(
    fake: FakeKube, trnctl: Trnctl, code: int, message: str
) -> None:
    fake.errors["create"] = (code, message)

    run = trnctl(*SUBMIT)

    assert run.exit_code == ExitCode.FAILED
    assert run.stderr == (
        f"trnctl: Kubernetes API error to create TrainJob run-1 in training ({code}): {message}\n"
    )


def _attempt(
    fake: FakeKube, job: str, index: int, suffix: str, created: datetime, log: str
) -> None:
    """A pod of node ``index`` named with ``suffix`` (as the Job controller names a retry) and
    created at ``created``."""
    name = fake.add_pod(job, index, log)
    pod = fake.pods[-1]
    pod["metadata"]["name"] = renamed = name.replace("abcde", suffix)
    pod["metadata"]["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    fake.logs[renamed] = fake.logs.pop(name)


def test_logs_of_one_node_among_several_pods(fake: FakeKube, trnctl: Trnctl) -> None:
    """`--node 1` reads node 1's pod, and of its attempts the newest, whichever name sorts
    last."""
    start = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    fake.trainjobs["run-1"] = {"metadata": {"name": "run-1"}}
    for index in (0, 2):
        _attempt(fake, "run-1", index, "qwert", start, f"node {index}\n")
    _attempt(fake, "run-1", 1, "zzzzz", start, "node 1, first attempt\n")
    _attempt(fake, "run-1", 1, "aaaaa", start + timedelta(minutes=5), "node 1, retried\n")
    _attempt(fake, "other", 1, "bbbbb", start + timedelta(hours=1), "another job\n")

    run = trnctl("job", "logs", "run-1", "--env", "trn-dev", "--node", "1")

    assert run.exit_code == 0, run.stderr
    assert run.stdout == "node 1, retried\n"
    (pods,) = [r for r in fake.requests if r.path.endswith("/pods")]
    assert pods.query["labelSelector"] == [
        "jobset.sigs.k8s.io/jobset-name=run-1,jobset.sigs.k8s.io/replicatedjob-name=node,"
        "batch.kubernetes.io/job-completion-index=1"
    ]


def test_logs_of_a_node_the_job_does_not_have(fake: FakeKube, trnctl: Trnctl) -> None:
    fake.trainjobs["run-1"] = {"metadata": {"name": "run-1"}}
    fake.add_pod("run-1", 0, "node 0\n")

    run = trnctl("job", "logs", "run-1", "--env", "trn-dev", "--node", "3")

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr == (
        "trnctl: TrainJob 'run-1' has no pod for node 3 yet; see trnctl job status run-1 "
        "--env trn-dev\n"
    )


def test_validate_fails_when_the_job_failed_though_every_node_passed(
    fake: FakeKube, trnctl: Trnctl
) -> None:
    def created(job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        fake.statuses[name] = [{"conditions": []}, _finished("Failed")]
        for index in (0, 1):
            fake.add_pod(name, index, _line(index) + "\n")

    fake.on_create = created

    run = trnctl(*VALIDATE)

    assert run.exit_code == ExitCode.FAILED
    rows = [line for line in run.stdout.splitlines() if "v-node-0-" in line]
    assert len(rows) == 2 and all("pass" in row for row in rows)
    assert "(v: Failed)" in run.stdout
    assert run.stderr.splitlines()[-1] == "trnctl: validation job v ended Failed"


@pytest.mark.parametrize(
    "args",
    [SUBMIT, VALIDATE],
    ids=["submit", "validate"],
)
def test_an_instance_type_that_left_the_catalog_stops_before_the_cluster(
    fake: FakeKube, trnctl: Trnctl, args: tuple[str, ...]
) -> None:
    """An environment deployed with a type this trnctl's catalog no longer lists: the command
    names the environment and the type and calls no Kubernetes API."""
    gone = OUTPUTS.to_json().replace('"trn2.48xlarge"', '"trn9.48xlarge"')
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=gone, Type="String", Overwrite=True
    )
    _validation_job(fake, {0: _line(0), 1: _line(1)})

    run = trnctl(*args)

    assert run.exit_code == ExitCode.FAILED
    assert run.stderr.startswith(
        "trnctl: environment 'trn-dev': instance type 'trn9.48xlarge' is not in the instance "
        "catalog; known: trn1.32xlarge, "
    )
    assert run.stderr.count("\n") == 1
    assert fake.requests == []
