"""Versioned datasets: `trnctl data stage DIR datasets/NAME` makes immutable versions and moves
`latest` last; `data list` shows them; jobs resolve `datasets/NAME[@vN]` at submit. Against
moto's S3, with its conditional writes (If-None-Match, If-Match)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from test_trnctl_aws import OUTPUTS

from tests.s3_writes import S3Writes, Stopped
from trainer import data as shard_format
from trnctl import aws, datasets, versioning
from trnctl.errors import ExitCode, TrnctlError

pytestmark = pytest.mark.usefixtures("moto")

BUCKET = OUTPUTS.datasets_bucket


@pytest.fixture
def deployed() -> Any:
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=OUTPUTS.to_json(), Type="String"
    )
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-east-2"})
    return s3


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """161,000 bytes of text: two shards of 100,000 tokens at most."""
    root = tmp_path / "week1"
    root.mkdir()
    (root / "a.txt").write_bytes(b"the quick brown fox jumps over the lazy dog\n" * 3000)
    (root / "b.txt").write_text("Ein Woerterbuch, ein Aerger.\n" * 1000)
    return root


def week2(corpus: Path) -> Path:
    """Other text of the same size: a new version."""
    (corpus / "a.txt").write_bytes((corpus / "a.txt").read_bytes().upper())
    return corpus


def stage(trnctl: Any, source: Path, dest: str = "datasets/tales") -> Any:
    return trnctl(
        "data",
        "stage",
        str(source),
        dest,
        "--env",
        "trn-dev",
        "--shard-tokens",
        "100000",
        "--part-size-mib",
        "5",
    )


def keys(s3: Any, prefix: str = "datasets/") -> set[str]:
    return {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])}


def download(s3: Any, prefix: str, root: Path) -> Path:
    into = root / prefix.strip("/").replace("/", "-")
    into.mkdir()
    for key in keys(s3, prefix):
        s3.download_file(BUCKET, key, str(into / key.rsplit("/", 1)[1]))
    return into


def latest(s3: Any) -> str | None:
    found = versioning.get_json(s3, BUCKET, "datasets/tales/latest")
    return None if found is None else str(found[0]["version"])


def record(s3: Any, version: str) -> dict[str, Any]:
    found = versioning.get_json(s3, BUCKET, f"datasets/tales/versions/{version}.json")
    assert found is not None
    return found[0]


def test_a_stage_makes_version_1_and_then_points_latest_at_it(
    trnctl: Any, deployed: Any, corpus: Path
) -> None:
    run = stage(trnctl, corpus)

    assert run.exit_code == 0, run.stderr
    assert keys(deployed) == {
        "datasets/tales/v1/shard_00000.bin",
        "datasets/tales/v1/shard_00001.bin",
        "datasets/tales/v1/manifest.json",
        "datasets/tales/versions/v1.json",
        "datasets/tales/latest",
    }
    manifest = deployed.get_object(Bucket=BUCKET, Key="datasets/tales/v1/manifest.json")
    digest = hashlib.sha256(manifest["Body"].read()).hexdigest()
    assert record(deployed, "v1") == {
        "name": "tales",
        "version": "v1",
        "state": "complete",
        "content_sha256": digest,
        "manifest_sha256": digest,
        "tokens": 161_000,
        "tokenizer": shard_format.BYTE_TOKENIZER,
        "shards": 2,
        "bytes": sum(
            o["Size"]
            for o in deployed.list_objects_v2(Bucket=BUCKET, Prefix="datasets/tales/v1/")[
                "Contents"
            ]
        ),
        "files": 3,
        "source": str(corpus.resolve()),
        "staged_at": record(deployed, "v1")["staged_at"],
        "staged_by": aws.caller_arn(),
    }
    assert latest(deployed) == "v1"
    assert (
        f"staged 2 shards (161,000 tokens, 2 files) as datasets/tales/v1: uploaded 3, skipped 0 "
        f"already intact; manifest sha256 {digest}; datasets/tales/latest -> v1; jobs read it as "
        "--data datasets/tales or datasets/tales@v1" in run.stdout
    )


def test_the_same_data_again_is_the_same_version(trnctl: Any, deployed: Any, corpus: Path) -> None:
    assert stage(trnctl, corpus).exit_code == 0
    before = keys(deployed)

    again = stage(trnctl, corpus)

    assert again.exit_code == 0, again.stderr
    assert "already staged as datasets/tales/v1 (same manifest sha256 " in again.stdout
    assert keys(deployed) == before


def test_new_data_is_version_2_and_version_1_stays_as_it_was(
    trnctl: Any, deployed: Any, corpus: Path
) -> None:
    assert stage(trnctl, corpus).exit_code == 0
    v1 = {
        k: deployed.head_object(Bucket=BUCKET, Key=k)["ETag"]
        for k in keys(deployed, "datasets/tales/v1/")
    }

    run = stage(trnctl, week2(corpus))

    assert run.exit_code == 0, run.stderr
    assert "as datasets/tales/v2" in run.stdout and "latest -> v2" in run.stdout
    assert latest(deployed) == "v2"
    assert {k: deployed.head_object(Bucket=BUCKET, Key=k)["ETag"] for k in v1} == v1
    assert record(deployed, "v2")["manifest_sha256"] != record(deployed, "v1")["manifest_sha256"]


def test_a_bare_name_with_env_is_datasets_name(trnctl: Any, deployed: Any, corpus: Path) -> None:
    run = stage(trnctl, corpus, "tales")

    assert run.exit_code == 0, run.stderr
    assert latest(deployed) == "v1"


@pytest.mark.parametrize(
    ("dest", "message"),
    [
        ("datasets/tales@v3", "a stage makes the next version of datasets/tales itself"),
        ("datasets/Tales", "'Tales' cannot name a versioned dataset"),
        ("datasets/tales@3", "the version is vN"),
    ],
)
def test_a_bad_destination_is_refused(
    trnctl: Any, deployed: Any, corpus: Path, dest: str, message: str
) -> None:
    run = stage(trnctl, corpus, dest)

    assert run.exit_code == ExitCode.USAGE
    assert message in run.stderr
    assert keys(deployed) == set()


# The writes of a stage of version 2: claim the record, delete the (absent) manifest, both
# shards, the manifest, the record marked complete, then latest.
V2_PUTS = [
    "datasets/tales/versions/v2.json",
    "datasets/tales/v2/shard_00000.bin",
    "datasets/tales/v2/shard_00001.bin",
    "datasets/tales/v2/manifest.json",
    "datasets/tales/versions/v2.json",
    "datasets/tales/latest",
]


def test_the_writes_of_a_version_go_in_this_order(
    trnctl: Any, deployed: Any, clients: Any, corpus: Path
) -> None:
    assert stage(trnctl, corpus).exit_code == 0
    writes = S3Writes(clients("s3"))

    assert stage(trnctl, week2(corpus)).exit_code == 0

    assert writes.puts == V2_PUTS


@pytest.mark.parametrize("stop_at", range(1, len(V2_PUTS) + 1))
def test_a_stage_stopped_anywhere_leaves_latest_on_the_complete_version(
    trnctl: Any, deployed: Any, clients: Any, corpus: Path, tmp_path: Path, stop_at: int
) -> None:
    """Stopped before each of its writes (as a kill between two writes leaves the bucket; an S3
    write itself is whole or absent): latest still names v1, which jobs resolve to; the next
    stage of the same data resumes v2 and completes it."""
    assert stage(trnctl, corpus).exit_code == 0
    writes = S3Writes(clients("s3"), stop_at=stop_at)
    with pytest.raises(Stopped):
        stage(trnctl, week2(corpus))
    writes.close()

    assert latest(deployed) == "v1"
    assert datasets.resolve(deployed, BUCKET, "datasets/tales", "trn-dev").path == (
        "datasets/tales/v1"
    )
    if stop_at < len(V2_PUTS):
        with pytest.raises(TrnctlError, match=r"datasets/tales@v2 (does not exist|is still stag)"):
            datasets.resolve(deployed, BUCKET, "datasets/tales@v2", "trn-dev")
    else:  # every file and the record are whole: v2 by name, but not yet latest
        assert datasets.resolve(deployed, BUCKET, "datasets/tales@v2", "trn-dev").path == (
            "datasets/tales/v2"
        )
    again = stage(trnctl, corpus)
    assert again.exit_code == 0, again.stderr
    assert latest(deployed) == "v2"
    assert record(deployed, "v2")["state"] == "complete"
    shard_format.open_dataset(download(deployed, "datasets/tales/v2/", tmp_path), verify=True)
    assert keys(deployed, "datasets/tales/versions/") == {
        "datasets/tales/versions/v1.json",
        "datasets/tales/versions/v2.json",
    }


def test_a_first_stage_stopped_midway_leaves_no_dataset_to_resolve(
    trnctl: Any, deployed: Any, clients: Any, corpus: Path
) -> None:
    writes = S3Writes(clients("s3"), stop_at=4)  # before the manifest
    with pytest.raises(Stopped):
        stage(trnctl, corpus)
    writes.close()

    assert latest(deployed) is None
    with pytest.raises(TrnctlError, match="no version of it is staged") as error:
        datasets.resolve(deployed, BUCKET, "datasets/tales", "trn-dev")
    assert error.value.exit_code == ExitCode.NOT_FOUND


def test_a_number_another_stage_took_meanwhile_is_skipped(
    trnctl: Any, deployed: Any, clients: Any, corpus: Path
) -> None:
    """Two stages of different data at once: the other one claims v2 between this one's listing
    and its claim; the conditional write refuses this one's claim of v2 and it takes v3."""
    assert stage(trnctl, corpus).exit_code == 0
    s3 = clients("s3")
    other = boto3.client("s3")

    def race(params: dict[str, Any], **_: Any) -> None:
        if params["Key"] == "datasets/tales/versions/v2.json" and "IfNoneMatch" in params:
            other.put_object(Bucket=BUCKET, Key=params["Key"], Body=b'{"state": "staging"}')

    s3.meta.events.register("before-parameter-build.s3.PutObject", race, unique_id="race")
    try:
        run = stage(trnctl, week2(corpus))
    finally:
        s3.meta.events.unregister("before-parameter-build.s3.PutObject", unique_id="race")

    assert run.exit_code == 0, run.stderr
    assert "as datasets/tales/v3" in run.stdout
    assert latest(deployed) == "v3"
    assert record(deployed, "v2") == {"state": "staging"}


def test_latest_never_moves_back_to_an_older_version(deployed: Any) -> None:
    ref = versioning.Ref("datasets", "tales")
    versioning.point_latest(deployed, BUCKET, ref.at(3))

    assert versioning.point_latest(deployed, BUCKET, ref.at(2)) == 3
    assert latest(deployed) == "v3"
    assert versioning.point_latest(deployed, BUCKET, ref.at(4)) == 4


def test_data_list_shows_each_version_and_which_is_latest(
    trnctl: Any, deployed: Any, corpus: Path
) -> None:
    assert stage(trnctl, corpus).exit_code == 0
    assert stage(trnctl, week2(corpus)).exit_code == 0

    run = trnctl("data", "list", "tales", "--env", "trn-dev")

    assert run.exit_code == 0, run.stderr
    lines = run.stdout.splitlines()
    v2 = next(line for line in lines if "v2 (latest)" in line)
    v1 = next(line for line in lines if "│ v1 " in line)
    for line, version in ((v2, "v2"), (v1, "v1")):
        assert "complete" in line and "161,000" in line and shard_format.BYTE_TOKENIZER in line
        assert f"{record(deployed, version)['bytes'] / 1024:.1f} KiB" in line
        assert record(deployed, version)["manifest_sha256"] in line
    assert lines.index(v2) < lines.index(v1)


def test_data_list_of_a_dataset_without_versions_is_not_found(trnctl: Any, deployed: Any) -> None:
    run = trnctl("data", "list", "datasets/none", "--env", "trn-dev")

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr == (
        f"trnctl: datasets/none has no versions in s3://{BUCKET}/; stage one with: trnctl data "
        "stage DIR datasets/none --env trn-dev\n"
    )


# --- jobs ---------------------------------------------------------------------------------


def submit(trnctl: Any, data: str) -> Any:
    return trnctl(
        "job", "submit", "--env", "trn-dev", "--preset", "tiny", "--data", data,
        "--name", "run-1", "--dry-run",
    )  # fmt: skip


def test_a_job_reads_the_version_latest_names_when_it_is_submitted(
    trnctl: Any, deployed: Any, corpus: Path
) -> None:
    assert stage(trnctl, corpus).exit_code == 0
    assert stage(trnctl, week2(corpus)).exit_code == 0

    job = yaml.safe_load(submit(trnctl, "datasets/tales").stdout)
    pinned = yaml.safe_load(submit(trnctl, "datasets/tales@v1").stdout)

    args = job["spec"]["trainer"]["args"]
    assert args[args.index("--data") + 1] == "/datasets/datasets/tales/v2"
    assert job["metadata"]["annotations"] == {
        "trn-platform/data": "datasets/tales/v2",
        "trn-platform/data-manifest-sha256": record(deployed, "v2")["manifest_sha256"],
    }
    args = pinned["spec"]["trainer"]["args"]
    assert args[args.index("--data") + 1] == "/datasets/datasets/tales/v1"
    assert pinned["metadata"]["annotations"]["trn-platform/data"] == "datasets/tales/v1"


def test_a_version_that_is_not_staged_is_not_found(
    trnctl: Any, deployed: Any, corpus: Path
) -> None:
    assert stage(trnctl, corpus).exit_code == 0

    run = submit(trnctl, "datasets/tales@v7")

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr == (
        "trnctl: datasets/tales@v7 does not exist; complete versions of datasets/tales: v1 "
        "(trnctl data stage DIR datasets/tales --env trn-dev)\n"
    )


def test_data_staged_before_versions_keeps_working(trnctl: Any, deployed: Any) -> None:
    deployed.put_object(Bucket=BUCKET, Key="datasets/old/manifest.json", Body=b"{}")

    old = yaml.safe_load(submit(trnctl, "datasets/old").stdout)
    plain = yaml.safe_load(submit(trnctl, "corpora/x").stdout)
    missing = submit(trnctl, "datasets/never")

    assert "/datasets/datasets/old" in old["spec"]["trainer"]["args"]
    assert "/datasets/corpora/x" in plain["spec"]["trainer"]["args"]
    assert missing.exit_code == ExitCode.NOT_FOUND
    assert "trnctl data stage DIR datasets/never --env trn-dev" in missing.stderr
