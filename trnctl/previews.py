"""Preview environments: the CloudFormation stacks tagged with a project and an expiry.

A preview stack carries ``trn-platform:preview=<project>`` and
``trn-platform:expires-at=<ISO-8601 UTC>``. The reaper deletes a stack only when it carries both
tags and the expiry, a valid UTC timestamp, has passed; a stack with one tag or a malformed
expiry is reported and left alone, and a stack with neither tag is never looked at.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from botocore.exceptions import WaiterError

from trn_catalog.outputs import MAX_PREVIEW_TTL_HOURS, TAG_EXPIRES_AT, TAG_PREVIEW
from trnctl.errors import ExitCode, TrnctlError

# The platform's own limit on a preview's ttl_hours (platform_config.parse.MAX_TTL_HOURS).
MAX_EXTEND_HOURS = MAX_PREVIEW_TTL_HOURS
# Capabilities a CDK stack with IAM resources and nested stacks needs for any update.
CAPABILITIES = ["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"]
_BUSY_SUFFIX = "_IN_PROGRESS"


class State(StrEnum):
    ACTIVE = "active"
    EXPIRED = "expired"
    MALFORMED = "malformed expiry"
    INCOMPLETE = "missing a tag"


@dataclass(frozen=True)
class PreviewStack:
    name: str
    stack_id: str
    status: str
    created: datetime
    tags: dict[str, str]

    @property
    def project(self) -> str | None:
        return self.tags.get(TAG_PREVIEW)

    @property
    def expires_raw(self) -> str | None:
        return self.tags.get(TAG_EXPIRES_AT)

    @property
    def expires(self) -> datetime | None:
        return parse_expiry(self.expires_raw) if self.expires_raw is not None else None

    def state(self, now: datetime) -> State:
        if not self.project or self.expires_raw is None:
            return State.INCOMPLETE
        expires = self.expires
        if expires is None:
            return State.MALFORMED
        return State.EXPIRED if expires <= now else State.ACTIVE


def parse_expiry(value: str) -> datetime | None:
    """``value`` as an aware UTC datetime, or None unless it is ISO-8601 with a UTC offset
    (``Z`` or ``+00:00``): a timestamp without a zone is as malformed as a non-timestamp."""
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if moment.tzinfo is None or moment.utcoffset() != timedelta(0):
        return None
    return moment.astimezone(UTC)


def format_expiry(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def preview_stacks(cfn: Any) -> list[PreviewStack]:
    """Every live stack that carries at least one of the two preview tags, oldest first.

    Raises:
        botocore.exceptions.ClientError: CloudFormation refused DescribeStacks.
    """
    found = []
    for page in cfn.get_paginator("describe_stacks").paginate():
        for stack in page["Stacks"]:
            tags = {t["Key"]: t["Value"] for t in stack.get("Tags", [])}
            if TAG_PREVIEW not in tags and TAG_EXPIRES_AT not in tags:
                continue
            if stack["StackStatus"] == "DELETE_COMPLETE":
                continue
            found.append(
                PreviewStack(
                    name=stack["StackName"],
                    stack_id=stack["StackId"],
                    status=stack["StackStatus"],
                    created=stack["CreationTime"],
                    tags=tags,
                )
            )
    return sorted(found, key=lambda s: (s.created, s.name))


@dataclass(frozen=True)
class ReapPlan:
    """What ``reap`` does: ``delete`` newest first, so a stack goes before the stacks whose
    exports it imports; the rest is reported and left alone."""

    delete: list[PreviewStack]
    malformed: list[PreviewStack]
    incomplete: list[PreviewStack]
    active: list[PreviewStack]


def plan_reap(stacks: list[PreviewStack], now: datetime, project: str | None = None) -> ReapPlan:
    """Sort ``stacks`` into what to delete and what to leave; ``project`` (default: every
    project) limits deletion to one project's stacks."""
    chosen = [s for s in stacks if project is None or s.project == project]
    by_state: dict[State, list[PreviewStack]] = {state: [] for state in State}
    for stack in chosen:
        by_state[stack.state(now)].append(stack)
    deletable = [s for s in by_state[State.EXPIRED] if s.status != "DELETE_IN_PROGRESS"]
    return ReapPlan(
        delete=sorted(deletable, key=lambda s: (s.created, s.name), reverse=True),
        malformed=by_state[State.MALFORMED],
        incomplete=by_state[State.INCOMPLETE],
        active=by_state[State.ACTIVE],
    )


def reap(
    cfn: Any, plan: ReapPlan, *, on_deleted: Callable[[PreviewStack], None] = lambda s: None
) -> None:
    """Delete ``plan.delete`` one at a time, each finished before the next starts, because
    CloudFormation refuses to delete a stack whose exports another stack still imports. Waits
    up to an hour per stack (FSx and EKS take minutes to delete).

    Raises:
        botocore.exceptions.WaiterError: a deletion failed (DELETE_FAILED) or timed out.
        botocore.exceptions.ClientError: CloudFormation refused a call.
    """
    waiter = cfn.get_waiter("stack_delete_complete")
    for stack in plan.delete:
        cfn.delete_stack(StackName=stack.stack_id)
        waiter.wait(StackName=stack.stack_id, WaiterConfig={"Delay": 15, "MaxAttempts": 240})
        on_deleted(stack)


def new_expiry(stack: PreviewStack, hours: int, now: datetime) -> datetime:
    """The expiry after extending by ``hours``: from the current expiry if it is still ahead,
    else (expired, malformed or missing) from ``now``; capped at
    :data:`~trn_catalog.outputs.MAX_PREVIEW_TTL_HOURS` after ``now``, so that extending again and
    again keeps a preview within two weeks of its last extension. Never earlier than the current
    expiry (an extension does not shorten one set further ahead by hand)."""
    base, cap = _base_and_cap(stack, now)
    return min(base + timedelta(hours=hours), max(cap, base))


def capped(stack: PreviewStack, hours: int, now: datetime) -> bool:
    """Whether the two-week cap stopped :func:`new_expiry` short of ``hours`` (a stack whose
    expiry already lies at or beyond it is not capped, only left as it is)."""
    base, cap = _base_and_cap(stack, now)
    return base < cap < base + timedelta(hours=hours)


def _base_and_cap(stack: PreviewStack, now: datetime) -> tuple[datetime, datetime]:
    """Where an extension counts from (the current expiry if still ahead, else ``now``) and
    the two-week cap, to the whole second, as the expiry tag holds them."""
    now = now.replace(microsecond=0)
    current = stack.expires
    base = current if current is not None and current > now else now
    return base, now + timedelta(hours=MAX_PREVIEW_TTL_HOURS)


# CloudFormation's StatusReason for a change set that changes no resource.
NO_CHANGES = "didn't contain changes"
# ResourceChange.Replacement values that mean a resource is, or may be, replaced.
REPLACING = frozenset({"True", "Conditional"})


@dataclass(frozen=True)
class Replacement:
    """A resource that a stack's change set would replace (``replacement`` "True") or may
    replace ("Conditional")."""

    stack: str
    logical_id: str
    resource_type: str
    replacement: str

    def __str__(self) -> str:
        maybe = "" if self.replacement == "True" else " (conditionally)"
        return f"{self.stack}: {self.logical_id} ({self.resource_type}){maybe}"


def extend(
    cfn: Any, project: str, hours: int, now: datetime
) -> list[tuple[PreviewStack, datetime]]:
    """Move the expiry of every stack of ``project`` by ``hours`` (see :func:`new_expiry`);
    returns each stack as it was with its new expiry. A stack whose expiry does not move (it
    lies at or beyond the cap already) is not updated.

    The tag changes go through a CloudFormation change set per stack that keeps the template and
    parameters (CloudFormation passes stack tags on to the resources that take tags). All change
    sets are made and read first: if any would replace a resource (ResourceChange.Replacement
    "True" or "Conditional", as a create-only Tags property such as a placement group's could),
    every one is deleted and nothing changes; otherwise each is executed. A change set
    CloudFormation finds empty (no resource takes the tag) is deleted and the stack's tags are
    updated directly.

    Raises:
        TrnctlError: ``hours`` outside 1 to 336 (USAGE); no stack of ``project`` (NOT_FOUND); a
            stack is in the middle of an operation, a change set would replace a resource (the
            message names each one) or failed for another reason (FAILED).
        botocore.exceptions.ClientError: CloudFormation refused a call.
        botocore.exceptions.WaiterError: a change set was not ready within 10 minutes.
    """
    if not 1 <= hours <= MAX_EXTEND_HOURS:
        raise TrnctlError(f"--hours {hours} is outside 1 to {MAX_EXTEND_HOURS}")
    stacks = [s for s in preview_stacks(cfn) if s.project == project]
    if not stacks:
        raise TrnctlError(
            f"no preview stacks of project {project!r} (tag {TAG_PREVIEW}={project})",
            ExitCode.NOT_FOUND,
        )
    busy = [s.name for s in stacks if s.status.endswith(_BUSY_SUFFIX)]
    if busy:
        raise TrnctlError(
            f"stacks busy, try again when they settle: {', '.join(busy)}", ExitCode.FAILED
        )
    planned = [(stack, new_expiry(stack, hours, now)) for stack in stacks]
    # At or past the cap already (set by hand, or extended this second): CloudFormation refuses
    # an update that changes nothing ("No updates are to be performed").
    moving = [(stack, expiry) for stack, expiry in planned if expiry != stack.expires]
    made = _checked_change_sets(cfn, moving, f"trnctl-extend-{now:%Y%m%d%H%M%S}")
    for (stack, expiry), change_set in zip(moving, made, strict=True):
        if change_set is None:
            _update_tags(cfn, stack, _tags_with(stack, expiry))
        else:
            cfn.execute_change_set(ChangeSetName=change_set, StackName=stack.name)
    return planned


def _checked_change_sets(
    cfn: Any, moving: list[tuple[PreviewStack, datetime]], name: str
) -> list[str | None]:
    """One tag change set per stack of ``moving`` (None where it changed no resource), made and
    read before any is executed; all are deleted when one would replace a resource.

    Raises:
        TrnctlError: a change set would replace a resource, or failed (FAILED).
    """
    made: list[str | None] = []
    try:
        for stack, expiry in moving:
            made.append(_tag_change_set(cfn, stack, _tags_with(stack, expiry), name))
        replaced = [
            r
            for (stack, _), change_set in zip(moving, made, strict=True)
            if change_set
            for r in replacements(cfn, stack.name, change_set)
        ]
    except BaseException:
        _delete_change_sets(cfn, made)
        raise
    if replaced:
        _delete_change_sets(cfn, made)
        raise TrnctlError(
            "refused: the tag change would replace "
            + "; ".join(map(str, replaced))
            + '. Nothing was changed; see docs/deploying.md, "Extending a preview"',
            ExitCode.FAILED,
        )
    return made


def _tags_with(stack: PreviewStack, expiry: datetime) -> list[dict[str, str]]:
    tags = {**stack.tags, TAG_EXPIRES_AT: format_expiry(expiry)}
    return [{"Key": key, "Value": value} for key, value in tags.items()]


def _kept_parameters(cfn: Any, stack: PreviewStack) -> list[dict[str, Any]]:
    described = cfn.describe_stacks(StackName=stack.stack_id)["Stacks"][0]
    return [
        {"ParameterKey": p["ParameterKey"], "UsePreviousValue": True}
        for p in described.get("Parameters", [])
    ]


def _tag_change_set(
    cfn: Any, stack: PreviewStack, tags: list[dict[str, str]], name: str
) -> str | None:
    """A change set of ``stack`` with ``tags`` and its template and parameters as they are, once
    CloudFormation has made it; its id, or None (and deleted) when it changes no resource.

    Raises:
        TrnctlError: CloudFormation failed the change set for another reason (FAILED).
    """
    change_set = cfn.create_change_set(
        StackName=stack.name,
        ChangeSetName=name,
        ChangeSetType="UPDATE",
        UsePreviousTemplate=True,
        Parameters=_kept_parameters(cfn, stack),
        Capabilities=CAPABILITIES,
        Tags=tags,
        Description="trnctl preview extend: the expiry tag only",
    )["Id"]
    try:
        cfn.get_waiter("change_set_create_complete").wait(
            ChangeSetName=change_set, WaiterConfig={"Delay": 5, "MaxAttempts": 120}
        )
    except WaiterError as error:
        reason = str((error.last_response or {}).get("StatusReason", error))
        cfn.delete_change_set(ChangeSetName=change_set)
        if NO_CHANGES in reason:
            return None
        raise TrnctlError(f"{stack.name}: change set failed: {reason}", ExitCode.FAILED) from None
    return str(change_set)


def replacements(cfn: Any, stack: str, change_set: str) -> list[Replacement]:
    """The resources change set ``change_set`` (of stack ``stack``) would or may replace."""
    found = []
    for page in cfn.get_paginator("describe_change_set").paginate(ChangeSetName=change_set):
        for change in page.get("Changes", []):
            resource = change.get("ResourceChange", {})
            if resource.get("Replacement") in REPLACING:
                found.append(
                    Replacement(
                        stack=stack,
                        logical_id=resource.get("LogicalResourceId", "?"),
                        resource_type=resource.get("ResourceType", "?"),
                        replacement=resource["Replacement"],
                    )
                )
    return found


def _delete_change_sets(cfn: Any, made: list[str | None]) -> None:
    for change_set in made:
        if change_set is not None:
            cfn.delete_change_set(ChangeSetName=change_set)


def _update_tags(cfn: Any, stack: PreviewStack, tags: list[dict[str, str]]) -> None:
    """The stack's own tags, where no resource takes them (its change set was empty)."""
    cfn.update_stack(
        StackName=stack.stack_id,
        UsePreviousTemplate=True,
        Parameters=_kept_parameters(cfn, stack),
        Capabilities=CAPABILITIES,
        Tags=tags,
    )
