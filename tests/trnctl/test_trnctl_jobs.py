"""TrainJob rendering and `job submit --dry-run`: names, schema, arguments, ranks per node. (The
runtime drift check runs on the synthesized runtime in tests/conformance/test_runtime_seam.py.)"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import kubernetes_validate
import pytest
import yaml
from test_trnctl_aws import OUTPUTS

import trn_catalog
from trn_catalog import workspace as ws
from trnctl import jobs, kube, validation
from trnctl.errors import ExitCode, TrnctlError

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def deployed(moto: None) -> None:
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=OUTPUTS.to_json(), Type="String"
    )


@pytest.fixture
def no_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a dry run must not reach Kubernetes")

    monkeypatch.setattr(kube, "connect", refuse)


def test_render_references_the_runtime_and_passes_the_schema() -> None:
    args = jobs.TrainingArgs("125m", "tales", max_steps=100).argv("train-125m")

    job = jobs.render(name="train-125m", outputs=OUTPUTS, nodes=2, args=args)

    assert job["spec"]["runtimeRef"] == {
        "name": "neuron-torch",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
    }
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 2
    assert trainer["image"] == OUTPUTS.image_uri
    # Devices, EFA and hugepages come from the runtime, which the workspace renders from the
    # catalog; the job must not override them with figures of its own.
    assert "resourcesPerNode" not in trainer
    assert job["metadata"]["namespace"] == "training"
    assert trainer["args"] == [
        "--preset",
        "125m",
        "--data",
        "/datasets/tales",
        "--checkpoint-dir",
        "/fsx/checkpoints/train-125m",
        "--metrics",
        "/fsx/checkpoints/train-125m/metrics.jsonl",
        "--max-steps",
        "100",
    ]
    jobs.check_schema(job)  # no exception


def test_the_container_part_is_a_valid_kubernetes_container() -> None:
    job = jobs.render(
        name="train-x",
        outputs=OUTPUTS,
        nodes=1,
        args=["--preset", "tiny"],
        command=["python3", "-m", "trainer.validate_node"],
    )
    trainer = job["spec"]["trainer"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train-x-node-0-0"},
        "spec": {
            "containers": [
                {
                    "name": ws.TRAINER_CONTAINER,
                    "image": trainer["image"],
                    "command": trainer["command"],
                    "args": trainer["args"],
                }
            ]
        },
    }

    kubernetes_validate.validate(pod, "1.35.0", strict=True)


def test_absolute_data_paths_are_kept() -> None:
    argv = jobs.TrainingArgs("tiny", "/fsx/data/").argv("j")

    assert argv[argv.index("--data") + 1] == "/fsx/data"


@pytest.mark.parametrize(("stack", "device"), [("native", "neuron"), ("xla", "xla")])
def test_the_image_stack_picks_the_device_of_a_submitted_job(stack: str, device: str) -> None:
    """A TrainJob leaves --device to the image's entrypoint, which names its stack's device, so
    an XLA image trains on XLA rather than on CPU."""
    from trainer import launch
    from trainer.cli import _parser

    args = jobs.TrainingArgs("125m", "tales", max_steps=10).argv("j")
    assert "--device" not in args
    argv = launch.torchrun_argv({"NEURON_STACK": stack, "NPROC_PER_NODE": "2"}, args)
    parsed = _parser().parse_args(["run", *argv[argv.index("run") + 1 :]])
    assert (parsed.device, parsed.preset, parsed.max_steps) == (device, "125m", 10)


def test_schema_errors_name_the_path() -> None:
    job = jobs.render(name="train-x", outputs=OUTPUTS, nodes=1, args=[])
    job["spec"]["trainer"]["numProcPerNode"] = "auto"

    with pytest.raises(
        TrnctlError, match=r"schema at spec\.trainer\.numProcPerNode: 'auto' is not of type"
    ) as e:
        jobs.check_schema(job)
    assert e.value.exit_code == ExitCode.FAILED


@pytest.mark.parametrize("instance_type", sorted(trn_catalog.CATALOG))
def test_every_trainjob_runs_a_rank_per_logical_neuroncore(instance_type: str) -> None:
    """Trainer 2.3.0 hands torchrun the pod's CPU request (184 on trn2.48xlarge) as the ranks per
    node when a TrainJob names none and asks for no GPU: every job trnctl renders names them."""
    outputs = replace(OUTPUTS, instance_type=instance_type)
    cores = trn_catalog.get(instance_type).logical_neuron_cores

    train = jobs.render(name="train-x", outputs=outputs, nodes=1, args=[])
    check = validation.render(outputs, now=NOW)

    assert train["spec"]["trainer"]["numProcPerNode"] == cores
    assert check["spec"]["trainer"]["numProcPerNode"] == cores


def test_an_environment_whose_type_left_the_catalog_is_refused() -> None:
    outputs = replace(OUTPUTS, instance_type="trn9.48xlarge")

    with pytest.raises(TrnctlError, match=r"environment 'trn-dev': .*trn9\.48xlarge") as e:
        jobs.render(name="train-x", outputs=outputs, nodes=1, args=[])
    assert e.value.exit_code == ExitCode.FAILED


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("Train", "not a DNS-1035 label"),
        ("1b-run", "not a DNS-1035 label"),
        ("run_1", "not a DNS-1035 label"),
        ("run-", "not a DNS-1035 label"),
        ("a" * 53, "has 53 characters; at most 52"),
    ],
)
def test_bad_names_are_refused(name: str, match: str) -> None:
    with pytest.raises(TrnctlError, match=match) as e:
        jobs.validate_name(name)
    assert e.value.exit_code == ExitCode.USAGE


def test_generated_names_are_valid_for_presets_starting_with_a_digit() -> None:
    assert jobs.generated_name("train", "125m", NOW) == "train-125m-20261201-120000"
    assert jobs.generated_name("validate", "", NOW) == "validate-20261201-120000"


def test_dry_run_prints_the_trainjob_and_calls_no_kubernetes(
    deployed: None, no_kubernetes: None, trnctl: Any
) -> None:
    run = trnctl(
        "job", "submit", "--env", "trn-dev", "--nodes", "2", "--preset", "125m",
        "--data", "tales", "--max-steps", "50", "--name", "run-1", "--dry-run",
    )  # fmt: skip

    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    assert job["kind"] == "TrainJob"
    assert job["metadata"]["name"] == "run-1"
    assert job["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "trnctl",
        "trn-platform/target": "trn",
        "trn-platform/preset": "125m",
    }
    assert job["spec"]["trainer"]["numNodes"] == 2
    assert job["spec"]["trainer"]["numProcPerNode"] == 64  # trn2.48xlarge: 128 cores, LNC 2
    assert job["spec"]["trainer"]["args"][-2:] == ["--max-steps", "50"]
    jobs.check_schema(job)


def test_dry_run_defaults_nodes_name_and_image(
    deployed: None, no_kubernetes: None, trnctl: Any
) -> None:
    run = trnctl(
        "job", "submit", "--env", "trn-dev", "--preset", "tiny", "--data", "d",
        "--image", "example.com/trainer:2", "--dry-run",
    )  # fmt: skip

    job = yaml.safe_load(run.stdout)
    assert job["spec"]["trainer"]["numNodes"] == OUTPUTS.trn_nodes
    assert job["spec"]["trainer"]["image"] == "example.com/trainer:2"
    assert job["metadata"]["name"].startswith("train-tiny-")
    jobs.validate_name(job["metadata"]["name"])


@pytest.mark.parametrize(
    ("extra", "code", "line"),
    [
        (
            ["--env", "trn-nope", "--preset", "tiny"],
            ExitCode.NOT_FOUND,
            "trnctl: unknown environment 'trn-nope': SSM parameter /trn-platform/trn-nope/outputs "
            "does not exist in us-east-2; deploy it, or check --env and the region\n",
        ),
        (
            ["--env", "trn-dev", "--preset", "7b"],
            ExitCode.USAGE,
            "trnctl: --preset '7b' is unknown; known: tiny, small, 125m, 1b\n",
        ),
        (
            ["--env", "trn-dev", "--preset", "tiny", "--name", "My_Run"],
            ExitCode.USAGE,
            "trnctl: job name 'My_Run' is not a DNS-1035 label: lowercase letters, digits and "
            "'-', starting with a letter and ending with a letter or digit\n",
        ),
        (
            ["--env", "trn-dev", "--preset", "tiny", "--nodes", "3"],
            ExitCode.USAGE,
            "trnctl: --nodes 3 is more than the 2 trn nodes of trn-dev; the pods would wait for "
            "capacity forever (scale the node group first)\n",
        ),
    ],
)
def test_submit_errors_are_one_line(
    deployed: None, no_kubernetes: None, trnctl: Any, extra: list[str], code: int, line: str
) -> None:
    run = trnctl("job", "submit", "--data", "d", "--dry-run", *extra)

    assert run.exit_code == code
    assert run.stderr == line


def test_precompile_sets_the_entrypoints_variable(
    deployed: None, no_kubernetes: None, trnctl: Any
) -> None:
    """--precompile has each node's entrypoint run `trn-train compile` before the run; without
    it the TrainJob carries no env of its own."""
    base = ["job", "submit", "--env", "trn-dev", "--preset", "tiny", "--data", "d", "--dry-run"]

    job = yaml.safe_load(trnctl(*base, "--precompile").stdout)
    plain = yaml.safe_load(trnctl(*base).stdout)

    from trainer import launch

    assert job["spec"]["trainer"]["env"] == [{"name": launch.PRECOMPILE_ENV, "value": "1"}]
    assert "env" not in plain["spec"]["trainer"]
    jobs.check_schema(job)
