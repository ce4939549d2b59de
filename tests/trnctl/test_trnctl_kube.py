"""The Kubernetes side of `job` and `validate`: the EKS token and endpoint (botocore, moto) and the
real kubernetes client against a fake API server on 127.0.0.1 (tests/trnctl/fake_kube.py)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import botocore.session
import pytest
from fake_kube import FakeKube, serve, training_runtime
from test_trnctl_aws import OUTPUTS

import trn_catalog
from tests import warm
from trnctl import jobs, kube
from trnctl.errors import ExitCode, TrnctlError

SPEC = trn_catalog.get(OUTPUTS.instance_type)


def _runtime(efa: int = SPEC.efa_interfaces) -> dict[str, Any]:
    limits = {
        "aws.amazon.com/neuron": SPEC.chips,
        "vpc.amazonaws.com/efa": efa,
        "hugepages-2Mi": "5120Mi",
    }
    env = [{"name": "TRN_INSTANCE_TYPE", "value": SPEC.name}]
    pod = {"containers": [{"name": "node", "env": env, "resources": {"limits": limits}}]}
    return training_runtime(pod)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, moto: None) -> Iterator[FakeKube]:
    """trn-dev deployed in moto (SSM outputs, an EKS cluster) whose API endpoint is redirected
    to a fake API server; DescribeCluster and the STS token still run."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=OUTPUTS.to_json(), Type="String"
    )
    boto3.client("eks").create_cluster(
        name=OUTPUTS.cluster_name,
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-0123"]},
    )
    real = kube.describe
    for state in serve():
        state.runtime = _runtime()

        def describe(eks: Any, name: str, state: FakeKube = state) -> kube.ClusterEndpoint:
            return replace(real(eks, name), url=state.url, ca_data=None)

        monkeypatch.setattr(kube, "describe", describe)
        yield state


# --- token and endpoint -------------------------------------------------------------------


def test_token_is_a_presigned_get_caller_identity_url_signing_the_cluster_header() -> None:
    session = botocore.session.get_session()
    sts = session.create_client("sts", region_name="us-east-2")

    token = kube.token(sts, "trn-dev")

    assert token.startswith("k8s-aws-v1.")
    assert "=" not in token
    encoded = token.removeprefix("k8s-aws-v1.")
    url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert parts.scheme == "https"
    assert parts.hostname == "sts.us-east-2.amazonaws.com"
    assert query["Action"] == "GetCallerIdentity"
    assert query["Version"] == "2011-06-15"
    assert query["X-Amz-Expires"] == "60"
    assert query["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert query["X-Amz-Credential"].startswith("testing/")
    assert "x-k8s-aws-id" in query["X-Amz-SignedHeaders"].split(";")
    # The handler is removed again: a later presign does not sign the header.
    plain = sts.generate_presigned_url("get_caller_identity", Params={})
    assert "x-k8s-aws-id" not in plain


def test_describe_reads_endpoint_and_ca(moto: None, tmp_path: Path) -> None:
    eks = boto3.client("eks")
    eks.create_cluster(
        name="c1",
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-0123"]},
    )
    found = eks.describe_cluster(name="c1")["cluster"]

    endpoint = kube.describe(eks, "c1")
    config = kube.configuration(endpoint, lambda: "k8s-aws-v1.x")

    assert endpoint.url == found["endpoint"]
    assert config.host == found["endpoint"].rstrip("/")
    ca = Path(config.ssl_ca_cert).read_bytes()
    assert ca == base64.b64decode(found["certificateAuthority"]["data"])
    assert config.auth_settings()["BearerToken"]["value"] == "Bearer k8s-aws-v1.x"


def test_describe_of_a_missing_cluster_is_not_found(moto: None) -> None:
    with pytest.raises(TrnctlError, match="EKS cluster 'gone' not found in us-east-2") as e:
        kube.describe(boto3.client("eks"), "gone")
    assert e.value.exit_code == ExitCode.NOT_FOUND


def test_the_token_is_renewed_after_ten_minutes() -> None:
    now = [0.0]
    made: list[str] = []

    def make() -> str:
        made.append(f"t{len(made)}")
        return made[-1]

    config = kube.configuration(
        kube.ClusterEndpoint("c", "https://x", None), make, clock=lambda: now[0]
    )
    first = config.auth_settings()["BearerToken"]["value"]
    now[0] = kube.TOKEN_REFRESH_S - 1
    same = config.auth_settings()["BearerToken"]["value"]
    now[0] = kube.TOKEN_REFRESH_S + 1
    renewed = config.auth_settings()["BearerToken"]["value"]

    assert (first, same, renewed) == ("Bearer t0", "Bearer t0", "Bearer t1")


def test_cluster_missing_from_eks_is_one_line(moto: None, trnctl: Any) -> None:
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=OUTPUTS.to_json(), Type="String"
    )

    run = trnctl("job", "status", "run-1", "--env", "trn-dev")

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr == (
        "trnctl: EKS cluster 'trn-dev' not found in us-east-2: the environment's outputs name a "
        "cluster that is gone; redeploy the cluster stack\n"
    )


# --- job submit / status / logs ----------------------------------------------------------

SUBMIT = ("job", "submit", "--env", "trn-dev", "--preset", "tiny", "--data", "d", "--name", "run-1")


def test_submit_creates_the_trainjob_with_an_eks_token(fake: FakeKube, trnctl: Any) -> None:
    run = trnctl(*SUBMIT, "--nodes", "2")

    assert run.exit_code == 0, run.stderr
    assert "submitted TrainJob run-1: 2 x trn2.48xlarge, preset tiny, in training" in run.stdout
    created = fake.trainjobs["run-1"]
    assert created["spec"]["trainer"]["numNodes"] == 2
    jobs.check_schema(created)
    (post,) = [r for r in fake.requests if r.method == "POST"]
    assert post.path == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/training/trainjobs"
    assert post.headers["authorization"].startswith("Bearer k8s-aws-v1.")
    assert [f"{r.method} {r.path.rsplit('/', 2)[-2:]}" for r in fake.requests] == [
        "GET ['trainingruntimes', 'neuron-torch']",
        "POST ['training', 'trainjobs']",
    ]


@pytest.mark.parametrize(
    ("setup", "code", "line"),
    [
        (
            lambda f: setattr(f, "runtime", _runtime(efa=8)),
            ExitCode.FAILED,
            "trnctl: TrainingRuntime neuron-torch in training does not match the catalog for "
            "trn2.48xlarge: vpc.amazonaws.com/efa 8 (catalog: 16); redeploy the workloads stack\n",
        ),
        (
            lambda f: setattr(f, "runtime", None),
            ExitCode.NOT_FOUND,
            "trnctl: TrainingRuntime 'neuron-torch' not found in namespace 'training': deploy the "
            "workloads stack (it installs Kubeflow Trainer and the runtime)\n",
        ),
        (
            lambda f: f.errors.update(
                create=(403, 'trainjobs is forbidden: User "dev" cannot create resource')
            ),
            ExitCode.AWS,
            "trnctl: the Kubernetes API refused to create TrainJob run-1 in training (403 "
            'Forbidden): trainjobs is forbidden: User "dev" cannot create resource; grant the '
            "IAM principal an EKS access entry with rights in the namespace\n",
        ),
        (
            lambda f: f.trainjobs.update({"run-1": {}}),
            ExitCode.USAGE,
            "trnctl: cannot create TrainJob run-1 in training: trainjobs.trainer.kubeflow.org "
            '"run-1" already exists\n',
        ),
        (
            lambda f: f.errors.update(create=(404, "the server could not find the resource")),
            ExitCode.NOT_FOUND,
            "trnctl: the cluster does not serve TrainJobs in namespace 'training': is Kubeflow "
            "Trainer installed and the namespace deployed?\n",
        ),
    ],
    ids=["runtime-drift", "no-runtime", "forbidden", "exists", "no-crd"],
)
def test_submit_errors_are_one_line(
    fake: FakeKube, trnctl: Any, setup: Any, code: int, line: str
) -> None:
    setup(fake)

    run = trnctl(*SUBMIT)

    assert run.exit_code == code
    assert run.stderr == line


def test_unreachable_api_server_is_one_line(
    fake: FakeKube, trnctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = warm.free_port()
    monkeypatch.setattr(
        kube,
        "describe",
        lambda eks, name: kube.ClusterEndpoint(name, f"http://127.0.0.1:{port}", None),
    )

    run = trnctl("job", "status", "run-1", "--env", "trn-dev")

    assert run.exit_code == ExitCode.AWS
    assert run.stderr.startswith("trnctl: cannot reach the Kubernetes API to read TrainJob run-1 ")
    assert run.stderr.endswith("(private endpoints need a VPN or bastion)\n")
    assert run.stderr.count("\n") == 1


def _finished(kind: str) -> dict[str, Any]:
    return {
        "conditions": [
            {
                "type": "Created",
                "status": "True",
                "reason": "JobsCreationSucceeded",
                "message": "Succeeded to create Jobs",
                "lastTransitionTime": "2026-12-01T12:00:00Z",
            },
            {
                "type": kind,
                "status": "True",
                "reason": "JobSet" + kind,
                "message": f"jobset {kind.lower()}",
                "lastTransitionTime": "2026-12-01T12:30:00Z",
            },
        ]
    }


def test_status_shows_conditions_and_pods_per_node(fake: FakeKube, trnctl: Any) -> None:
    fake.trainjobs["run-1"] = {"metadata": {"name": "run-1"}}
    fake.statuses["run-1"] = [_finished("Complete")]
    for index in (1, 0):
        fake.add_pod("run-1", index, "")
    fake.add_pod("other", 0, "")

    run = trnctl("job", "status", "run-1", "--env", "trn-dev")

    assert run.exit_code == 0, run.stderr
    assert "JobsCreationSucceeded" in run.stdout
    assert "Complete" in run.stdout
    lines = [line for line in run.stdout.splitlines() if "run-1-node-0-" in line]
    assert len(lines) == 2
    assert "run-1-node-0-0-abcde" in lines[0]
    assert "ip-10-0-0-10.ec2.internal" in lines[0]
    (pods,) = [r for r in fake.requests if r.path.endswith("/pods")]
    assert pods.query["labelSelector"] == [
        "jobset.sigs.k8s.io/jobset-name=run-1,jobset.sigs.k8s.io/replicatedjob-name=node"
    ]


def test_status_of_a_failed_job_exits_1(fake: FakeKube, trnctl: Any) -> None:
    fake.trainjobs["run-1"] = {"metadata": {"name": "run-1"}}
    fake.statuses["run-1"] = [_finished("Failed")]

    run = trnctl("job", "status", "run-1", "--env", "trn-dev")

    assert run.exit_code == ExitCode.FAILED
    assert "JobSetFailed" in run.stdout


@pytest.mark.parametrize("command", ["status", "logs"])
def test_unknown_job_is_not_found(fake: FakeKube, trnctl: Any, command: str) -> None:
    run = trnctl("job", command, "nope", "--env", "trn-dev")

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr == "trnctl: TrainJob 'nope' not found in namespace 'training'\n"


def test_status_forbidden_is_one_line(fake: FakeKube, trnctl: Any) -> None:
    fake.errors["get"] = (403, "trainjobs is forbidden")

    run = trnctl("job", "status", "run-1", "--env", "trn-dev")

    assert run.exit_code == ExitCode.AWS
    assert run.stderr.startswith(
        "trnctl: the Kubernetes API refused to read TrainJob run-1 in training (403 Forbidden)"
    )


def test_logs_read_the_rank_0_pod(fake: FakeKube, trnctl: Any) -> None:
    fake.trainjobs["run-1"] = {"metadata": {"name": "run-1"}}
    fake.add_pod("run-1", 1, "rank one\n")
    fake.add_pod("run-1", 0, "step 1 loss 5.0\nstep 2 loss 4.0\n")

    plain = trnctl("job", "logs", "run-1", "--env", "trn-dev")
    followed = trnctl("job", "logs", "run-1", "--env", "trn-dev", "--follow")

    assert plain.exit_code == 0, plain.stderr
    assert plain.stdout == "step 1 loss 5.0\nstep 2 loss 4.0\n"
    assert followed.stdout == plain.stdout
    logs = [r for r in fake.requests if r.path.endswith("/log")]
    assert {r.path for r in logs} == {"/api/v1/namespaces/training/pods/run-1-node-0-0-abcde/log"}
    assert all(r.query["container"] == ["node"] for r in logs)
    # What the client sends; the server parses it. The plain read also asks for the previous
    # container's log, which a container that never restarted does not have (400).
    assert [r.query.get("follow") for r in logs] == [None, None, ["True"]]
    assert [r.query.get("previous") for r in logs] == [["False"], ["True"], None]


def test_logs_of_a_restarted_container_keep_the_previous_attempt(
    fake: FakeKube, trnctl: Any
) -> None:
    fake.trainjobs["run-1"] = {"metadata": {"name": "run-1"}}
    fake.add_pod("run-1", 0, "step 1 loss 5.0\n", previous_log="Traceback: boom")

    run = trnctl("job", "logs", "run-1", "--env", "trn-dev")

    assert run.exit_code == 0, run.stderr
    assert run.stdout == (
        "Traceback: boom\n--- run-1-node-0-0-abcde: the container restarted; the log of the "
        "current one follows ---\nstep 1 loss 5.0\n"
    )


def test_logs_without_a_pod_yet(fake: FakeKube, trnctl: Any) -> None:
    fake.trainjobs["run-1"] = {"metadata": {"name": "run-1"}}

    run = trnctl("job", "logs", "run-1", "--env", "trn-dev")

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr == (
        "trnctl: TrainJob 'run-1' has no pod for node 0 yet; see trnctl job status run-1 "
        "--env trn-dev\n"
    )


# --- validate ----------------------------------------------------------------------------


def _line(index: int, **overrides: Any) -> str:
    report = {
        "node": f"v-node-0-{index}",
        "node_rank": index,
        "neuron_devices": SPEC.chips,
        "neuron_cores": SPEC.neuron_cores,
        "efa_interfaces": SPEC.efa_interfaces,
        "stack": "native",
        "device": "neuron",
        "allreduce_ok": True,
        "allreduce_gbps": 812.5,
        "world_size": 2 * SPEC.logical_neuron_cores,
        "backend": "neuron",
    }
    return json.dumps({**report, **overrides})


def _validation_job(fake: FakeKube, logs: dict[int, str], *, polls: int = 2) -> None:
    """On create: pods with ``logs`` by node index; the job completes after ``polls`` GETs."""

    def created(job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        fake.statuses[name] = [{"conditions": []}] * polls + [_finished("Complete")]
        for index, log in logs.items():
            fake.add_pod(name, index, log)

    fake.on_create = created


VALIDATE = ("validate", "--env", "trn-dev", "--name", "v", "--poll", "0.01")


def test_validate_passes_when_every_node_matches_the_catalog(fake: FakeKube, trnctl: Any) -> None:
    _validation_job(fake, {0: "compile cache: x\n" + _line(0) + "\n", 1: _line(1) + "\n"})

    run = trnctl(*VALIDATE)

    assert run.exit_code == 0, run.stderr
    created = fake.trainjobs["v"]
    assert created["spec"]["trainer"]["command"] == ["python3", "-m", "trainer.validate_node"]
    assert created["spec"]["trainer"]["numNodes"] == OUTPUTS.trn_nodes
    rows = [line for line in run.stdout.splitlines() if "v-node-0-" in line]
    assert len(rows) == 2
    assert all("pass" in row and "16/16" in row and "812.5" in row for row in rows)


@pytest.mark.parametrize(
    ("logs", "line"),
    [
        (
            {0: _line(0), 1: _line(1, efa_interfaces=8)},
            "trnctl: validation failed on 1 of 2 nodes: node 1: EFA interfaces 8, catalog 16\n",
        ),
        (
            {0: _line(0), 1: "Traceback (most recent call last):\n{not json\n"},
            "trnctl: validation failed on 1 of 2 nodes: node 1: no validation result line in "
            "the pod's log\n",
        ),
        (
            {0: _line(0, allreduce_ok=False, error="connection refused"), 1: _line(1)},
            "trnctl: validation failed on 1 of 2 nodes: node 0: all-reduce failed: connection "
            "refused\n",
        ),
        (
            {0: _line(0, neuron_devices=15)},
            "trnctl: validation failed on 2 of 2 nodes: node 0: neuron devices 15, catalog 16 | "
            "node 1: no pod\n",
        ),
        (
            {0: _line(0), 1: _line(1, device="auto", backend="gloo")},
            "trnctl: validation failed on 1 of 2 nodes: node 1: all-reduce ran on gloo (CPU over "
            "TCP), not neuron (the native stack's Neuron backend)\n",
        ),
        (
            {0: _line(0, stack="xla", device="xla"), 1: _line(1, stack="xla", device="xla")},
            "trnctl: validation failed on 2 of 2 nodes: node 0: all-reduce ran on neuron, not "
            "xla (the xla stack's Neuron backend) | node 1: all-reduce ran on neuron, not xla "
            "(the xla stack's Neuron backend)\n",
        ),
        (
            {0: _line(0), 1: _line(1, stack=None, backend=None)},
            "trnctl: validation failed on 1 of 2 nodes: node 1: all-reduce ran on an unreported "
            "backend, not a Neuron backend (neuron or xla)\n",
        ),
        (
            {
                0: _line(0),
                1: "starting\n",
            },
            "trnctl: validation failed on 1 of 2 nodes: node 1: no validation result line in "
            "the pod's log\n",
        ),
    ],
    ids=[
        "efa-count",
        "malformed",
        "allreduce",
        "device-count-and-missing-node",
        "cpu-over-tcp",
        "wrong-neuron-backend",
        "no-backend",
        "no-line",
    ],
)
def test_validate_failures_are_one_line(
    fake: FakeKube, trnctl: Any, logs: dict[int, str], line: str
) -> None:
    _validation_job(fake, logs)

    run = trnctl(*VALIDATE)

    assert run.exit_code == ExitCode.FAILED
    assert run.stderr.splitlines()[-1] + "\n" == line
    assert "fail" in run.stdout


def test_validate_passes_on_the_xla_stack(fake: FakeKube, trnctl: Any) -> None:
    xla = {"stack": "xla", "device": "xla", "backend": "xla"}
    _validation_job(fake, {0: _line(0, **xla), 1: _line(1, **xla)})

    run = trnctl(*VALIDATE)

    assert run.exit_code == 0, run.stderr


def test_validate_reads_a_restarted_worker_s_previous_container(
    fake: FakeKube, trnctl: Any
) -> None:
    """The runtime's pods restart on failure: the failing attempt's result line is in the
    previous container's log, and the verdict names its error."""
    failed = _line(1, allreduce_ok=False, allreduce_gbps=None, error="Neuron device not found")

    def created(job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        fake.statuses[name] = [{"conditions": []}, _finished("Failed")]
        fake.add_pod(name, 0, _line(0) + "\n")
        fake.add_pod(name, 1, "compile cache: x\n", phase="Running", previous_log=failed + "\n")

    fake.on_create = created

    run = trnctl(*VALIDATE)

    assert run.exit_code == ExitCode.FAILED
    assert run.stderr.splitlines()[-1] == (
        "trnctl: validation failed on 1 of 2 nodes: node 1: all-reduce failed: Neuron device "
        "not found"
    )
    pod_1 = [r for r in fake.requests if r.path.endswith("/v-node-0-1-abcde/log")]
    assert [r.query["previous"] for r in pod_1] == [["False"], ["True"]]


def test_validate_times_out(fake: FakeKube, trnctl: Any) -> None:
    _validation_job(fake, {}, polls=10_000)

    run = trnctl(*VALIDATE, "--timeout", "0.2")

    assert run.exit_code == ExitCode.FAILED
    assert run.stderr.splitlines()[-1] == (
        "trnctl: validation job v did not finish within 0.2 s (pods: none); see trnctl job "
        "status v --env trn-dev"
    )


def test_validate_dry_run_prints_the_job(moto: None, trnctl: Any) -> None:
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=OUTPUTS.to_json(), Type="String"
    )

    run = trnctl("validate", "--env", "trn-dev", "--dry-run")

    assert run.exit_code == 0, run.stderr
    assert "command:\n    - python3\n    - -m\n    - trainer.validate_node\n" in run.stdout
    assert "numNodes: 2\n" in run.stdout
    assert "name: validate-" in run.stdout
