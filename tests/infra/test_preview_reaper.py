"""The preview reaper's logic against moto's CloudFormation."""

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from moto import mock_aws

from constructs_lib.preview_reaper.handler import DeletionFailed, move_schedule, reap, refusal

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
PAST, FUTURE = "2026-12-01T11:00:00Z", "2026-12-02T11:00:00Z"
TAGS = {"preview": "trn-platform:preview", "expires_at": "trn-platform:expires-at"}
TEMPLATE = json.dumps({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}})


@pytest.fixture
def cloudformation(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-2",
    }.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield boto3.client("cloudformation", region_name="us-east-2")


def create(
    client: Any, name: str, project: str | None = "alpha", expires: str | None = PAST
) -> None:
    tags = []
    if project is not None:
        tags.append({"Key": TAGS["preview"], "Value": project})
    if expires is not None:
        tags.append({"Key": TAGS["expires_at"], "Value": expires})
    client.create_stack(StackName=name, TemplateBody=TEMPLATE, Tags=tags)


def alive(client: Any) -> set[str]:
    return {
        s["StackName"]
        for s in client.describe_stacks()["Stacks"]
        if s["StackStatus"] != "DELETE_COMPLETE"
    }


def event(*stacks: str, self_stack: str | None = None) -> dict[str, Any]:
    return {"project": "alpha", "stacks": list(stacks), "self_stack": self_stack, "tags": TAGS}


def run(client: Any, payload: dict[str, Any], millis: int = 900_000) -> dict[str, Any]:
    resumed: list[bool] = []
    moved: list[datetime] = []
    result = reap(
        client,
        payload,
        now=NOW,
        millis_left=lambda: millis,
        resume=lambda: resumed.append(True),
        reschedule=moved.append,
        sleep=lambda _: None,
    )
    result["resumed"] = bool(resumed)
    if moved:
        result["moved_to"] = moved
    return result


def test_deletes_expired_stacks_newest_first(cloudformation: Any) -> None:
    calls: list[str] = []
    real = cloudformation.delete_stack

    def record(**kwargs: Any) -> Any:
        name = cloudformation.describe_stacks(StackName=kwargs["StackName"])["Stacks"][0]
        calls.append(name["StackName"])
        return real(**kwargs)

    cloudformation.delete_stack = record
    for name in ("pv-lifecycle", "pv-network", "pv-data", "pv-cluster"):
        create(cloudformation, name)
    create(cloudformation, "other-app", project=None, expires=None)
    result = run(
        cloudformation,
        event("pv-lifecycle", "pv-network", "pv-data", "pv-cluster", self_stack="pv-lifecycle"),
    )
    assert result["status"] == "done"
    assert calls == ["pv-cluster", "pv-data", "pv-network", "pv-lifecycle"]
    assert alive(cloudformation) == {"other-app"}


def test_an_extended_preview_moves_the_schedule_to_its_new_expiry(cloudformation: Any) -> None:
    create(cloudformation, "pv-network")
    create(cloudformation, "pv-cluster", expires=FUTURE)
    result = run(cloudformation, event("pv-network", "pv-cluster"))
    assert result["status"] == "rescheduled" and result["stack"] == "pv-cluster"
    assert result["until"] == FUTURE
    assert result["moved_to"] == [datetime(2026, 12, 2, 11, 0, tzinfo=UTC)]
    assert alive(cloudformation) == {"pv-network", "pv-cluster"}


def test_a_failed_deletion_raises_for_lambda_to_retry_and_report(cloudformation: Any) -> None:
    create(cloudformation, "pv-network")
    original = cloudformation.describe_stacks
    calls = iter(range(100))

    def describe(**kwargs: Any) -> Any:
        response = original(**kwargs)
        if next(calls) >= 1:  # the first call finds the stack, the poll finds it failed
            response["Stacks"][0].update(
                {"StackStatus": "DELETE_FAILED", "StackStatusReason": "bucket not empty"}
            )
        return response

    cloudformation.describe_stacks = describe
    with pytest.raises(DeletionFailed, match="pv-network: bucket not empty"):
        run(cloudformation, event("pv-network"))


def test_move_schedule_keeps_the_target(cloudformation: Any) -> None:
    scheduler = boto3.client("scheduler", region_name="us-east-2")
    target = {
        "Arn": "arn:aws:lambda:us-east-2:123456789012:function:trn-pv-alpha-reaper",
        "RoleArn": "arn:aws:iam::123456789012:role/expiry",
        "Input": json.dumps({"project": "alpha"}),
    }
    scheduler.create_schedule(
        Name="trn-pv-alpha-expiry",
        ScheduleExpression="at(2026-12-01T11:00:00)",
        ScheduleExpressionTimezone="Etc/UTC",
        FlexibleTimeWindow={"Mode": "OFF"},
        Target=target,
    )
    move_schedule(
        scheduler, "trn-pv-alpha-expiry", "default", datetime(2026, 12, 2, 11, 0, tzinfo=UTC)
    )
    moved = scheduler.get_schedule(Name="trn-pv-alpha-expiry", GroupName="default")
    assert moved["ScheduleExpression"] == "at(2026-12-02T11:00:00)"
    assert moved["ScheduleExpressionTimezone"] == "Etc/UTC"
    assert moved["Target"]["Arn"] == target["Arn"] and moved["Target"]["Input"] == target["Input"]
    assert moved["FlexibleTimeWindow"] == {"Mode": "OFF"}


@pytest.mark.parametrize(
    ("project", "expires", "reason"),
    [
        ("beta", PAST, "not 'alpha'"),
        (None, PAST, "None, not 'alpha'"),
        ("alpha", None, "is not an ISO-8601 UTC time"),
        ("alpha", "tomorrow", "'tomorrow' is not an ISO-8601 UTC time"),
        ("alpha", "2026-12-01T11:00:00", "is not an ISO-8601 UTC time"),
    ],
)
def test_never_deletes_a_stack_whose_tags_do_not_match(
    cloudformation: Any, project: str | None, expires: str | None, reason: str
) -> None:
    create(cloudformation, "pv-network", project=project, expires=expires)
    result = run(cloudformation, event("pv-network"))
    assert result["status"] == "stopped" and reason in result["reason"]
    assert alive(cloudformation) == {"pv-network"}


def test_stacks_already_gone_are_skipped(cloudformation: Any) -> None:
    create(cloudformation, "pv-network")
    result = run(cloudformation, event("pv-network", "pv-never-deployed"))
    assert result == {"status": "done", "deleted": ["pv-network"], "resumed": False}


def test_hands_over_before_the_lambda_timeout(cloudformation: Any) -> None:
    create(cloudformation, "pv-network")
    stuck = {"StackStatus": "DELETE_IN_PROGRESS"}
    original = cloudformation.describe_stacks
    answers = iter([None, stuck])

    def describe(**kwargs: Any) -> Any:
        answer = next(answers, None)
        if answer is None:
            return original(**kwargs)
        response = original(**kwargs)
        response["Stacks"][0].update(answer)
        return response

    cloudformation.describe_stacks = describe
    result = run(cloudformation, event("pv-network"), millis=30_000)
    assert result["status"] == "continuing" and result["resumed"] is True


def test_refusal_accepts_exactly_the_matching_expired_tags() -> None:
    stack = {
        "Tags": [
            {"Key": TAGS["preview"], "Value": "alpha"},
            {"Key": TAGS["expires_at"], "Value": PAST},
        ]
    }
    assert refusal(stack, event(), NOW) is None
