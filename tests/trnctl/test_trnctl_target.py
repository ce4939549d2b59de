"""`trnctl job submit --target trn|gpu`: a trn-train run or a `-- COMMAND` job on the GPU node
group's cuda-torch runtime (the CUDA image, one rank per GPU of the catalog, the GPU type named),
the validations of --target, the drift check of the GPU runtime, and the target shown by
`job status` and `compare`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from fake_kube import FakeKube, serve, training_runtime
from test_trnctl_aws import OUTPUTS

import trn_catalog
from trn_catalog import workspace as ws
from trn_catalog.outputs import EnvironmentOutputs
from trnctl import compare, jobs, kube
from trnctl.errors import ExitCode, TrnctlError

GPU_OUTPUTS = dataclasses.replace(
    OUTPUTS,
    gpu_nodegroup="trn-dev-gpu-0a1b2c3d",
    gpu_instance_type="p5.48xlarge",
    gpu_nodes=2,
    gpu_image_uri="123456789012.dkr.ecr.us-east-2.amazonaws.com/trainer:1-cuda",
    gpu_runtime="cuda-torch",
)
COMMAND = ("torchrun", "train.py", "--device", "cuda")
DRY = ["job", "submit", "--env", "trn-dev", "--dry-run"]


def env_of(job: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in job["spec"]["trainer"].get("env", [])}


# --- rendering ------------------------------------------------------------------------------


def test_a_gpu_run_uses_the_cuda_runtime_image_and_a_rank_per_gpu() -> None:
    args = jobs.TrainingArgs("125m", "corpus", max_steps=10).argv("run-p5")
    job = jobs.render(name="run-p5", outputs=GPU_OUTPUTS, nodes=2, args=args, target="gpu")

    trainer = job["spec"]["trainer"]
    assert job["spec"]["runtimeRef"]["name"] == "cuda-torch" == ws.GPU_RUNTIME_NAME
    assert trainer["image"] == GPU_OUTPUTS.gpu_image_uri
    assert trainer["numProcPerNode"] == 8  # p5.48xlarge: 8 x H100
    assert trainer["numNodes"] == 2
    assert env_of(job) == {ws.GPU_INSTANCE_TYPE_ENV: "p5.48xlarge"}
    assert job["metadata"]["labels"][jobs.TARGET_LABEL] == "gpu"
    assert jobs.target_of(job) == "gpu"
    jobs.check_schema(job)


def test_a_trn_run_is_unchanged_but_for_its_target_label() -> None:
    args = jobs.TrainingArgs("125m", "corpus").argv("run-trn")
    job = jobs.render(name="run-trn", outputs=GPU_OUTPUTS, nodes=2, args=args)

    assert job["spec"]["runtimeRef"]["name"] == ws.RUNTIME_NAME
    assert job["spec"]["trainer"]["image"] == OUTPUTS.image_uri
    assert job["spec"]["trainer"]["numProcPerNode"] == 64  # trn2.48xlarge logical cores
    assert "env" not in job["spec"]["trainer"]
    assert jobs.target_of(job) == "trn"


@pytest.mark.parametrize("gpu_type", sorted(trn_catalog.GPU_CATALOG))
def test_every_gpu_type_runs_one_rank_per_gpu_of_the_catalog(gpu_type: str) -> None:
    outputs = dataclasses.replace(GPU_OUTPUTS, gpu_instance_type=gpu_type)
    job = jobs.render_command(
        name="run-mine", outputs=outputs, nodes=1, command=jobs.CommandArgs(COMMAND), target="gpu"
    )

    assert job["spec"]["trainer"]["numProcPerNode"] == trn_catalog.get_gpu(gpu_type).gpus
    assert env_of(job)[ws.GPU_INSTANCE_TYPE_ENV] == gpu_type


def test_a_gpu_command_job_keeps_the_checkpoint_and_metrics_files() -> None:
    args = jobs.CommandArgs(COMMAND, "/datasets/code/mine")
    job = jobs.render_command(
        name="run-mine", outputs=GPU_OUTPUTS, nodes=2, command=args, target="gpu"
    )

    trainer = job["spec"]["trainer"]
    assert trainer["command"][-4:] == ["--exec", "--workdir", "/datasets/code/mine", "--"]
    assert trainer["args"] == list(COMMAND)
    assert env_of(job) == {
        "TRN_CHECKPOINT_DIR": "/fsx/checkpoints/run-mine",
        "TRN_METRICS_FILE": "/fsx/checkpoints/run-mine/metrics.jsonl",
        ws.GPU_INSTANCE_TYPE_ENV: "p5.48xlarge",
    }
    # Where `trnctl compare run-mine --env E` reads it: the file trn-train writes for that name.
    assert env_of(job)["TRN_METRICS_FILE"] == jobs.metrics_path("run-mine")
    assert job["metadata"]["labels"][jobs.PURPOSE_LABEL] == "command"


def test_an_unknown_target_is_refused() -> None:
    with pytest.raises(TrnctlError, match=r"^--target 'tpu' is not allowed; use trn or gpu$"):
        jobs.check_target("tpu")


def test_gpu_without_a_gpu_group_says_how_to_add_one() -> None:
    with pytest.raises(
        TrnctlError,
        match=r"--target gpu: environment 'trn-dev' has no GPU node group; add one by deploying "
        r"it with -c gpu_instance_type=TYPE \(one of: p5\.48xlarge, .*\), e\.g\. "
        r"-c gpu_instance_type=p5\.48xlarge, or submit with --target trn",
    ) as raised:
        jobs.render(name="run-1", outputs=OUTPUTS, nodes=1, args=[], target="gpu")
    assert raised.value.exit_code == ExitCode.USAGE


def test_outputs_with_a_gpu_type_but_no_cuda_image_are_refused() -> None:
    outputs = dataclasses.replace(GPU_OUTPUTS, gpu_image_uri="")
    with pytest.raises(
        TrnctlError, match=r"names GPU type p5\.48xlarge but no gpu_image_uri in its outputs"
    ) as raised:
        jobs.render(name="run-1", outputs=outputs, nodes=1, args=[], target="gpu")
    assert raised.value.exit_code == ExitCode.FAILED


def test_a_gpu_type_that_left_the_catalog_is_refused() -> None:
    outputs = dataclasses.replace(GPU_OUTPUTS, gpu_instance_type="p4d.24xlarge")
    with pytest.raises(
        TrnctlError, match=r"'p4d\.24xlarge' is not in the GPU instance catalog"
    ) as raised:
        jobs.render(name="run-1", outputs=outputs, nodes=1, args=[], target="gpu")
    assert raised.value.exit_code == ExitCode.FAILED


# --- the CLI --------------------------------------------------------------------------------


def _deploy(outputs: EnvironmentOutputs) -> None:
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=outputs.to_json(), Type="String"
    )


@pytest.fixture
def no_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a dry run must not reach Kubernetes")

    monkeypatch.setattr(kube, "connect", refuse)


def test_submit_target_gpu_dry_runs_a_command_on_the_gpu_group(
    moto: None, no_kubernetes: None, trnctl: Any
) -> None:
    _deploy(GPU_OUTPUTS)

    run = trnctl(*DRY, "--target", "gpu", "--name", "run-p5", "--", *COMMAND)

    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    assert job["spec"]["runtimeRef"]["name"] == "cuda-torch"
    assert job["spec"]["trainer"]["numNodes"] == GPU_OUTPUTS.gpu_nodes  # default: all of them
    assert job["spec"]["trainer"]["numProcPerNode"] == 8
    assert job["spec"]["trainer"]["image"] == GPU_OUTPUTS.gpu_image_uri
    assert env_of(job)["TRN_METRICS_FILE"] == "/fsx/checkpoints/run-p5/metrics.jsonl"
    jobs.check_schema(job)


def test_submit_target_gpu_runs_trn_train_too(moto: None, no_kubernetes: None, trnctl: Any) -> None:
    _deploy(GPU_OUTPUTS)

    run = trnctl(*DRY, "--target", "gpu", "--preset", "tiny", "--data", "d", "--nodes", "1")

    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    assert job["spec"]["trainer"]["numNodes"] == 1
    assert job["spec"]["runtimeRef"]["name"] == "cuda-torch"
    assert job["spec"]["trainer"]["args"][:2] == ["--preset", "tiny"]


@pytest.mark.parametrize(
    ("outputs", "extra", "line"),
    [
        (
            GPU_OUTPUTS,
            ["--target", "gpu", "--preset", "tiny", "--data", "d", "--precompile"],
            "trnctl: --precompile only applies to Trainium and cannot go with --target gpu "
            "(--precompile: it fills the Neuron compile cache; CUDA compiles as it runs); leave "
            "it out\n",
        ),
        (
            OUTPUTS,
            ["--target", "gpu", "--", *COMMAND],
            "trnctl: --target gpu: environment 'trn-dev' has no GPU node group; add one by "
            "deploying it with -c gpu_instance_type=TYPE (one of: p5.48xlarge, p5en.48xlarge, "
            "p6-b200.48xlarge, g6e.48xlarge), e.g. -c gpu_instance_type=p5.48xlarge, or submit "
            "with --target trn\n",
        ),
        (
            GPU_OUTPUTS,
            ["--target", "tpu", "--", *COMMAND],
            "trnctl: --target 'tpu' is not allowed; use trn or gpu\n",
        ),
        (
            GPU_OUTPUTS,
            ["--target", "gpu", "--nodes", "3", "--", *COMMAND],
            "trnctl: --nodes 3 is more than the 2 GPU nodes of trn-dev; the pods would wait for "
            "capacity forever (scale the node group first)\n",
        ),
        (
            dataclasses.replace(GPU_OUTPUTS, gpu_nodes=0),
            ["--target", "gpu", "--", *COMMAND],
            "trnctl: the GPU node group of trn-dev has 0 nodes: a job would wait for capacity "
            "forever; redeploy with -c gpu_nodes=N (N >= 1) first\n",
        ),
        (
            dataclasses.replace(OUTPUTS, trn_nodes=0),
            ["--preset", "tiny", "--data", "d"],
            "trnctl: the trn node group of trn-dev has 0 nodes: a job would wait for capacity "
            "forever; redeploy with -c trn_nodes=N (N >= 1) first\n",
        ),
    ],
    ids=[
        "precompile",
        "no-gpu-group",
        "unknown-target",
        "too-many-nodes",
        "empty-gpu-group",
        "empty-trn-group",
    ],
)
def test_submit_target_errors_are_one_line(
    moto: None,
    no_kubernetes: None,
    trnctl: Any,
    outputs: EnvironmentOutputs,
    extra: list[str],
    line: str,
) -> None:
    _deploy(outputs)

    run = trnctl(*DRY, *extra)

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr == line


# --- against a (fake) cluster ---------------------------------------------------------------


def gpu_runtime(spec: trn_catalog.GpuInstanceSpec, **changes: Any) -> dict[str, Any]:
    """The cuda-torch runtime's parts the drift check reads, as the workspace writes them."""
    limits = {
        ws.GPU_RESOURCE: changes.get("gpus", spec.gpus),
        "vpc.amazonaws.com/efa": spec.efa_interfaces,
        "hugepages-2Mi": "5120Mi",
    }
    env = [{"name": ws.GPU_INSTANCE_TYPE_ENV, "value": spec.name}]
    pod = {
        "nodeSelector": changes.get(
            "selector",
            {ws.NODE_TYPE_LABEL: ws.GPU_NODE_TYPE, jobs.INSTANCE_TYPE_LABEL: spec.name},
        ),
        "tolerations": changes.get(
            "tolerations", [{"key": ws.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
        ),
        "containers": [{"name": "node", "env": env, "resources": {"limits": limits}}],
    }
    return training_runtime(pod, ws.GPU_RUNTIME_NAME)


P5 = trn_catalog.get_gpu("p5.48xlarge")


@pytest.mark.parametrize(
    ("runtime", "spec", "found"),
    [
        (gpu_runtime(P5), P5, []),
        (gpu_runtime(P5, gpus=4), P5, ["nvidia.com/gpu 4 (catalog: 8)"]),
        (
            gpu_runtime(P5, tolerations=[]),
            P5,
            ["no toleration of the nvidia.com/gpu taint of the GPU nodes"],
        ),
        (
            gpu_runtime(P5, selector={ws.NODE_TYPE_LABEL: ws.TRAINIUM_NODE_TYPE}),
            P5,
            [
                "nodeSelector trn-platform/node-type=trainium (wanted: gpu)",
                "nodeSelector node.kubernetes.io/instance-type=None (wanted: p5.48xlarge)",
            ],
        ),
        (
            gpu_runtime(P5),
            trn_catalog.get_gpu("p6-b200.48xlarge"),
            [
                "nodeSelector node.kubernetes.io/instance-type=p5.48xlarge (wanted: "
                "p6-b200.48xlarge)",
                "TRN_GPU_INSTANCE_TYPE p5.48xlarge (catalog: p6-b200.48xlarge)",
                "vpc.amazonaws.com/efa 32 (catalog: 8)",
            ],
        ),
    ],
    ids=["agrees", "fewer-gpus", "no-toleration", "trn-nodes", "another-type"],
)
def test_the_drift_check_of_the_gpu_runtime(
    runtime: dict[str, Any], spec: trn_catalog.GpuInstanceSpec, found: list[str]
) -> None:
    assert jobs.runtime_drift(runtime, spec) == found


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, moto: None) -> Iterator[FakeKube]:
    """trn-dev with a p5 GPU group, in moto, its API endpoint a fake API server."""
    from dataclasses import replace

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    _deploy(GPU_OUTPUTS)
    boto3.client("eks").create_cluster(
        name=OUTPUTS.cluster_name,
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-0123"]},
    )
    real = kube.describe
    for state in serve():
        state.runtime = gpu_runtime(P5)

        def describe(eks: Any, name: str, state: FakeKube = state) -> kube.ClusterEndpoint:
            return replace(real(eks, name), url=state.url, ca_data=None)

        monkeypatch.setattr(kube, "describe", describe)
        yield state


SUBMIT_GPU = ["job", "submit", "--env", "trn-dev", "--target", "gpu", "--name", "run-p5"]


def test_submit_target_gpu_checks_the_gpu_runtime_and_creates_the_job(
    fake: FakeKube, trnctl: Any
) -> None:
    run = trnctl(*SUBMIT_GPU, "--", *COMMAND)

    assert run.exit_code == 0, run.stderr
    assert "submitted TrainJob run-p5: 2 x p5.48xlarge, command torchrun train.py" in run.stdout
    assert [f"{r.method} {r.path.rsplit('/', 2)[-2:]}" for r in fake.requests] == [
        "GET ['trainingruntimes', 'cuda-torch']",
        "POST ['training', 'trainjobs']",
    ]
    assert fake.trainjobs["run-p5"]["spec"]["runtimeRef"]["name"] == "cuda-torch"


def test_submit_target_gpu_stops_on_a_drifted_gpu_runtime(fake: FakeKube, trnctl: Any) -> None:
    fake.runtime = gpu_runtime(P5, gpus=4)

    run = trnctl(*SUBMIT_GPU, "--", *COMMAND)

    assert run.exit_code == ExitCode.FAILED
    assert run.stderr == (
        "trnctl: TrainingRuntime cuda-torch in training does not match the catalog for "
        "p5.48xlarge: nvidia.com/gpu 4 (catalog: 8); redeploy the workloads stack\n"
    )
    assert fake.trainjobs == {}


@pytest.mark.parametrize(
    ("job", "shown"),
    [
        (
            {"metadata": {"name": "run-1", "labels": {jobs.TARGET_LABEL: "gpu"}},
             "spec": {"runtimeRef": {"name": "cuda-torch"}}},
            "TrainJob run-1 (target gpu, runtime cuda-torch)",
        ),
        # Submitted before the label: the runtime tells.
        (
            {"metadata": {"name": "run-1"}, "spec": {"runtimeRef": {"name": "neuron-torch"}}},
            "TrainJob run-1 (target trn, runtime neuron-torch)",
        ),
    ],
    ids=["labelled", "unlabelled"],
)  # fmt: skip
def test_status_says_which_target_a_job_runs_on(
    fake: FakeKube, trnctl: Any, job: dict[str, Any], shown: str
) -> None:
    fake.trainjobs["run-1"] = job

    run = trnctl("job", "status", "run-1", "--env", "trn-dev")

    assert run.exit_code == 0, run.stderr
    assert shown in run.stdout


# --- compare --------------------------------------------------------------------------------


def _metrics(path: Path, instance_type: str | None) -> Path:
    header = {
        "kind": "run",
        "instance_type": instance_type,
        "nodes": 1,
        "world_size": 8,
        "device": "cuda",
        "precision": "bf16 autocast",
        "model": "m",
        "global_batch_tokens": 1024,
        "flops_per_token": None,
        "peak_flops_per_rank": 989.5e12,
        "started_at": "2026-12-01T00:00:00+00:00",
    }
    step = {"step": 10, "loss": 3.0, "tokens": 10240, "tokens_per_s": 1000.0, "elapsed_s": 10.0}
    path.write_text("\n".join(json.dumps(r) for r in (header, step)) + "\n")
    return path


@pytest.mark.parametrize(
    ("instance_type", "target"),
    [("p5.48xlarge", "gpu"), ("trn3.48xlarge", "trn"), (None, "local"), ("m7i.large", "m7i.large")],
)
def test_compare_says_where_each_run_ran(
    tmp_path: Path, instance_type: str | None, target: str
) -> None:
    path = _metrics(tmp_path / "m.jsonl", instance_type)

    assert compare.target_of(compare.parse(path.read_text(), "m")) == target


def test_compare_shows_the_target_row_and_no_mfu_without_flops_per_token(
    tmp_path: Path, trnctl: Any
) -> None:
    gpu = _metrics(tmp_path / "p5.jsonl", "p5.48xlarge")
    trn = _metrics(tmp_path / "trn3.jsonl", "trn3.48xlarge")

    run = trnctl("compare", str(trn), str(gpu), "--region", "us-east-2")

    assert run.exit_code == 0, run.stderr
    (row,) = [line for line in run.stdout.splitlines() if line.startswith("│ target")]
    assert [cell.strip() for cell in row.split("│")[2:4]] == ["trn", "gpu"]
    # Neither header has FLOPs per token: no run has an MFU, so the table has no MFU row.
    assert not [line for line in run.stdout.splitlines() if line.startswith("│ MFU")]
