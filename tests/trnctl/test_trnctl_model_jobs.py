"""`job submit --model` (with LoRA) and `job export`: the rendered TrainJobs, the refusal of a
model that was never staged, and the export job against the fake API server that the other job
tests use (tests/trnctl/fake_kube.py) with the real kubernetes client."""

from __future__ import annotations

import math
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
import test_trnctl_kube
import yaml
from fake_kube import FakeKube
from test_trnctl_aws import OUTPUTS

from trnctl import jobs, kube, models, versioning
from trnctl.errors import ExitCode, TrnctlError

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
BUCKET = OUTPUTS.datasets_bucket
fake = test_trnctl_kube.fake


def _stage_marker(name: str) -> None:
    """What a finished `model stage` leaves for the check: models/NAME/config.json."""
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-east-2"})
    s3.put_object(Bucket=BUCKET, Key=f"models/{name}/config.json", Body=b"{}")


@pytest.fixture
def deployed(moto: None) -> None:
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=OUTPUTS.to_json(), Type="String"
    )
    _stage_marker("llama-3.2-1b")


@pytest.fixture
def no_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a dry run must not reach Kubernetes")

    monkeypatch.setattr(kube, "connect", refuse)


SUBMIT = ("job", "submit", "--env", "trn-dev", "--data", "chats", "--dry-run")


def test_a_model_job_reads_the_model_where_it_reads_its_data(
    deployed: None, no_kubernetes: None, trnctl: Any
) -> None:
    run = trnctl(*SUBMIT, "--model", "models/llama-3.2-1b", "--name", "ft-1", "--max-steps", "9")

    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    assert job["spec"]["trainer"]["args"] == [
        "--model",
        "/datasets/models/llama-3.2-1b",
        "--data",
        "/datasets/chats",
        "--checkpoint-dir",
        "/fsx/checkpoints/ft-1",
        "--metrics",
        "/fsx/checkpoints/ft-1/metrics.jsonl",
        "--max-steps",
        "9",
    ]
    assert job["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "trnctl",
        "trn-platform/target": "trn",
        "trn-platform/model": "llama-3.2-1b",
    }
    jobs.check_schema(job)


def test_a_recommendation_job_names_its_task_and_no_model(
    deployed: None, no_kubernetes: None, trnctl: Any
) -> None:
    run = trnctl(*SUBMIT, "--task", "recommend", "--epochs", "3", "--name", "rec-1")

    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    args = job["spec"]["trainer"]["args"]
    assert args[:2] == ["--data", "/datasets/chats"]
    assert args[-4:] == ["--epochs", "3", "--task", "recommend"]
    assert job["metadata"]["labels"]["trn-platform/task"] == "recommend"
    assert "trn-platform/preset" not in job["metadata"]["labels"]
    jobs.check_schema(job)


def test_lora_flags_pass_through(deployed: None, no_kubernetes: None, trnctl: Any) -> None:
    base = (*SUBMIT, "--model", "models/llama-3.2-1b/")

    whole = yaml.safe_load(trnctl(*base, "--lora-rank", "16", "--lora-alpha", "32").stdout)
    half = yaml.safe_load(trnctl(*base, "--lora-rank", "8", "--lora-alpha", "0.5").stdout)
    rank_only = yaml.safe_load(trnctl(*base, "--lora-rank", "4").stdout)

    assert whole["spec"]["trainer"]["args"][-4:] == ["--lora-rank", "16", "--lora-alpha", "32"]
    assert half["spec"]["trainer"]["args"][-4:] == ["--lora-rank", "8", "--lora-alpha", "0.5"]
    assert rank_only["spec"]["trainer"]["args"][-2:] == ["--lora-rank", "4"]
    jobs.check_schema(whole)


def test_a_generated_name_keeps_its_timestamp_for_long_model_names() -> None:
    name = jobs.generated_name("train", "a" * 63, NOW)

    assert name == "train-" + "a" * 30 + "-20261201-120000"
    assert len(name) == jobs.MAX_NAME
    assert jobs.generated_name("train", "llama-3.2-1b", NOW) == "train-llama-3-2-1b-20261201-120000"


def test_dry_run_generates_a_name_from_the_model(
    deployed: None, no_kubernetes: None, trnctl: Any
) -> None:
    job = yaml.safe_load(trnctl(*SUBMIT, "--model", "models/llama-3.2-1b").stdout)

    assert job["metadata"]["name"].startswith("train-llama-3-2-1b-")


def test_a_model_never_staged_is_refused(deployed: None, no_kubernetes: None, trnctl: Any) -> None:
    run = trnctl(*SUBMIT, "--model", "models/qwen3-8b")

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr == (
        f"trnctl: --model models/qwen3-8b: model models/qwen3-8b is not staged (no version, and "
        f"no s3://{BUCKET}/models/qwen3-8b/config.json); stage it first with: trnctl model stage "
        "DIR qwen3-8b --env trn-dev\n"
    )


def test_a_model_whose_stage_did_not_finish_is_refused(
    deployed: None, no_kubernetes: None, trnctl: Any
) -> None:
    """The weights are there but config.json (uploaded last) is not."""
    boto3.client("s3").put_object(
        Bucket=BUCKET, Key="models/half/model.safetensors", Body=b"\x02" + b"\x00" * 7 + b"{}"
    )

    run = trnctl(*SUBMIT, "--model", "models/half")

    assert run.exit_code == ExitCode.NOT_FOUND
    assert "model models/half is not staged" in run.stderr


def test_access_denied_on_the_staged_check_is_one_line(
    deployed: None, no_kubernetes: None, trnctl: Any, clients: Any, stub: Any
) -> None:
    stub(clients("s3")).add_client_error("list_objects_v2", "403", "Forbidden", 403)

    run = trnctl(*SUBMIT, "--model", "models/llama-3.2-1b")

    assert run.exit_code == ExitCode.AWS
    assert run.stderr.startswith("trnctl: access denied calling ListObjectsV2 (403): Forbidden;")


def _version(name: str, number: int, status: str, state: str = "complete") -> None:
    """A model version as the registry writes it: its manifest (the files do not matter to
    submit, which reads manifests only)."""
    s3 = boto3.client("s3")
    ref = versioning.Ref("models", name, number)
    record = {"name": name, "version": f"v{number}", "state": state, "status": status}
    versioning.put_json(s3, BUCKET, ref.record_key(), record)


def _model_args(run: Any) -> tuple[str, dict[str, str]]:
    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    args = job["spec"]["trainer"]["args"]
    return args[args.index("--model") + 1], job["metadata"]["annotations"]


def test_a_job_reads_the_version_in_service_or_the_one_it_names(
    deployed: None, no_kubernetes: None, trnctl: Any
) -> None:
    """models/NAME is the newest promoted version, resolved at submit and recorded on the job;
    models/NAME@vN that version whatever its status."""
    _version("qwen", 1, "promoted")
    _version("qwen", 2, "promoted")
    _version("qwen", 3, "rejected")
    _version("qwen", 4, "candidate")
    _version("qwen", 5, "promoted", state="staging")

    serving = _model_args(trnctl(*SUBMIT, "--model", "models/qwen"))
    named = _model_args(trnctl(*SUBMIT, "--model", "models/qwen@v4"))

    assert serving == (
        "/datasets/models/qwen/v2",
        {"trn-platform/data": "chats", "trn-platform/model-version": "models/qwen/v2"},
    )
    assert named[0] == "/datasets/models/qwen/v4"
    assert named[1]["trn-platform/model-version"] == "models/qwen/v4"


def test_a_model_with_no_promoted_version_is_refused(
    deployed: None, no_kubernetes: None, trnctl: Any
) -> None:
    _version("qwen", 1, "rejected")
    _version("qwen", 2, "candidate")

    run = trnctl(*SUBMIT, "--model", "models/qwen")

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr == (
        "trnctl: --model models/qwen: no version is promoted (v1 rejected, v2 candidate); pass "
        "models/qwen@vN or promote one with: trnctl model promote models/qwen@vN --env trn-dev "
        "--reason ...\n"
    )


@pytest.mark.parametrize(("number", "what"), [(2, "is still staging"), (9, "does not exist")])
def test_a_model_version_that_is_not_complete_is_refused(
    deployed: None, no_kubernetes: None, trnctl: Any, number: int, what: str
) -> None:
    _version("qwen", 1, "promoted")
    _version("qwen", 2, "candidate", state="staging")

    run = trnctl(*SUBMIT, "--model", f"models/qwen@v{number}")

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr.startswith(f"trnctl: models/qwen@v{number} {what}")
    assert "; complete versions of models/qwen: v1 (trnctl model stage DIR qwen" in run.stderr


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (["--model", "llama-3.2-1b"], "--model 'llama-3.2-1b' is not models/NAME"),
        (["--model", "models/a/b"], "--model 'models/a/b': 'a/b' cannot name a versioned model"),
        (["--model", "weights/x"], "--model 'weights/x' is not models/NAME"),
        (
            ["--model", "models/Llama"],
            "--model 'models/Llama': 'Llama' cannot name a versioned model: use lowercase",
        ),
        (["--model", "models/llama@3"], "--model 'models/llama@3': the version is vN"),
        ([], "pass exactly one of --preset and --model"),
        (
            ["--preset", "tiny", "--model", "models/llama-3.2-1b"],
            "pass exactly one of --preset and --model",
        ),
        (
            ["--preset", "tiny", "--lora-rank", "8"],
            "--lora-rank needs --model (LoRA fine-tunes a staged model)",
        ),
        (
            ["--model", "models/llama-3.2-1b", "--lora-alpha", "16"],
            "--lora-alpha needs --lora-rank",
        ),
        (
            ["--model", "models/llama-3.2-1b", "--lora-rank", "0"],
            "--lora-rank 0 is not allowed; use 1 or more",
        ),
        (
            ["--model", "models/llama-3.2-1b", "--lora-rank", "8", "--lora-alpha", "0"],
            "--lora-alpha 0 is not allowed; use a number above 0",
        ),
        (
            ["--model", "models/llama-3.2-1b", "--lora-rank", "8", "--lora-alpha", "-2.5"],
            "--lora-alpha -2.5 is not allowed; use a number above 0",
        ),
        (
            ["--model", "models/llama-3.2-1b", "--lora-rank", "8", "--lora-alpha", "nan"],
            "--lora-alpha nan is not allowed; use a number above 0",
        ),
    ],
)
def test_bad_model_or_lora_options_are_one_line_usage_errors(
    deployed: None, no_kubernetes: None, trnctl: Any, extra: list[str], line: str
) -> None:
    run = trnctl(*SUBMIT, *extra)

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr.startswith(f"trnctl: {line}")
    assert run.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"preset": None}, "exactly one of --preset and --model"),
        ({"preset": "tiny", "model": "m"}, "exactly one of --preset and --model"),
        ({"preset": "tiny", "lora_rank": 4}, r"--lora-rank needs --model"),
        ({"model": "m", "lora_alpha": 1.0}, "--lora-alpha needs --lora-rank"),
        ({"model": "m", "lora_rank": -1}, "--lora-rank -1 is not allowed"),
        ({"model": "m", "lora_rank": 4, "lora_alpha": math.inf}, "--lora-alpha inf is not allowed"),
        ({"model": "m", "max_steps": 9, "epochs": 2}, "--max-steps and --epochs exclude each"),
        ({"preset": "tiny", "task": "classify"}, "--task classify needs --model"),
        ({"model": "m", "task": "regress"}, "--task 'regress' is unknown"),
        ({"model": "m", "class_weights": "auto"}, "--class-weights needs --task classify"),
        ({"model": "m", "task": "classify", "class_weights": "x"}, "--class-weights 'x'"),
        ({"preset": "tiny", "task": "recommend"}, "--task recommend trains a two-tower model"),
        ({"model": "m", "task": "recommend"}, "leave out --preset and --model"),
    ],
)
def test_training_args_refuse_what_trn_train_would(kwargs: dict[str, Any], match: str) -> None:
    fields = {"preset": None, "data": "d", **kwargs}
    with pytest.raises(TrnctlError, match=match) as e:
        jobs.TrainingArgs(**fields)
    assert e.value.exit_code == ExitCode.USAGE


def test_the_trainer_parses_a_recommendation_job_s_arguments() -> None:
    """A --task recommend job names neither a preset nor a model: its data shapes the model."""
    from trainer.cli import _parser, train_config

    args = jobs.TrainingArgs(None, "clicks", epochs=2, task="recommend", eval_every=50)
    argv = args.argv("rec-1")

    assert "--preset" not in argv and "--model" not in argv
    config = train_config(_parser().parse_args(["run", *argv]))
    assert (config.task, config.data, config.epochs) == ("recommend", "/datasets/clicks", 2)
    assert config.batch_per_rank == 256


def test_the_trainer_parses_a_model_job_s_arguments() -> None:
    """The arguments a --model TrainJob hands the entrypoint are ones `trn-train run` takes."""
    from trainer.cli import _parser

    args = jobs.TrainingArgs(
        None, "chats", max_steps=3, model="m", seq_len=512, eval_every=50, eval_batches=4
    ).argv("ft-1")

    parsed = _parser().parse_args(["run", *args])

    assert parsed.model_dir == "/datasets/models/m"
    assert parsed.data == "/datasets/chats"
    assert (parsed.seq_len, parsed.eval_every, parsed.eval_batches) == (512, 50, 4)
    epochs = jobs.TrainingArgs(None, "chats", model="m", epochs=3).argv("ft-1")
    assert (_parser().parse_args(["run", *epochs]).epochs, parsed.epochs) == (3, 0)
    classify = jobs.TrainingArgs(
        None, "docs", model="m", task="classify", class_weights="auto"
    ).argv("clf-1")
    again = _parser().parse_args(["run", *classify])
    assert (again.task, again.class_weights, parsed.task) == ("classify", "auto", "causal-lm")


def test_the_trainer_parses_the_export_job_s_arguments() -> None:
    """The export job's command and arguments are ones `trn-train export` takes."""
    from trainer.cli import _parser

    job = jobs.render_export(job_name="ft-1", export="ft-1-export-1201120000", outputs=OUTPUTS)
    trainer = job["spec"]["trainer"]

    parsed = _parser().parse_args([trainer["command"][-1], *trainer["args"]])

    assert parsed.command == "export"
    assert parsed.checkpoint_dir == "/fsx/checkpoints/ft-1"
    assert parsed.out == "/fsx/checkpoints/ft-1/export/ft-1-export-1201120000"


# --- job export -------------------------------------------------------------------------------


def test_export_names_keep_the_timestamp_and_fit() -> None:
    assert jobs.export_name("ft-1", NOW) == "ft-1-export-1201120000"
    long = jobs.export_name("a" * jobs.MAX_NAME, NOW)
    assert long == "a" * 34 + "-export-1201120000"
    assert len(long) == jobs.MAX_NAME


def test_the_export_job_runs_trn_train_export_on_one_node() -> None:
    job = jobs.render_export(job_name="ft-1", export="ft-1-export-1201120000", outputs=OUTPUTS)

    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 1
    assert trainer["command"] == ["python3", "-m", "trainer", "export"]
    assert trainer["args"] == [
        "--checkpoint-dir",
        "/fsx/checkpoints/ft-1",
        "--out",
        "/fsx/checkpoints/ft-1/export/ft-1-export-1201120000",
    ]
    assert job["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "trnctl",
        "trn-platform/target": "trn",
        "trn-platform/purpose": "export",
        "trn-platform/source-job": "ft-1",
    }
    assert job["spec"]["runtimeRef"]["name"] == "neuron-torch"
    jobs.check_schema(job)


def test_the_export_command_is_trn_train() -> None:
    """The export job's command, `python3 -m trainer`, is the image's trn-train (trainer.cli)."""
    done = subprocess.run(
        [sys.executable, *jobs.EXPORT_COMMAND[1:-1], "--help"],
        capture_output=True,
        text=True,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert "prepare-data" in done.stdout and "run" in done.stdout


def _source(fake: FakeKube, name: str, labels: dict[str, str]) -> None:
    fake.trainjobs[name] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {"trainer": {"image": "example.com/trainer:7"}},
    }


def _export_finishes(fake: FakeKube, kind: str, polls: int = 1) -> None:
    def created(job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        fake.statuses[name] = [{"conditions": []}] * polls + [test_trnctl_kube._finished(kind)]

    fake.on_create = created


EXPORT = ("job", "export", "ft-1", "--env", "trn-dev", "--poll", "0.01")


def test_export_waits_and_prints_where_the_model_is(fake: FakeKube, trnctl: Any) -> None:
    _source(fake, "ft-1", {jobs.MODEL_LABEL: "llama-3.2-1b"})
    _export_finishes(fake, "Complete")

    run = trnctl(*EXPORT)

    assert run.exit_code == 0, run.stderr
    (export,) = [n for n in fake.trainjobs if n != "ft-1"]
    assert export.startswith("ft-1-export-")
    created = fake.trainjobs[export]
    # The training job's image: the trainer that wrote the checkpoint reads it.
    assert created["spec"]["trainer"]["image"] == "example.com/trainer:7"
    assert created["spec"]["trainer"]["args"][-1] == f"/fsx/checkpoints/ft-1/export/{export}"
    jobs.check_schema(created)
    assert run.stdout == (
        f"exported the newest checkpoint of ft-1 as a Hugging Face model: "
        f"/fsx/checkpoints/ft-1/export/{export} (in pods), "
        f"s3://{OUTPUTS.checkpoints_bucket}/ft-1/export/{export}/ (FSx exports it to the "
        "checkpoints bucket)\n"
    )


def test_export_without_waiting_says_where_it_will_write(fake: FakeKube, trnctl: Any) -> None:
    _source(fake, "ft-1", {jobs.MODEL_LABEL: "llama-3.2-1b"})

    run = trnctl(*EXPORT, "--no-wait", "--image", "example.com/trainer:8")

    assert run.exit_code == 0, run.stderr
    (export,) = [n for n in fake.trainjobs if n != "ft-1"]
    assert fake.trainjobs[export]["spec"]["trainer"]["image"] == "example.com/trainer:8"
    assert f"submitted export TrainJob {export}: it writes /fsx/checkpoints/ft-1/export/" in (
        run.stdout
    )
    assert f"trnctl job logs {export} --env trn-dev --follow" in run.stdout
    assert not [r for r in fake.requests if r.path.endswith(f"/trainjobs/{export}")]


def test_a_failed_export_exits_1(fake: FakeKube, trnctl: Any) -> None:
    _source(fake, "ft-1", {jobs.MODEL_LABEL: "llama-3.2-1b"})
    _export_finishes(fake, "Failed")

    run = trnctl(*EXPORT)

    assert run.exit_code == ExitCode.FAILED
    (export,) = [n for n in fake.trainjobs if n != "ft-1"]
    assert run.stderr.splitlines()[-1] == (
        f"trnctl: export job {export} ended Failed; see trnctl job logs {export} --env trn-dev"
    )


def test_an_export_that_does_not_finish_times_out(fake: FakeKube, trnctl: Any) -> None:
    _source(fake, "ft-1", {jobs.MODEL_LABEL: "llama-3.2-1b"})
    _export_finishes(fake, "Complete", polls=10_000)

    run = trnctl(*EXPORT, "--timeout", "0.2")

    assert run.exit_code == ExitCode.FAILED
    assert "did not finish within 0.2 s (pods: none)" in run.stderr


def test_a_preset_job_has_nothing_to_export(fake: FakeKube, trnctl: Any) -> None:
    _source(fake, "ft-1", {jobs.PRESET_LABEL: "125m"})

    run = trnctl(*EXPORT)

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr == (
        "trnctl: TrainJob 'ft-1' was not submitted with --model (it has no trn-platform/model "
        "label): only runs from a Hugging Face model have a Hugging Face directory to export\n"
    )
    assert list(fake.trainjobs) == ["ft-1"]


def test_exporting_an_unknown_job_is_not_found(fake: FakeKube, trnctl: Any) -> None:
    run = trnctl(*EXPORT)

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr == "trnctl: TrainJob 'ft-1' not found in namespace 'training'\n"


def test_export_dry_run_prints_the_job_and_calls_no_kubernetes(
    deployed: None, no_kubernetes: None, trnctl: Any
) -> None:
    run = trnctl("job", "export", "ft-1", "--env", "trn-dev", "--dry-run")

    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    assert job["metadata"]["name"].startswith("ft-1-export-")
    assert job["spec"]["trainer"]["image"] == OUTPUTS.image_uri
    jobs.check_schema(job)


def test_export_refuses_a_bad_job_name(deployed: None, no_kubernetes: None, trnctl: Any) -> None:
    run = trnctl("job", "export", "FT_1", "--env", "trn-dev", "--dry-run")

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr.startswith("trnctl: job name 'FT_1' is not a DNS-1035 label")


def test_the_pod_path_is_under_the_datasets_mount() -> None:
    assert models.pod_path("qwen3-8b") == "/datasets/models/qwen3-8b"
