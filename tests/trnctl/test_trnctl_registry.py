"""The model registry: `trnctl model register|list|show|promote|rollback` against moto's S3 (the
manifests, the source of truth) and, for an environment deployed with model_registry=sagemaker,
moto's SageMaker Model Registry (one model package group per model, approval status in step);
the TrainJob a model was exported from is read from the fake API server with the real
kubernetes client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
import regex
import test_trnctl_kube
from fake_kube import FakeKube
from test_trnctl_aws import OUTPUTS
from test_trnctl_model_stage import model_dir

from trnctl import aws, models, registry, sagemaker_registry, versioning
from trnctl.errors import ExitCode, TrnctlError
from trnctl.versioning import Ref

__all__ = ["model_dir"]  # a fixture these tests share with test_trnctl_model_stage

fake = test_trnctl_kube.fake
BUCKET = OUTPUTS.datasets_bucket
CHECKPOINTS = OUTPUTS.checkpoints_bucket
EXPORT = "ft-1-export-1201120000"
REF = Ref("models", "support")


@pytest.fixture
def s3(fake: FakeKube) -> Any:
    client = aws.client("s3")
    for bucket in (BUCKET, CHECKPOINTS):
        client.create_bucket(
            Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-east-2"}
        )
    return client


def sagemaker_env() -> None:
    """trn-dev's outputs as an environment deployed with -c model_registry=sagemaker writes
    them."""
    outputs = json.loads(OUTPUTS.to_json()) | {"model_registry": "sagemaker"}
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs",
        Value=json.dumps(outputs),
        Type="String",
        Overwrite=True,
    )


def train_job(fake: FakeKube, name: str = "ft-1") -> None:
    """A --model TrainJob as `job submit` leaves it, with the versions it resolved."""
    fake.trainjobs[name] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": name,
            "labels": {"trn-platform/model": "llama"},
            "annotations": {
                "trn-platform/data": "datasets/tickets/v3",
                "trn-platform/data-manifest-sha256": "ab" * 32,
                "trn-platform/model-version": "models/llama/v1",
            },
        },
        "spec": {
            "trainer": {
                "image": "example.com/trainer:7",
                "numNodes": 1,
                "args": ["--model", "/datasets/models/llama/v1", "--max-steps", "9"],
            }
        },
    }


def export(s3: Any, root: Path, job: str = "ft-1", name: str = EXPORT) -> str:
    """``root``'s model files where FSx exports `trnctl job export` to."""
    prefix = f"{job}/export/{name}/"
    for item in models.inspect(root).files:
        s3.upload_file(str(root / item), CHECKPOINTS, prefix + item)
    return f"s3://{CHECKPOINTS}/{prefix}"


def register(trnctl: Any, *extra: str) -> Any:
    return trnctl("model", "register", "support", "--job", "ft-1", "--env", "trn-dev", *extra)


def manifest(s3: Any, version: int) -> dict[str, Any]:
    found = versioning.get_json(s3, BUCKET, REF.at(version).record_key())
    assert found is not None
    return found[0]


def registered(trnctl: Any, s3: Any, fake: FakeKube, root: Path, count: int) -> None:
    """``count`` candidate versions of models/support, each from another export of ft-1."""
    train_job(fake)
    for number in range(1, count + 1):
        (root / "generation_config.json").write_text(json.dumps({"n": number}))
        export(s3, root, name=f"ft-1-export-120112000{number}")
        run = register(trnctl, "--export", f"ft-1-export-120112000{number}")
        assert run.exit_code == 0, run.stderr


# --- register -----------------------------------------------------------------------------


def test_register_copies_the_newest_export_as_a_candidate_with_its_lineage(
    trnctl: Any, s3: Any, fake: FakeKube, model_dir: Path
) -> None:
    train_job(fake)
    export(s3, model_dir, name="ft-1-export-1130000000")
    uri = export(s3, model_dir)

    run = register(trnctl, "--reason", "week 49")

    assert run.exit_code == 0, run.stderr
    assert run.stdout == (
        f"registered models/support@v1 (candidate) from {uri}; promote it with: trnctl model "
        "promote models/support@v1 --env trn-dev --reason ...\n"
    )
    record = manifest(s3, 1)
    assert record["status"] == "candidate" and record["state"] == "complete"
    assert record["source"] == {"kind": "export", "uri": uri}
    assert record["lineage"] == {
        "job": "ft-1",
        "base_model": "models/llama/v1",
        "dataset": "datasets/tickets/v3",
        "dataset_manifest_sha256": "ab" * 32,
        "config": {
            "image": "example.com/trainer:7",
            "numNodes": 1,
            "args": ["--model", "/datasets/models/llama/v1", "--max-steps", "9"],
        },
    }
    assert [(h["status"], h["by"], h["reason"]) for h in record["history"]] == [
        ("candidate", aws.caller_arn(), "week 49")
    ]
    copied = {
        o["Key"].rsplit("/", 1)[1]: o["Size"]
        for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="models/support/v1/")["Contents"]
    }
    assert copied == {n: (model_dir / n).stat().st_size for n in models.inspect(model_dir).files}


def test_the_same_export_registered_again_is_the_same_version(
    trnctl: Any, s3: Any, fake: FakeKube, model_dir: Path
) -> None:
    train_job(fake)
    export(s3, model_dir)
    assert register(trnctl).exit_code == 0

    again = register(trnctl, "--export", EXPORT)

    assert again.exit_code == 0, again.stderr
    assert again.stdout.startswith("already registered as models/support@v1 (candidate)")
    assert set(versioning.records(s3, BUCKET, REF)) == {1}


def test_a_job_without_an_export_is_not_found(trnctl: Any, s3: Any, fake: FakeKube) -> None:
    train_job(fake)

    run = register(trnctl)

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr == (
        f"trnctl: job ft-1 has no export in s3://{CHECKPOINTS}/ft-1/export/ (FSx exports "
        "/fsx/checkpoints there); export it first with: trnctl job export ft-1 --env ...\n"
    )


def test_an_export_without_config_json_is_refused_and_registers_nothing(
    trnctl: Any, s3: Any, fake: FakeKube, model_dir: Path
) -> None:
    """FSx exports files one by one: an export whose config.json is not in S3 yet is no model."""
    train_job(fake)
    uri = export(s3, model_dir)
    s3.delete_object(Bucket=CHECKPOINTS, Key=f"ft-1/export/{EXPORT}/config.json")

    run = register(trnctl)

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr == (
        f"trnctl: {uri}config.json: missing; a Hugging Face model directory has one\n"
    )
    assert versioning.records(s3, BUCKET, REF) == {}


def test_a_truncated_weights_file_in_the_export_is_refused(
    trnctl: Any, s3: Any, fake: FakeKube, model_dir: Path
) -> None:
    train_job(fake)
    uri = export(s3, model_dir)
    key = f"ft-1/export/{EXPORT}/model-00001-of-00002.safetensors"
    body = s3.get_object(Bucket=CHECKPOINTS, Key=key)["Body"].read()
    s3.put_object(Bucket=CHECKPOINTS, Key=key, Body=body[:-4])

    run = register(trnctl)

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr == (
        f"trnctl: {uri}model-00001-of-00002.safetensors: the header describes 128 bytes of "
        "tensor data but the file holds 124 (truncated or corrupt)\n"
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--export", "Bad_Name"), "'Bad_Name'"),
        (("--job", "Bad_Job"), "'Bad_Job'"),
    ],
)
def test_bad_names_are_usage_errors(
    trnctl: Any, s3: Any, fake: FakeKube, extra: tuple[str, ...], message: str
) -> None:
    run = register(trnctl, *extra)

    assert run.exit_code == ExitCode.USAGE
    assert message in run.stderr


def test_an_unknown_job_is_not_found(trnctl: Any, s3: Any, fake: FakeKube, model_dir: Path) -> None:
    export(s3, model_dir)

    run = register(trnctl)

    assert run.exit_code == ExitCode.NOT_FOUND
    assert "TrainJob 'ft-1' not found in namespace 'training'" in run.stderr


# --- promote, rollback, list, show --------------------------------------------------------


def promote(trnctl: Any, version: str, reason: str = "better eval loss") -> Any:
    return trnctl("model", "promote", version, "--env", "trn-dev", "--reason", reason)


def test_promote_puts_a_candidate_in_service_and_records_who_and_why(
    trnctl: Any, s3: Any, fake: FakeKube, model_dir: Path
) -> None:
    registered(trnctl, s3, fake, model_dir, 2)

    first = promote(trnctl, "support@v1")
    second = promote(trnctl, "models/support@v2", "week 50 wins")

    assert first.stdout == "promoted models/support@v1: in service now (before: none)\n"
    assert second.stdout == "promoted models/support@v2: in service now (before: v1)\n"
    history = manifest(s3, 2)["history"]
    assert [(h["status"], h["reason"]) for h in history] == [
        ("candidate", "registered with trnctl model register"),
        ("promoted", "week 50 wins"),
    ]
    assert history[-1]["by"] == aws.caller_arn()
    assert registry.resolve(s3, BUCKET, "models/support", "trn-dev").path == "models/support/v2"


@pytest.mark.parametrize(
    ("version", "code", "message"),
    [
        ("support@v1", ExitCode.USAGE, "models/support@v1 is promoted already (v1 promoted, "),
        (
            "support@v2",
            ExitCode.USAGE,
            "models/support@v2 is older than v3, which is in service: roll that back (trnctl "
            "model rollback models/support) to return to an older version",
        ),
        ("support", ExitCode.USAGE, "name the version to promote, e.g. models/support@v3"),
        ("support@v9", ExitCode.NOT_FOUND, "models/support@v9 does not exist; complete versions"),
        ("models/a/b@v1", ExitCode.USAGE, "'a/b' cannot name a versioned model"),
    ],
)
def test_promote_refuses(
    trnctl: Any,
    s3: Any,
    fake: FakeKube,
    model_dir: Path,
    version: str,
    code: ExitCode,
    message: str,
) -> None:
    registered(trnctl, s3, fake, model_dir, 3)
    assert promote(trnctl, "support@v1").exit_code == 0
    assert promote(trnctl, "support@v3").exit_code == 0

    run = promote(trnctl, version)

    assert run.exit_code == code
    assert message in run.stderr
    assert run.stderr.count("\n") == 1


def test_rollback_rejects_the_version_in_service_and_the_one_below_returns(
    trnctl: Any, s3: Any, fake: FakeKube, model_dir: Path
) -> None:
    registered(trnctl, s3, fake, model_dir, 3)
    assert promote(trnctl, "support@v1").exit_code == 0
    assert promote(trnctl, "support@v3").exit_code == 0

    run = trnctl("model", "rollback", "support", "--env", "trn-dev", "--reason", "complaints")
    last = trnctl("model", "rollback", "support", "--env", "trn-dev", "--reason", "all bad")
    none = trnctl("model", "rollback", "support", "--env", "trn-dev", "--reason", "again")

    assert run.stdout == "rolled back models/support@v3 (rejected); in service now: v1\n"
    assert manifest(s3, 3)["history"][-1]["reason"] == "rolled back: complaints"
    assert last.stdout == "rolled back models/support@v1 (rejected); in service now: none\n"
    assert none.exit_code == ExitCode.NOT_FOUND
    assert none.stderr == (
        "trnctl: models/support has no version in service to roll back (v1 rejected, "
        "v2 candidate, v3 rejected)\n"
    )


def test_rollback_takes_a_model_not_a_version(trnctl: Any, s3: Any, fake: FakeKube) -> None:
    run = trnctl("model", "rollback", "support@v2", "--env", "trn-dev", "--reason", "x")

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr == (
        "trnctl: NAME 'support@v2': rollback takes the model, not a version (models/support)\n"
    )


def test_list_shows_each_version_its_status_and_which_is_in_service(
    trnctl: Any, s3: Any, fake: FakeKube, model_dir: Path
) -> None:
    registered(trnctl, s3, fake, model_dir, 2)
    assert promote(trnctl, "support@v1").exit_code == 0
    registry.update(
        s3,
        BUCKET,
        REF.at(2),
        lambda r: {**r, "evaluation": {"candidate": {"loss": 1.23456}}},
    )

    run = trnctl("model", "list", "support", "--env", "trn-dev")

    assert run.exit_code == 0, run.stderr
    assert "models/support (in service: v1)" in run.stdout
    v2 = next(line for line in run.stdout.splitlines() if "│ v2 " in line)
    v1 = next(line for line in run.stdout.splitlines() if "v1 (in service)" in line)
    assert "candidate" in v2 and "1.2346" in v2 and "datasets/tickets/v3" in v2
    assert "promoted" in v1 and "models/llama/v1" in v1 and "(job ft-1)" in v1


def test_list_of_a_model_without_versions_is_not_found(trnctl: Any, s3: Any) -> None:
    run = trnctl("model", "list", "nothing", "--env", "trn-dev")

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr == (
        "trnctl: models/nothing has no versions; stage one with: trnctl model stage DIR nothing "
        "--env ...\n"
    )


def test_show_prints_the_manifest(trnctl: Any, s3: Any, fake: FakeKube, model_dir: Path) -> None:
    registered(trnctl, s3, fake, model_dir, 1)

    run = trnctl("model", "show", "models/support@v1", "--env", "trn-dev")
    bare = trnctl("model", "show", "support", "--env", "trn-dev")

    shown = json.loads(run.stdout)
    assert shown == {**manifest(s3, 1), "in_service": False, "path": "/datasets/models/support/v1"}
    assert bare.exit_code == ExitCode.USAGE
    assert bare.stderr == "trnctl: models/support: name the version, e.g. models/support@v3\n"


def test_a_manifest_changed_by_another_writer_meanwhile_keeps_both_changes(
    s3: Any, clients: Any
) -> None:
    """The read-edit-write of a manifest is conditional on the ETag it read: a change another
    writer makes in between fails that write, and the edit is made again on top of it."""
    ref = REF.at(1)
    versioning.put_json(s3, BUCKET, ref.record_key(), {"state": "complete", "status": "candidate"})
    mine = clients("s3")
    other = boto3.client("s3")

    def race(params: dict[str, Any], **_: Any) -> None:
        if "IfMatch" in params and not race.done:  # type: ignore[attr-defined]
            race.done = True  # type: ignore[attr-defined]
            other.put_object(
                Bucket=BUCKET,
                Key=params["Key"],
                Body=json.dumps({"state": "complete", "status": "candidate", "note": "x"}),
            )

    race.done = False  # type: ignore[attr-defined]
    mine.meta.events.register("before-parameter-build.s3.PutObject", race, unique_id="race")
    try:
        written = registry.set_status(mine, BUCKET, ref, "promoted", "me", "why")
    finally:
        mine.meta.events.unregister("before-parameter-build.s3.PutObject", unique_id="race")

    assert written["note"] == "x" and written["status"] == "promoted"
    assert manifest(s3, 1) == written


def test_a_manifest_that_keeps_changing_is_given_up(s3: Any, clients: Any) -> None:
    ref = REF.at(1)
    versioning.put_json(s3, BUCKET, ref.record_key(), {"state": "complete"})
    mine = clients("s3")
    other = boto3.client("s3")

    writes = iter(range(100))

    def race(params: dict[str, Any], **_: Any) -> None:
        if "IfMatch" in params:  # another body each time: another ETag
            body = json.dumps({"state": "complete", "n": next(writes)})
            other.put_object(Bucket=BUCKET, Key=params["Key"], Body=body)

    mine.meta.events.register("before-parameter-build.s3.PutObject", race, unique_id="race")
    try:
        with pytest.raises(TrnctlError, match="the manifest of models/support@v1 kept changing"):
            registry.set_status(mine, BUCKET, ref, "promoted", "me", "why")
    finally:
        mine.meta.events.unregister("before-parameter-build.s3.PutObject", unique_id="race")


# --- SageMaker Model Registry ---------------------------------------------------------------


def packages(group: str) -> dict[int, dict[str, Any]]:
    sm = boto3.client("sagemaker")
    listed = sm.list_model_packages(ModelPackageGroupName=group)["ModelPackageSummaryList"]
    return {
        int(p["ModelPackageVersion"]): sm.describe_model_package(
            ModelPackageName=p["ModelPackageArn"]
        )
        for p in listed
    }


def test_with_sagemaker_each_version_is_a_package_whose_approval_follows_its_status(
    trnctl: Any, s3: Any, fake: FakeKube, model_dir: Path
) -> None:
    sagemaker_env()
    registered(trnctl, s3, fake, model_dir, 2)
    group = boto3.client("sagemaker").describe_model_package_group(
        ModelPackageGroupName="trn-dev-support"
    )
    assert [package["ModelApprovalStatus"] for package in packages("trn-dev-support").values()] == [
        "PendingManualApproval",
        "PendingManualApproval",
    ]

    assert promote(trnctl, "support@v1").exit_code == 0
    assert promote(trnctl, "support@v2", "week 50").exit_code == 0
    rolled = trnctl("model", "rollback", "support", "--env", "trn-dev", "--reason", "bad")

    assert rolled.exit_code == 0, rolled.stderr
    found = packages("trn-dev-support")
    assert {v: p["ModelApprovalStatus"] for v, p in found.items()} == {
        1: "Approved",
        2: "Rejected",
    }
    assert found[2]["ApprovalDescription"].startswith(f"rejected by {aws.caller_arn()}: ")
    assert group["ModelPackageGroupDescription"] == (
        "models/support of the trn-platform environment trn-dev"
    )
    for version, package in found.items():
        assert manifest(s3, version)["sagemaker"] == {
            "model_package_group": "trn-dev-support",
            "model_package_arn": package["ModelPackageArn"],
        }
    source = found[1]["InferenceSpecification"]["Containers"][0]["ModelDataSource"]
    assert source["S3DataSource"] == {
        "S3Uri": f"s3://{BUCKET}/models/support/v1/",
        "S3DataType": "S3Prefix",
        "CompressionType": "None",
    }


def test_with_sagemaker_a_staged_model_is_an_approved_package(
    trnctl: Any, s3: Any, model_dir: Path
) -> None:
    sagemaker_env()

    run = trnctl("model", "stage", "--env", "trn-dev", str(model_dir), "base")

    assert run.exit_code == 0, run.stderr
    (package,) = packages("trn-dev-base").values()
    assert package["ModelApprovalStatus"] == "Approved"
    assert package["CustomerMetadataProperties"]["trn-platform-version"] == "models/base@v1"


def test_without_sagemaker_nothing_reaches_sagemaker(
    trnctl: Any, s3: Any, fake: FakeKube, model_dir: Path
) -> None:
    registered(trnctl, s3, fake, model_dir, 1)
    assert promote(trnctl, "support@v1").exit_code == 0

    listed = boto3.client("sagemaker").list_model_package_groups()

    assert listed["ModelPackageGroupSummaryList"] == []
    assert "sagemaker" not in manifest(s3, 1)


def _api_pattern(shape: str) -> Any:
    """The pattern the SageMaker API gives ``shape`` (botocore's service model), compiled with
    the regex module, which knows the \\p{...} classes Python's re does not."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    return regex.compile(f"^(?:{model.shape_for(shape).metadata['pattern']})$")


@pytest.mark.parametrize(
    ("environment", "model", "expected"),
    [
        ("trn-dev", "support", "trn-dev-support"),
        ("trn-dev", "llama-3.2-1b", "trn-dev-llama-3-2-1b-"),
        ("trn-dev", "m" * 63, "trn-dev-" + "m" * 46 + "-"),
    ],
)
def test_group_names_are_entity_names_and_distinct(
    environment: str, model: str, expected: str
) -> None:
    name = sagemaker_registry.group_name(environment, model)

    assert name.startswith(expected)
    assert _api_pattern("EntityName").match(name)
    assert len(name) <= sagemaker_registry.MAX_ENTITY_NAME
    assert name != sagemaker_registry.group_name(environment, model.replace(".", "-") + "x")


def test_package_metadata_and_tokens_are_what_the_api_accepts() -> None:
    record = {
        "created_by": "arn:aws:sts::123456789012:assumed-role/ops/jane@example.com",
        "lineage": {
            "base_model": "models/llama/v1",
            "dataset": "datasets/tickets/v3",
            "job": "ft-1",
            "dataset_manifest_sha256": "ab" * 32,
        },
        "evaluation": {"eval_data": "datasets/eval/v1", "candidate": {"loss": 1.5}},
    }

    found = sagemaker_registry.metadata(REF.at(2), record, f"s3://{BUCKET}/models/support/v2/")
    long = sagemaker_registry.metadata(REF.at(2), {"created_by": "é(x)" * 100}, "s3://b/p/")
    token = sagemaker_registry.client_token("trn-dev", REF.at(2))

    assert found["base-model"] == "models/llama/v1" and found["eval-loss"] == "1.5"
    assert long["created-by"] == "é-x-" * 64
    for metadata in (found, long):
        for key, value in metadata.items():
            assert _api_pattern("CustomerMetadataKey").match(key)
            assert _api_pattern("CustomerMetadataValue").match(value)
    assert _api_pattern("ClientToken").match(token) and len(token) <= 36
    assert token != sagemaker_registry.client_token("trn-dev", REF.at(3))
