"""The installed console script against a local moto server, reached through AWS_ENDPOINT_URL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

pytest.importorskip("flask", reason="moto's ThreadedMotoServer needs flask (moto[server])")
pytest.importorskip(
    "flask_cors", reason="moto's ThreadedMotoServer needs flask-cors (moto[server])"
)

from moto.server import ThreadedMotoServer

from tests import warm

TRNCTL = Path(sys.executable).with_name("trnctl")


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    port = warm.free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def client(endpoint: str) -> Any:
    def make(service: str) -> Any:
        return boto3.client(service, region_name="us-east-2", endpoint_url=endpoint)

    return make


def trnctl(endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint}
    return subprocess.run(
        [str(TRNCTL), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.slow
def test_data_stage_finds_the_environment_and_uploads(
    endpoint: str, client: Any, tmp_path: Path
) -> None:
    from test_trnctl_aws import OUTPUTS

    client("s3").create_bucket(
        Bucket="e2e-datasets", CreateBucketConfiguration={"LocationConstraint": "us-east-2"}
    )
    outputs = OUTPUTS.to_json().replace("trn-dev-datasets", "e2e-datasets")
    client("ssm").put_parameter(Name="/trn-platform/trn-e2e/outputs", Value=outputs, Type="String")
    (tmp_path / "tale.txt").write_text("once upon a time\n" * 5000)

    staged = trnctl(
        endpoint,
        "data",
        "stage",
        str(tmp_path),
        "tales",
        "--env",
        "trn-e2e",
        "--shard-tokens",
        "40000",
    )
    unknown = trnctl(endpoint, "data", "stage", str(tmp_path), "tales", "--env", "trn-nope")

    assert staged.returncode == 0, staged.stderr
    assert "staged 3 shards (85,000 tokens, 1 files) as datasets/tales/v1" in staged.stdout
    keys = {o["Key"] for o in client("s3").list_objects_v2(Bucket="e2e-datasets")["Contents"]}
    version = {f"datasets/tales/v1/shard_0000{i}.bin" for i in range(3)}
    assert keys == version | {
        "datasets/tales/v1/manifest.json",
        "datasets/tales/versions/v1.json",
        "datasets/tales/latest",
    }
    assert unknown.returncode == 4
    assert unknown.stderr == (
        "trnctl: unknown environment 'trn-nope': SSM parameter /trn-platform/trn-nope/outputs "
        "does not exist in us-east-2; deploy it, or check --env and the region\n"
    )


def test_preview_reap_deletes_expired_previews_through_the_endpoint(
    endpoint: str, client: Any
) -> None:
    pytest.importorskip(
        "openapi_spec_validator",
        reason="moto's CloudFormation imports openapi-spec-validator (moto[cloudformation])",
    )
    cfn = client("cloudformation")
    template = json.dumps({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}})
    past = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    future = (datetime.now(UTC) + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name, expires in (("trn-pv-old-network", past), ("trn-pv-new-network", future)):
        cfn.create_stack(
            StackName=name,
            TemplateBody=template,
            Tags=[
                {"Key": "trn-platform:preview", "Value": name.split("-")[2]},
                {"Key": "trn-platform:expires-at", "Value": expires},
            ],
        )

    run = trnctl(endpoint, "preview", "reap", "--yes")

    assert run.returncode == 0, run.stderr
    assert "deleted: trn-pv-old-network" in run.stdout
    remaining = {
        s["StackName"]
        for s in cfn.describe_stacks()["Stacks"]
        if s["StackStatus"] != "DELETE_COMPLETE"
    }
    assert remaining == {"trn-pv-new-network"}
