"""Deletes an expired preview environment's stacks, newest first (AWS Lambda handler).

Invoked once by an EventBridge Scheduler schedule at the preview's expiry. A stack is deleted
only if it carries the preview tag with this project and an expiry tag that has passed; the
first stack that does not stops the run, since the stacks it depends on could not be deleted
anyway. A stack of this preview whose expiry lies ahead (the preview was extended, or a stack
redeployed) moves the schedule to that time. Deletions that outlast the invocation continue in
a fresh asynchronous invocation. A deletion that fails raises, so that Lambda retries it and
then reports the failure to the preview's alert topic.

Standard library and boto3 only (both in the Lambda runtime), so it ships as a single file.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

POLL_SECONDS = 15
# The expires-at tag's format (ISO-8601, UTC, to the second).
EXPIRY_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
# Leave room to hand over to a fresh invocation before Lambda's timeout.
HANDOVER_MS = 60_000
# Polls before a stack must show DELETE_IN_PROGRESS. Right after DeleteStack a read may still
# show the stack's old status; a deletion CloudFormation refuses (an export another stack
# imports) takes the stack back to it (UPDATE_COMPLETE, UPDATE_ROLLBACK_COMPLETE: failures of
# botocore's StackDeleteComplete waiter), never to DELETE_FAILED.
START_POLLS = 4


class DeletionFailed(RuntimeError):
    """CloudFormation could not delete a stack; raised so that Lambda retries and reports it."""


def refusal(stack: dict[str, Any], event: dict[str, Any], now: datetime) -> str | None:
    """Why ``stack`` must not be deleted, or None when it may."""
    project, expires, expiry = _preview_tags(stack, event)
    if project != event["project"]:
        return f"tag {event['tags']['preview']} is {project!r}, not {event['project']!r}"
    if expiry is None:
        return f"tag {event['tags']['expires_at']} {expires!r} is not an ISO-8601 UTC time"
    if expiry > now:
        return f"expires at {expires}, not yet"
    return None


def later_expiry(stack: dict[str, Any], event: dict[str, Any], now: datetime) -> datetime | None:
    """The expiry of a stack of this preview that has not come yet, else None."""
    project, _, expiry = _preview_tags(stack, event)
    if project != event["project"] or expiry is None:
        return None
    return expiry if expiry > now else None


def _preview_tags(
    stack: dict[str, Any], event: dict[str, Any]
) -> tuple[str | None, str, datetime | None]:
    """The stack's preview tag, its expiry tag as written, and that expiry parsed (None when it
    is not an ISO-8601 UTC time)."""
    tags = {t["Key"]: t["Value"] for t in stack.get("Tags", [])}
    expires = tags.get(event["tags"]["expires_at"], "")
    try:
        expiry = datetime.strptime(expires, EXPIRY_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        expiry = None
    return tags.get(event["tags"]["preview"]), expires, expiry


def reap(
    cloudformation: Any,
    event: dict[str, Any],
    *,
    now: datetime,
    millis_left: Callable[[], int],
    resume: Callable[[], None],
    reschedule: Callable[[datetime], None],
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Delete ``event["stacks"]`` (given in deployment order) in reverse order.

    Returns ``{"status": "done" | "stopped" | "rescheduled" | "continuing", "deleted": [...],
    "reason": ...}``.

    Raises:
        DeletionFailed: a stack ended in DELETE_FAILED, or CloudFormation refused its deletion
            (:func:`_await_deletion`).
    """
    deleted: list[str] = []
    for name in reversed(event["stacks"]):
        stack = _describe(cloudformation, name)
        if stack is None:
            continue
        reason = refusal(stack, event, now)
        later = later_expiry(stack, event, now)
        if later is not None:
            reschedule(later)
            when = later.strftime(EXPIRY_FORMAT)
            return {"status": "rescheduled", "deleted": deleted, "stack": name, "until": when}
        if reason:
            return {"status": "stopped", "deleted": deleted, "stack": name, "reason": reason}
        if stack["StackStatus"] != "DELETE_IN_PROGRESS":
            cloudformation.delete_stack(StackName=stack["StackId"])
        if name == event.get("self_stack"):
            deleted.append(name)
            break  # this function goes with its own stack; nothing can follow
        if not _await_deletion(
            cloudformation, name, stack["StackId"], deleted, millis_left, resume, sleep
        ):
            return {"status": "continuing", "deleted": deleted, "stack": name}
        deleted.append(name)
    return {"status": "done", "deleted": deleted}


def _await_deletion(
    cloudformation: Any,
    name: str,
    stack_id: str,
    deleted: list[str],
    millis_left: Callable[[], int],
    resume: Callable[[], None],
    sleep: Callable[[float], None],
) -> bool:
    """Polls until the stack is gone (True), or hands over to a fresh invocation (False).

    Raises:
        DeletionFailed: DELETE_FAILED; or the stack left DELETE_IN_PROGRESS for another status,
            or did not reach it within :data:`START_POLLS` polls: CloudFormation refused.
    """
    started, polls = False, 0
    while (current := _describe(cloudformation, stack_id)) is not None:
        status = current["StackStatus"]
        reason = current.get("StackStatusReason", status)
        if status == "DELETE_FAILED":
            raise DeletionFailed(f"{name}: {reason} (deleted so far: {deleted})")
        started = started or status == "DELETE_IN_PROGRESS"
        if status != "DELETE_IN_PROGRESS" and (started or polls >= START_POLLS):
            raise DeletionFailed(
                f"{name}: deletion refused, the stack is in {status}: {reason} "
                f"(deleted so far: {deleted})"
            )
        if millis_left() < HANDOVER_MS:
            resume()
            return False
        sleep(POLL_SECONDS)
        polls += 1
    return True


def _describe(cloudformation: Any, name: str) -> dict[str, Any] | None:
    try:
        stacks = cloudformation.describe_stacks(StackName=name)["Stacks"]
    except cloudformation.exceptions.ClientError as error:
        if "does not exist" in str(error):
            return None
        raise
    if not stacks or stacks[0]["StackStatus"] == "DELETE_COMPLETE":
        return None
    stack: dict[str, Any] = stacks[0]
    return stack


def move_schedule(scheduler: Any, name: str, group: str, when: datetime) -> None:
    """Point the one-time schedule ``group/name`` at ``when`` (UTC), keeping its target; a
    description that ends in " at <time>" (the platform's) names the new time."""
    current = scheduler.get_schedule(Name=name, GroupName=group)
    keep = ("Description", "FlexibleTimeWindow", "Target", "KmsKeyArn", "ActionAfterCompletion")
    timed = re.fullmatch(r"(.*) at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", current.get("Description", ""))
    if timed:
        current["Description"] = f"{timed[1]} at {when.astimezone(UTC).strftime(EXPIRY_FORMAT)}"
    scheduler.update_schedule(
        Name=name,
        GroupName=group,
        ScheduleExpression=f"at({when.astimezone(UTC):%Y-%m-%dT%H:%M:%S})",
        ScheduleExpressionTimezone="Etc/UTC",
        State="ENABLED",
        **{key: current[key] for key in keep if key in current},
    )


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    import boto3

    cloudformation = boto3.client("cloudformation")
    schedule = event["schedule"]

    def resume() -> None:
        boto3.client("lambda").invoke(
            FunctionName=context.invoked_function_arn,
            InvocationType="Event",
            Payload=json.dumps(event).encode(),
        )

    result = reap(
        cloudformation,
        event,
        now=datetime.now(UTC),
        millis_left=context.get_remaining_time_in_millis,
        resume=resume,
        reschedule=lambda when: move_schedule(
            boto3.client("scheduler"), schedule["name"], schedule["group"], when
        ),
    )
    print(json.dumps({"function": os.environ.get("AWS_LAMBDA_FUNCTION_NAME"), **result}))
    return result
