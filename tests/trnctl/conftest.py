"""Fixtures for trnctl: a fake AWS environment, moto, a CLI runner and a per-operation Stubber."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
import typer.testing
from botocore.stub import Stubber
from moto import mock_aws
from preflight_answers import QUOTA, image_response, quota_response
from typer.testing import CliRunner

from trnctl import preflight
from trnctl.cli import app

# typer's CliRunner builds the Click command tree from the Typer app on every invoke (some 50 ms
# for trnctl's, several hundred invokes per run); the console script builds it once per process.
# Build it once per test process: the tree is a function of the app, which no test changes.
typer.testing._get_command = functools.cache(typer.main.get_command)

REGION = "us-east-2"
_AWS_VARIABLES = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


@pytest.fixture(autouse=True)
def fake_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials and no config files, so that nothing can reach real AWS."""
    for name in _AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # Wide enough that rich never wraps a table cell that a test looks for.
    monkeypatch.setenv("COLUMNS", "400")


@pytest.fixture
def moto() -> Iterator[None]:
    with mock_aws():
        yield


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def trnctl() -> Any:
    """Runs the CLI in-process: ``trnctl("preflight", "--az", ...)`` returns a :class:`Run`."""
    runner = CliRunner()

    def invoke(*args: str) -> Run:
        result = runner.invoke(app, list(args), catch_exceptions=False)
        return Run(result.exit_code, result.stdout, result.stderr)

    return invoke


class OperationStubber(Stubber):
    """A Stubber that answers only the named operations of its client; other calls go on (to
    moto). botocore's Stubber answers every call of a client, but one EC2 client makes calls that
    moto implements (instance type offerings) and calls that it lacks (capacity reservations).
    It hooks the same handlers as ``Stubber.activate``, per operation instead of ``*.*``."""

    def __init__(self, client: Any, *operations: str) -> None:
        super().__init__(client)
        service = client.meta.service_model.service_id.hyphenize()
        self._names = [f"{service}.{operation}" for operation in operations]

    def activate(self) -> None:
        events = self.client.meta.events
        for name in self._names:
            events.register_first(
                f"before-parameter-build.{name}",
                self._assert_expected_params,
                unique_id=f"{self._expected_params_event_id}-{name}",
            )
            events.register(
                f"before-call.{name}",
                self._get_response_handler,
                unique_id=f"{self._event_id}-{name}",
            )

    def deactivate(self) -> None:
        events = self.client.meta.events
        for name in self._names:
            events.unregister(
                f"before-parameter-build.{name}",
                unique_id=f"{self._expected_params_event_id}-{name}",
            )
            events.unregister(f"before-call.{name}", unique_id=f"{self._event_id}-{name}")


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Makes ``trnctl.aws.client`` hand out one client per (service, region), so that a test can
    attach a Stubber to the very client that a command will use: ``clients("ec2")``."""
    import trnctl.aws

    made: dict[tuple[str, str | None], Any] = {}
    real = trnctl.aws.client

    def client(service: str, region: str | None = None) -> Any:
        key = (service, region or REGION)
        if key not in made:
            made[key] = real(service, region)
        return made[key]

    monkeypatch.setattr(trnctl.aws, "client", client)
    return client


@pytest.fixture
def stub() -> Any:
    """``stub(client, "DescribeCapacityReservations", ...)``: an active :class:`OperationStubber`
    (``stub(client)`` stubs every operation, as a plain Stubber does)."""
    active: list[Stubber] = []

    def make(client: Any, *operations: str) -> Stubber:
        stubber = OperationStubber(client, *operations) if operations else Stubber(client)
        stubber.activate()
        active.append(stubber)
        return stubber

    yield make
    for stubber in active:
        stubber.deactivate()


@pytest.fixture
def aws(clients: Any, stub: Any) -> Any:
    """Queue the answers preflight asks where moto has none (the Trn vCPU quota, the capacity
    reservations of the type in the zone); everything else on EC2 goes to moto."""

    def setup(
        *,
        quota: float = 384,
        reservations: list[dict[str, Any]] | None = None,
        az: str = "us-east-2a",
        instance_type: str = "trn2.48xlarge",
    ) -> tuple[Any, Any]:
        quotas = stub(clients("service-quotas"))
        quotas.add_response("get_service_quota", quota_response(quota), QUOTA)
        ec2 = stub(clients("ec2"), "DescribeCapacityReservations")
        ec2.add_response(
            "describe_capacity_reservations",
            {"CapacityReservations": reservations or []},
            {
                "Filters": [
                    {"Name": "instance-type", "Values": [instance_type]},
                    {"Name": "availability-zone", "Values": [az]},
                    {"Name": "state", "Values": ["active", "scheduled"]},
                ]
            },
        )
        images = stub(clients("ecr"), "BatchGetImage")
        for image in preflight.EKS_IMAGES:
            images.add_response(
                "batch_get_image",
                image_response("602401143452", image.repository, image.tag),
                {
                    "registryId": "602401143452",
                    "repositoryName": image.repository,
                    "imageIds": [{"imageTag": image.tag}],
                },
            )
        return quotas, ec2

    return setup
