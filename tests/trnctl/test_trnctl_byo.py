"""`trnctl job submit -- COMMAND`: your own command in a TrainJob that conforms to the pinned
Trainer CRD and keeps what the platform sets for its own trainer; the flags only trn-train takes
refused with a command; `trnctl code stage` and `--code` against moto's S3."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from test_trnctl_aws import OUTPUTS

from tests.conformance.kube_objects import manifests, problems
from tests.conftest import Synth
from tests.s3_writes import S3Writes, Stopped
from trn_catalog import crds
from trn_catalog import workspace as ws
from trnctl import code as codes
from trnctl import jobs, kube
from trnctl.errors import ExitCode, TrnctlError

ROOT = Path(__file__).resolve().parents[2]
COMMAND = ["torchrun", "train.py", "--device", "neuron", "--steps", "100"]
BUCKET = OUTPUTS.datasets_bucket
# Kubeflow Trainer v2.3.0 pkg/constants TorchRunReservedEnvNames: a TrainJob may not set them.
KUBEFLOW_RESERVED = {
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
}


@pytest.fixture
def deployed(moto: None) -> Any:
    """trn-dev's SSM outputs and its datasets bucket, in moto."""
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=OUTPUTS.to_json(), Type="String"
    )
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-east-2"})
    return s3


@pytest.fixture
def no_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a dry run must not reach Kubernetes")

    monkeypatch.setattr(kube, "connect", refuse)


def command_job(**kwargs: Any) -> dict[str, Any]:
    args = jobs.CommandArgs(tuple(COMMAND), kwargs.pop("workdir", None))
    return jobs.render_command(name="run-mine", outputs=OUTPUTS, nodes=2, command=args, **kwargs)


def image_entrypoint() -> list[str]:
    """The ENTRYPOINT of training_image/Dockerfile (its exec form)."""
    (line,) = [
        line
        for line in (ROOT / "training_image" / "Dockerfile").read_text().splitlines()
        if line.startswith("ENTRYPOINT ")
    ]
    entrypoint: list[str] = json.loads(line.removeprefix("ENTRYPOINT "))
    return entrypoint


def test_a_command_runs_through_the_image_entrypoint_with_the_checkpoint_directory() -> None:
    job = command_job()

    trainer = job["spec"]["trainer"]
    assert trainer["command"] == [*image_entrypoint(), "--exec", "--"]
    assert trainer["args"] == COMMAND
    assert trainer["env"] == [
        {"name": "TRN_CHECKPOINT_DIR", "value": "/fsx/checkpoints/run-mine"},
        # Where trainer.runlog writes, and where `trnctl compare run-mine --env E` reads.
        {"name": "TRN_METRICS_FILE", "value": "/fsx/checkpoints/run-mine/metrics.jsonl"},
    ]
    # The place trn-train run checkpoints to for a job of the same name.
    trn_train = jobs.TrainingArgs("125m", "corpus").argv("run-mine")
    assert trn_train[trn_train.index("--checkpoint-dir") + 1] == "/fsx/checkpoints/run-mine"
    assert trainer["numNodes"] == 2
    assert trainer["numProcPerNode"] == 64  # trn2.48xlarge's logical NeuronCores
    assert trainer["image"] == OUTPUTS.image_uri
    assert job["spec"]["runtimeRef"]["name"] == ws.RUNTIME_NAME
    assert job["metadata"]["labels"][jobs.PURPOSE_LABEL] == "command"


def test_staged_code_becomes_the_entrypoint_working_directory() -> None:
    job = command_job(workdir="/datasets/code/mine", image="example.com/mine:1")

    trainer = job["spec"]["trainer"]
    assert trainer["command"][-4:] == ["--exec", "--workdir", "/datasets/code/mine", "--"]
    assert trainer["image"] == "example.com/mine:1"


def test_a_command_job_conforms_to_the_pinned_trainer_crd() -> None:
    assert problems(command_job(workdir="/datasets/code/mine")) == []


def test_the_conformance_check_sees_a_field_the_crd_lacks() -> None:
    job = command_job()
    # What a Kubernetes container has and a TrainJob's trainer does not (Trainer v2.3.0).
    job["spec"]["trainer"]["workingDir"] = "/datasets/code/mine"
    assert any("'workingDir' was unexpected" in p for p in problems(job))


def test_the_job_leaves_the_runtime_environment_devices_and_mounts_alone(dev: Synth) -> None:
    (runtime,) = [a.obj for a in manifests(dev.templates) if a.obj["kind"] == "TrainingRuntime"]
    (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    (container,) = replicated["template"]["spec"]["template"]["spec"]["containers"]
    platform_env = {e["name"] for e in container["env"]}
    trainer = command_job()["spec"]["trainer"]

    job_env = {e["name"] for e in trainer["env"]}
    # Kubeflow upserts the job's variables over the runtime's: none of the platform's is
    # replaced, and none of the rendezvous names Kubeflow reserves is set.
    assert not job_env & platform_env
    assert not job_env & KUBEFLOW_RESERVED
    assert {"TRN_INSTANCE_TYPE", "TRN_SHUTDOWN_TIMEOUT_S", "TORCH_NEURONX_NEFF_CACHE_DIR"} <= (
        platform_env
    )
    # Devices, EFA, huge pages and the /fsx and /datasets mounts stay the runtime's.
    assert "resourcesPerNode" not in trainer
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/fsx", "/datasets"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), r"the command after -- is empty"),
        (("",), r"the command after -- is empty"),
        (
            tuple(["python"] * (jobs.MAX_ARGS + 1)),
            rf"has 129 words; a TrainJob's spec.trainer.args holds at most 128 \(Kubeflow "
            rf"Trainer {re.escape(crds.release_tag())}\)",
        ),
    ],
)
def test_a_command_the_trainjob_cannot_hold_is_refused(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(TrnctlError, match=message):
        jobs.CommandArgs(args)


def test_a_relative_working_directory_is_refused() -> None:
    with pytest.raises(TrnctlError, match=r"working directory 'code/x' is not an absolute path"):
        jobs.CommandArgs(("python",), "code/x")


@pytest.mark.usefixtures("deployed", "no_kubernetes")
def test_submit_dry_run_with_a_command(trnctl: Any) -> None:
    run = trnctl(
        "job", "submit", "--env", "trn-dev", "--nodes", "1", "--name", "mine", "--dry-run",
        "--", *COMMAND,
    )  # fmt: skip

    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    assert job["spec"]["trainer"]["args"] == COMMAND
    assert job["spec"]["trainer"]["command"][-2:] == ["--exec", "--"]
    assert job["spec"]["trainer"]["numNodes"] == 1
    assert problems(job) == []


@pytest.mark.usefixtures("deployed", "no_kubernetes")
def test_a_generated_name_comes_from_the_program(trnctl: Any) -> None:
    run = trnctl("job", "submit", "--env", "trn-dev", "--dry-run", "--", "/usr/bin/python3", "x")

    assert run.exit_code == 0, run.stderr
    name = yaml.safe_load(run.stdout)["metadata"]["name"]
    assert re.fullmatch(r"run-python3-\d{8}-\d{6}", name)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--preset", "125m"], "--preset is"),
        (["--model", "models/x", "--data", "d"], "--model, --data are"),
        (
            ["--max-steps", "5", "--seed", "1", "--precompile"],
            "--max-steps, --seed, --precompile are",
        ),
        (["--lora-rank", "4", "--eval-every", "2"], "--lora-rank, --eval-every are"),
        (["--epochs", "2"], "--epochs is"),
    ],
)
@pytest.mark.usefixtures("deployed", "no_kubernetes")
def test_trainer_only_flags_are_refused_with_a_command(
    trnctl: Any, flags: list[str], named: str
) -> None:
    run = trnctl("job", "submit", "--env", "trn-dev", *flags, "--dry-run", "--", "python", "t.py")

    assert run.exit_code == ExitCode.USAGE
    assert f"{named} for trn-train run and cannot go with a command after --" in run.stderr


@pytest.mark.usefixtures("deployed", "no_kubernetes")
def test_without_a_command_data_is_still_required(trnctl: Any) -> None:
    run = trnctl("job", "submit", "--env", "trn-dev", "--preset", "125m", "--dry-run")

    assert run.exit_code == ExitCode.USAGE
    assert "--data is required to run trn-train (or give your own command after --)" in run.stderr


@pytest.mark.usefixtures("deployed", "no_kubernetes")
def test_code_without_a_command_is_refused(trnctl: Any) -> None:
    run = trnctl(
        "job", "submit", "--env", "trn-dev", "--preset", "125m", "--data", "d", "--code",
        "code/mine", "--dry-run",
    )  # fmt: skip

    assert run.exit_code == ExitCode.USAGE
    assert "--code needs a command after --" in run.stderr


@pytest.mark.usefixtures("deployed", "no_kubernetes")
def test_more_nodes_than_the_environment_has_are_refused_for_a_command(trnctl: Any) -> None:
    run = trnctl("job", "submit", "--env", "trn-dev", "--nodes", "9", "--dry-run", "--", "x")

    assert run.exit_code == ExitCode.USAGE
    assert f"--nodes 9 is more than the {OUTPUTS.trn_nodes} trn nodes of trn-dev" in run.stderr


# --- code stage and --code -------------------------------------------------------------------


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    root = tmp_path / "mine"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hello')\n")
    (root / "pkg" / "model.py").write_text("X = 1\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "old.pyc").write_bytes(b"\0")
    return root


def keys(s3: Any, prefix: str) -> list[str]:
    found = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in found)


def test_code_stage_uploads_the_code_then_its_manifest(
    trnctl: Any, deployed: Any, clients: Any, code_dir: Path
) -> None:
    writes = S3Writes(clients("s3", OUTPUTS.region))

    run = trnctl("code", "stage", str(code_dir), "mine", "--env", "trn-dev")

    assert run.exit_code == 0, run.stderr
    assert writes.log == [
        ("delete", "code/mine/trnctl-code.json"),
        ("put", "code/mine/pkg/model.py"),
        ("put", "code/mine/train.py"),
        ("put", "code/mine/trnctl-code.json"),
    ]
    assert keys(deployed, "code/") == sorted(writes.puts)
    assert "uploaded 2, skipped 0 already intact; left out .git, old.pyc, pkg/__pycache__" in (
        run.stdout
    )
    body = deployed.get_object(Bucket=BUCKET, Key="code/mine/trnctl-code.json")["Body"].read()
    manifest = json.loads(body)
    assert [f["path"] for f in manifest["files"]] == ["pkg/model.py", "train.py"]
    assert manifest["files"][1]["size"] == len("print('hello')\n")


def test_a_rerun_skips_intact_files_and_names_stale_ones(
    trnctl: Any, deployed: Any, code_dir: Path
) -> None:
    assert trnctl("code", "stage", str(code_dir), "mine", "--env", "trn-dev").exit_code == 0
    (code_dir / "train.py").write_text("print('changed')\n")
    (code_dir / "pkg" / "model.py").unlink()

    run = trnctl("code", "stage", str(code_dir), "mine", "--env", "trn-dev")

    assert run.exit_code == 0, run.stderr
    assert "uploaded 1, skipped 0 already intact" in run.stdout
    assert "also holds 1 objects not in" in run.stdout and "code/mine/pkg/model.py" in run.stdout
    body = deployed.get_object(Bucket=BUCKET, Key="code/mine/train.py")["Body"].read()
    assert body == b"print('changed')\n"

    again = trnctl("code", "stage", str(code_dir), "mine", "--env", "trn-dev")
    assert "uploaded 0, skipped 1 already intact" in again.stdout


@pytest.mark.usefixtures("no_kubernetes")
@pytest.mark.parametrize("stop_at", [1, 2])
@pytest.mark.parametrize("earlier_stage", [False, True])
def test_a_code_stage_stopped_between_two_uploads_is_refused_by_jobs(
    trnctl: Any, deployed: Any, clients: Any, code_dir: Path, stop_at: int, earlier_stage: bool
) -> None:
    """Stopped before its first or second upload, on a new prefix or over an earlier stage of the
    same name: no manifest vouches for the half-staged code, and a job refuses it."""
    if earlier_stage:
        assert trnctl("code", "stage", str(code_dir), "mine", "--env", "trn-dev").exit_code == 0
    (code_dir / "train.py").write_text("print('changed')\n")
    writes = S3Writes(clients("s3", OUTPUTS.region), stop_at=stop_at)

    with pytest.raises(Stopped):
        trnctl("code", "stage", str(code_dir), "mine", "--env", "trn-dev")
    writes.close()

    assert writes.log[0] == ("delete", "code/mine/trnctl-code.json")
    run = trnctl("job", "submit", "--env", "trn-dev", "--code", "code/mine", "--dry-run", "--", "x")
    assert run.exit_code == ExitCode.NOT_FOUND
    assert "code code/mine is not staged: " in run.stderr


@pytest.mark.parametrize(
    ("setup", "name", "message"),
    [
        (lambda root: None, "Mine", r"code name 'Mine' is not allowed: use lowercase letters"),
        (lambda root: (root / "trnctl-code.json").write_text("{}"), "mine", r"rename it"),
        (lambda root: (root / "train.py").unlink() or (root / "pkg").rename(root / ".pkg"),
         "mine", r"holds no file to stage"),
    ],
)  # fmt: skip
def test_bad_code_is_refused_before_any_upload(
    trnctl: Any, deployed: Any, tmp_path: Path, setup: Any, name: str, message: str
) -> None:
    root = tmp_path / "c"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("")
    (root / "pkg" / "m.py").write_text("")
    setup(root)

    run = trnctl("code", "stage", str(root), name, "--env", "trn-dev")

    assert run.exit_code == ExitCode.USAGE
    assert re.search(message, run.stderr), run.stderr
    assert keys(deployed, "code/") == []


def test_a_file_is_not_code_to_stage(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    with pytest.raises(TrnctlError, match=r"t.py is not a directory; stage a directory of code"):
        codes.inspect(tmp_path / "t.py")


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("mine", r"--code 'mine' is not code/NAME"),
        ("code/a/b", r"--code 'code/a/b' is not code/NAME"),
        ("models/mine", r"--code 'models/mine' is not code/NAME"),
        ("code/Mine", r"code name 'Mine' is not allowed"),
    ],
)
def test_a_bad_code_reference_is_refused(ref: str, message: str) -> None:
    with pytest.raises(TrnctlError, match=message):
        codes.name_of(ref)


@pytest.mark.usefixtures("no_kubernetes")
def test_submit_with_staged_code_runs_in_its_mount_directory(
    trnctl: Any, deployed: Any, code_dir: Path
) -> None:
    assert trnctl("code", "stage", str(code_dir), "mine", "--env", "trn-dev").exit_code == 0

    run = trnctl(
        "job", "submit", "--env", "trn-dev", "--code", "code/mine/", "--dry-run", "--",
        "torchrun", "train.py",
    )  # fmt: skip

    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    assert job["spec"]["trainer"]["command"][-3:] == ["--workdir", "/datasets/code/mine", "--"]
    assert job["metadata"]["labels"][jobs.CODE_LABEL] == "mine"
    assert problems(job) == []


@pytest.mark.usefixtures("no_kubernetes")
def test_submit_refuses_code_that_was_not_staged_whole(
    trnctl: Any, deployed: Any, code_dir: Path
) -> None:
    # The files without the manifest: a stage that stopped before its end.
    deployed.put_object(Bucket=BUCKET, Key="code/mine/train.py", Body=b"")

    run = trnctl("job", "submit", "--env", "trn-dev", "--code", "code/mine", "--dry-run", "--", "x")

    assert run.exit_code == ExitCode.NOT_FOUND
    assert (
        f"code code/mine is not staged: s3://{BUCKET}/code/mine/trnctl-code.json does not exist; "
        "stage it first with: trnctl code stage DIR mine --env trn-dev"
    ) in run.stderr
