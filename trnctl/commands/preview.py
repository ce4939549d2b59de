"""`trnctl preview list|extend|reap`: short-lived preview environments."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from trn_catalog.outputs import TAG_EXPIRES_AT, TAG_PREVIEW
from trnctl import (
    aws,
    previews,
)
from trnctl.commands import common
from trnctl.commands.common import (
    RegionOption,
)
from trnctl.errors import ExitCode

app = typer.Typer(
    help="Preview environments: stacks tagged trn-platform:preview and trn-platform:expires-at.",
    no_args_is_help=True,
)
ProjectOption = Annotated[
    str | None, typer.Option("--project", help="Only this project; default: every project.")
]


def _preview_table(title: str, stacks: list[previews.PreviewStack], now: datetime) -> Table:
    table = Table(title=title)
    for column in ("stack", "project", "expires-at", "state", "status"):
        table.add_column(column, overflow="fold")
    for stack in stacks:
        table.add_row(
            stack.name,
            stack.project or "-",
            stack.expires_raw or "-",
            str(stack.state(now)),
            stack.status,
        )
    return table


@app.command("list")
def preview_list(project: ProjectOption = None, region: RegionOption = None) -> None:
    """List preview stacks with their project, expiry and state."""
    now = datetime.now(UTC)
    stacks = previews.preview_stacks(aws.client("cloudformation", common.region_of(region)))
    shown = [s for s in stacks if project is None or s.project == project]
    common.console().print(
        _preview_table(f"preview stacks at {previews.format_expiry(now)}", shown, now)
    )


@app.command("extend")
def preview_extend(
    project: Annotated[str, typer.Argument(help="The preview's project name.")],
    hours: Annotated[
        int,
        typer.Option(
            "--hours",
            help="Hours to add (1-336), up to two weeks from now; an expiry set further ahead "
            "is left as it is.",
        ),
    ],
    region: RegionOption = None,
) -> None:
    """Move the expiry of a project's stacks by --hours (from now if it has passed or its tag
    is missing or malformed), up to two weeks from now; an expiry set further ahead is left as
    it is. Each stack's tag change goes through a CloudFormation change set, and if any would
    replace a resource, trnctl names it, deletes the change sets and changes nothing (exit 1)."""
    cfn = aws.client("cloudformation", common.region_of(region))
    now = datetime.now(UTC)
    changed = previews.extend(cfn, project, hours, now)
    console = common.console()
    for stack, expiry in changed:
        if expiry == stack.expires:
            note = "(unchanged: already at or past two weeks from now)"
        elif previews.capped(stack, hours, now):
            note = "(capped at two weeks from now) (stack update started)"
        else:
            note = "(stack update started)"
        console.print(
            f"{stack.name}: expires-at {previews.format_expiry(expiry)} {note}", soft_wrap=True
        )


@app.command("reap")
def preview_reap(
    project: ProjectOption = None,
    yes: Annotated[bool, typer.Option("--yes", help="Delete; without it, a dry run.")] = False,
    region: RegionOption = None,
) -> None:
    """Delete expired preview stacks (both tags, expiry passed); a dry run unless --yes.

    Stacks with one tag or a malformed expiry are reported, never deleted, and make the exit
    code 1 so that a scheduled reaper gets noticed.
    """
    now = datetime.now(UTC)
    cfn = aws.client("cloudformation", common.region_of(region))
    plan = previews.plan_reap(previews.preview_stacks(cfn), now, project)
    console = common.console()
    for stack in plan.malformed:
        console.print(
            f"left alone: {stack.name} has a malformed {TAG_EXPIRES_AT} "
            f"{stack.expires_raw!r} (expected ISO-8601 UTC, e.g. 2026-12-01T12:00:00Z)",
            soft_wrap=True,
        )
    for stack in plan.incomplete:
        missing = TAG_EXPIRES_AT if stack.project else TAG_PREVIEW
        console.print(f"left alone: {stack.name} lacks the tag {missing}", soft_wrap=True)
    if not plan.delete:
        console.print(f"nothing to reap ({len(plan.active)} preview stacks not yet expired)")
    elif not yes:
        for stack in plan.delete:
            console.print(f"would delete: {stack.name} (expired {stack.expires_raw})")
        console.print("dry run: nothing was deleted; rerun with --yes to delete")
    else:
        previews.reap(cfn, plan, on_deleted=lambda stack: console.print(f"deleted: {stack.name}"))
    if plan.malformed or plan.incomplete:
        raise typer.Exit(int(ExitCode.FAILED))
