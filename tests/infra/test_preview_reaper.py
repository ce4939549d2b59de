"""The preview reaper's logic against moto's CloudFormation."""

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aws_cdk as cdk
import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from constructs_lib import PreviewLifecycle
from constructs_lib.preview_reaper.handler import (
    POLL_SECONDS,
    DeletionFailed,
    handler,
    move_schedule,
    reap,
    refusal,
)
from tests.conftest import construct_app

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


IN_USE = "Export pv-network:Vpc cannot be deleted as it is in use by other-app"


def statuses_after_delete(client: Any, seen: list[str]) -> None:
    """The stack as DescribeStacks shows it on each call after DeleteStack: the statuses in
    ``seen``, in turn (moto deletes at once), then gone."""
    original_delete, original_describe = client.delete_stack, client.describe_stacks
    after: list[str] = []

    def delete(**kwargs: Any) -> Any:
        after.extend(seen)
        return {}

    def describe(**kwargs: Any) -> Any:
        response = original_describe(**kwargs)
        if after:
            response["Stacks"][0].update({"StackStatus": after.pop(0), "StackStatusReason": IN_USE})
        elif kwargs["StackName"] != "pv-network":  # by id, after the statuses: deleted
            original_delete(StackName="pv-network")
            return original_describe(**kwargs)
        return response

    client.delete_stack, client.describe_stacks = delete, describe


@pytest.mark.parametrize("back_to", ["UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE"])
def test_a_refused_deletion_raises_with_cloudformations_reason(
    cloudformation: Any, back_to: str
) -> None:
    """CloudFormation refuses to delete a stack whose export another stack imports: the stack
    goes back to its old status, never to DELETE_FAILED (botocore's StackDeleteComplete waiter
    counts these states as failures). Polling on would hand over for hours."""
    create(cloudformation, "pv-network")
    statuses_after_delete(cloudformation, ["DELETE_IN_PROGRESS", back_to])
    with pytest.raises(
        DeletionFailed,
        match=rf"^pv-network: deletion refused, the stack is in {back_to}: {IN_USE} "
        r"\(deleted so far: \[\]\)$",
    ):
        run(cloudformation, event("pv-network"))


def test_a_deletion_that_never_starts_is_refused(cloudformation: Any) -> None:
    create(cloudformation, "pv-network")
    statuses_after_delete(cloudformation, ["UPDATE_COMPLETE"] * 10)
    with pytest.raises(DeletionFailed, match=r"^pv-network: deletion refused"):
        run(cloudformation, event("pv-network"))


def test_the_old_status_read_right_after_the_call_is_not_a_refusal(cloudformation: Any) -> None:
    """DeleteStack's answer does not promise that the next read shows DELETE_IN_PROGRESS."""
    create(cloudformation, "pv-network")
    statuses_after_delete(cloudformation, ["UPDATE_COMPLETE", "DELETE_IN_PROGRESS"])
    result = run(cloudformation, event("pv-network"))
    assert result == {"status": "done", "deleted": ["pv-network"], "resumed": False}


TARGET = {
    "Arn": "arn:aws:lambda:us-east-2:123456789012:function:trn-pv-alpha-reaper",
    "RoleArn": "arn:aws:iam::123456789012:role/expiry",
    "Input": json.dumps({"project": "alpha"}),
}


def moved_schedule(description: str) -> dict[str, Any]:
    """A one-time schedule for 2026-12-01 11:00 UTC with ``description``, as the schedule
    reads after :func:`move_schedule` to a day later (moto's Scheduler)."""
    scheduler = boto3.client("scheduler", region_name="us-east-2")
    scheduler.create_schedule(
        Name="trn-pv-alpha-expiry",
        Description=description,
        ScheduleExpression="at(2026-12-01T11:00:00)",
        ScheduleExpressionTimezone="Etc/UTC",
        FlexibleTimeWindow={"Mode": "OFF"},
        Target=TARGET,
    )
    move_schedule(
        scheduler, "trn-pv-alpha-expiry", "default", datetime(2026, 12, 2, 11, 0, tzinfo=UTC)
    )
    moved: dict[str, Any] = scheduler.get_schedule(Name="trn-pv-alpha-expiry", GroupName="default")
    return moved


def test_move_schedule_keeps_the_target(cloudformation: Any) -> None:
    moved = moved_schedule("Delete preview alpha at 2026-12-01T11:00:00Z")
    assert moved["ScheduleExpression"] == "at(2026-12-02T11:00:00)"
    assert moved["ScheduleExpressionTimezone"] == "Etc/UTC"
    assert moved["Target"]["Arn"] == TARGET["Arn"] and moved["Target"]["Input"] == TARGET["Input"]
    assert moved["FlexibleTimeWindow"] == {"Mode": "OFF"}
    assert moved["Description"] == "Delete preview alpha at 2026-12-02T11:00:00Z"


def test_move_schedule_leaves_a_description_that_names_no_time(cloudformation: Any) -> None:
    moved = moved_schedule("Delete preview alpha at once, please")
    assert moved["Description"] == "Delete preview alpha at once, please"


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


def stack_description(name: str, status: str, expires: str = PAST) -> dict[str, Any]:
    return {
        "StackName": name,
        "StackId": f"arn:aws:cloudformation:us-east-2:123456789012:stack/{name}/1",
        "CreationTime": NOW,
        "StackStatus": status,
        "Tags": [
            {"Key": TAGS["preview"], "Value": "alpha"},
            {"Key": TAGS["expires_at"], "Value": expires},
        ],
    }


def test_a_resumed_run_waits_for_a_deletion_already_in_progress() -> None:
    """The continuation of a run that handed over finds its stack DELETE_IN_PROGRESS: it
    waits for it without deleting it again, then goes on to the next stack. Stubber: moto
    deletes a stack at once, and the Stubber refuses any call not listed here."""
    client = boto3.client(
        "cloudformation",
        region_name="us-east-2",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    cluster = stack_description("pv-cluster", "DELETE_IN_PROGRESS")
    network = stack_description("pv-network", "CREATE_COMPLETE")
    stubber = Stubber(client)
    stubber.add_response("describe_stacks", {"Stacks": [cluster]}, {"StackName": "pv-cluster"})
    stubber.add_response(
        "describe_stacks", {"Stacks": [cluster]}, {"StackName": cluster["StackId"]}
    )
    stubber.add_client_error(
        "describe_stacks",
        service_error_code="ValidationError",
        service_message=f"Stack with id {cluster['StackId']} does not exist",
        expected_params={"StackName": cluster["StackId"]},
    )
    stubber.add_response("describe_stacks", {"Stacks": [network]}, {"StackName": "pv-network"})
    stubber.add_response("delete_stack", {}, {"StackName": network["StackId"]})
    stubber.add_response(
        "describe_stacks",
        {"Stacks": [{**network, "StackStatus": "DELETE_COMPLETE"}]},
        {"StackName": network["StackId"]},
    )
    slept: list[float] = []

    with stubber:
        result = reap(
            client,
            event("pv-network", "pv-cluster"),
            now=NOW,
            millis_left=lambda: 900_000,
            resume=lambda: pytest.fail("no handover with time left"),
            reschedule=lambda when: pytest.fail(f"nothing to reschedule, got {when}"),
            sleep=slept.append,
        )

    assert result == {"status": "done", "deleted": ["pv-cluster", "pv-network"]}
    assert slept == [POLL_SECONDS]
    stubber.assert_no_pending_responses()


class LambdaContext:
    invoked_function_arn = "arn:aws:lambda:us-east-2:123456789012:function:trn-pv-delta-reaper"

    def get_remaining_time_in_millis(self) -> int:
        return 900_000


def test_handler_moves_the_schedule_that_the_construct_made(cloudformation: Any) -> None:
    """The schedule and event as PreviewLifecycle synthesizes them, fed to handler(): a stack
    redeployed with a later expiry moves that very schedule, which keeps its target and
    event."""
    app = construct_app()
    env = cdk.Environment(account="123456789012", region="us-east-2")
    life = cdk.Stack(app, "pv-delta-lifecycle", env=env)
    network = cdk.Stack(app, "pv-delta-network", env=env)
    PreviewLifecycle(life, "P", project="delta", expires_at=NOW, stacks=[life, network])
    resources = cdk.assertions.Template.from_stack(life).to_json()["Resources"]
    (made,) = [
        r["Properties"] for r in resources.values() if r["Type"] == "AWS::Scheduler::Schedule"
    ]
    payload = json.loads(made["Target"]["Input"])
    scheduler = boto3.client("scheduler", region_name="us-east-2")
    scheduler.create_schedule(
        Name=made["Name"],
        ScheduleExpression=made["ScheduleExpression"],
        ScheduleExpressionTimezone=made["ScheduleExpressionTimezone"],
        FlexibleTimeWindow=made["FlexibleTimeWindow"],
        Target={
            "Arn": LambdaContext.invoked_function_arn,
            "RoleArn": "arn:aws:iam::123456789012:role/expiry",
            "Input": made["Target"]["Input"],
        },
    )
    # handler() reads the real clock: expiries an hour before it and a day after it.
    clock = datetime.now(UTC).replace(second=0, microsecond=0)
    past = (clock - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    future = (clock + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name, expires in (("pv-delta-lifecycle", past), ("pv-delta-network", future)):
        cloudformation.create_stack(
            StackName=name,
            TemplateBody=TEMPLATE,
            Tags=[
                {"Key": payload["tags"]["preview"], "Value": "delta"},
                {"Key": payload["tags"]["expires_at"], "Value": expires},
            ],
        )

    result = handler(payload, LambdaContext())

    assert result == {
        "status": "rescheduled",
        "deleted": [],
        "stack": "pv-delta-network",
        "until": future,
    }
    moved = scheduler.get_schedule(Name=made["Name"], GroupName="default")
    assert moved["ScheduleExpression"] == f"at({future.removesuffix('Z')})"
    assert moved["Target"]["Input"] == made["Target"]["Input"]
    assert alive(cloudformation) == {"pv-delta-lifecycle", "pv-delta-network"}
