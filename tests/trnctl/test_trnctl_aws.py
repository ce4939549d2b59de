"""Shared behaviour: the AWS environment, retries, error lines, environment lookup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, NoCredentialsError

from tests.conftest import sample_outputs
from trnctl import aws, environment
from trnctl.errors import ExitCode, TrnctlError, from_aws

TRNCTL = Path(sys.executable).with_name("trnctl")

OUTPUTS = sample_outputs()


def test_clients_use_adaptive_retries() -> None:
    config = aws.client("ec2").meta.config

    assert config.retries["mode"] == "adaptive"
    assert config.retries["total_max_attempts"] == aws.MAX_ATTEMPTS


def test_aws_region_wins_over_aws_default_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "eu-north-1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")

    assert aws.session_region() == "eu-north-1"
    assert aws.client("ec2").meta.region_name == "eu-north-1"
    assert aws.client("ec2", "ap-southeast-4").meta.region_name == "ap-southeast-4"


def test_aws_endpoint_url_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:4566")

    assert aws.client("cloudformation").meta.endpoint_url == "http://127.0.0.1:4566"


def test_missing_credentials_exit_3_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    # The real console script, so that nothing between it and the user adds a traceback.
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("AWS_") or key in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")
    }
    env |= {"AWS_EC2_METADATA_DISABLED": "true", "AWS_REGION": "us-east-2"}

    done = subprocess.run(
        [
            str(TRNCTL),
            "preflight",
            "--az",
            "us-east-2a",
            "--instance-type",
            "trn2.48xlarge",
            "--count",
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == ExitCode.AWS
    assert done.stdout == ""
    assert done.stderr == (
        "trnctl: no AWS credentials found: set AWS_PROFILE (and run `aws sso login` for SSO "
        "profiles) or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY\n"
    )


def test_unknown_profile_is_one_line(trnctl: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_PROFILE", "nobody")

    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn2.48xlarge", "--count", "1"
    )

    assert run.exit_code == ExitCode.AWS
    assert (
        run.stderr == "trnctl: The config profile (nobody) could not be found: check AWS_PROFILE\n"
    )


def test_missing_region_is_a_usage_error(trnctl: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION")

    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn2.48xlarge", "--count", "1"
    )

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr == "trnctl: no AWS region: pass --region or set AWS_REGION\n"


@pytest.mark.parametrize(
    ("code", "start"),
    [
        ("UnauthorizedOperation", "access denied calling DescribeStacks (UnauthorizedOperation)"),
        ("ExpiredToken", "access denied calling DescribeStacks (ExpiredToken)"),
        ("SlowDown", "AWS throttled DescribeStacks (SlowDown)"),
        ("ValidationError", "DescribeStacks failed (ValidationError): line one line two"),
    ],
)
def test_client_errors_become_one_line(code: str, start: str) -> None:
    error = ClientError(
        {"Error": {"Code": code, "Message": "line one\nline two"}}, "DescribeStacks"
    )

    translated = from_aws(error)

    assert translated is not None
    assert str(translated).startswith(start)
    assert "\n" not in str(translated)
    assert translated.exit_code == ExitCode.AWS


def test_other_exceptions_are_not_translated() -> None:
    assert from_aws(RuntimeError("bug")) is None
    assert from_aws(NoCredentialsError()) is not None


@pytest.mark.usefixtures("moto")
def test_lookup_reads_the_outputs_parameter() -> None:
    ssm = aws.client("ssm")
    ssm.put_parameter(Name="/trn-platform/trn-dev/outputs", Value=OUTPUTS.to_json(), Type="String")

    assert environment.lookup("trn-dev", ssm) == OUTPUTS


@pytest.mark.usefixtures("moto")
def test_lookup_of_an_unknown_environment_names_the_parameter_and_region() -> None:
    with pytest.raises(TrnctlError) as raised:
        environment.lookup("trn-nope", aws.client("ssm"))

    assert raised.value.exit_code == ExitCode.NOT_FOUND
    assert str(raised.value) == (
        "unknown environment 'trn-nope': SSM parameter /trn-platform/trn-nope/outputs does not "
        "exist in us-east-2; deploy it, or check --env and the region"
    )


@pytest.mark.usefixtures("moto")
@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("not json", "environment outputs are not JSON"),
        (json.dumps({"environment": "trn-dev"}), "environment outputs lack keys: region,"),
    ],
)
def test_lookup_of_malformed_outputs_fails(value: str, problem: str) -> None:
    ssm = aws.client("ssm")
    ssm.put_parameter(Name="/trn-platform/trn-dev/outputs", Value=value, Type="String")

    with pytest.raises(TrnctlError, match=problem) as raised:
        environment.lookup("trn-dev", ssm)

    assert raised.value.exit_code == ExitCode.FAILED
