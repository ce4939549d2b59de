"""Entry point of the trnctl console script: the command tree and its error handling.

Commands stay thin: they parse options, call the module that owns the work and print. Every
failure leaves through :class:`TrnctlError` or a botocore exception, which
:class:`_ErrorHandlingGroup` turns into one line on stderr and an exit code (see
:mod:`trnctl.errors`).
"""

from __future__ import annotations

import tempfile
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from typer.core import TyperGroup

from trnctl import aws, capacity, environment, preflight
from trnctl.errors import ExitCode, TrnctlError, from_aws


class _ErrorHandlingGroup(TyperGroup):
    """The root group: wraps every subcommand so no failure prints a traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except TrnctlError as error:
            _exit(str(error), error.exit_code)
        except Exception as error:
            translated = from_aws(error)
            if translated is None:
                raise
            _exit(str(translated), translated.exit_code)


def _exit(message: str, code: ExitCode) -> NoReturn:
    typer.echo(f"trnctl: {message}", err=True)
    raise typer.Exit(int(code))


app = typer.Typer(
    cls=_ErrorHandlingGroup,
    help="Operate a Trainium training platform: preflight, capacity, data, previews, cost.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Operate a Trainium training platform: preflight, capacity, data, previews, cost.

    AWS credentials, region and endpoints come from the standard AWS environment (AWS_PROFILE,
    AWS_REGION, AWS_ENDPOINT_URL, ...).
    """


def _console() -> Console:
    # Created per command so that COLUMNS and the terminal are read when the command runs.
    return Console()


def _region(region: str | None) -> str:
    resolved = region or aws.session_region()
    if not resolved:
        raise TrnctlError("no AWS region: pass --region or set AWS_REGION", ExitCode.USAGE)
    return resolved


RegionOption = Annotated[
    str | None, typer.Option("--region", help="AWS region; default: the AWS environment's.")
]
InstanceTypeOption = Annotated[
    str, typer.Option("--instance-type", help="Instance type, e.g. trn2.48xlarge.")
]


@app.command("preflight")
def preflight_command(
    az: Annotated[str, typer.Option("--az", help="Availability zone name, e.g. us-east-2a.")],
    instance_type: InstanceTypeOption,
    count: Annotated[int, typer.Option("--count", min=1, help="Instances wanted.")],
    region: RegionOption = None,
) -> None:
    """Check type offering, EFA layout, On-Demand quota and reservations; exit 1 on a failure."""
    resolved = _region(region)
    if not az.startswith(resolved):
        raise TrnctlError(
            f"--az {az!r} is not an availability zone of region {resolved!r} "
            f"(expected a name such as {resolved}a)"
        )
    request = preflight.Request(resolved, az, instance_type, count)
    checks = preflight.run(
        aws.client("ec2", resolved), aws.client("service-quotas", resolved), request
    )
    table = Table(title=f"preflight: {count} x {instance_type} in {az}")
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    styles = {preflight.Status.PASS: "green", preflight.Status.WARN: "yellow"}
    for check in checks:
        style = styles.get(check.status, "red")
        table.add_row(check.name, f"[{style}]{check.status}[/]", check.detail, check.fix)
    _console().print(table)
    if preflight.failed(checks):
        raise typer.Exit(int(ExitCode.FAILED))


capacity_app = typer.Typer(help="Find and buy EC2 Capacity Blocks for ML.", no_args_is_help=True)
app.add_typer(capacity_app, name="capacity")


@capacity_app.command("find")
def capacity_find(
    instance_type: InstanceTypeOption,
    count: Annotated[int, typer.Option("--count", help="Instances in the block (1-64).")],
    days: Annotated[int, typer.Option("--days", help="Duration: 1-14, then multiples of 7.")],
    start_after: Annotated[
        datetime | None,
        typer.Option(
            "--start-after",
            formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M"],
            help="Earliest start (UTC), e.g. 2026-12-01.",
        ),
    ] = None,
    region: RegionOption = None,
) -> None:
    """List Capacity Block offerings, cheapest per instance-hour first; exit 4 if there are none."""
    resolved = _region(region)
    offerings = capacity.find(
        aws.client("ec2", resolved),
        instance_type=instance_type,
        count=count,
        days=days,
        start_after=start_after,
    )
    if not offerings:
        raise TrnctlError(
            f"no Capacity Block offerings for {count} x {instance_type} over {days} days in "
            f"{resolved}; try other dates, fewer instances or another region",
            ExitCode.NOT_FOUND,
        )
    table = Table(title=f"Capacity Blocks: {count} x {instance_type}, {days} days, {resolved}")
    for column in ("offering", "AZ", "start (UTC)", "end (UTC)", "hours", "upfront", "per inst-h"):
        table.add_column(column, overflow="fold")
    for o in offerings:
        table.add_row(
            o.offering_id,
            o.availability_zone,
            f"{o.start:%Y-%m-%d %H:%M}",
            f"{o.end:%Y-%m-%d %H:%M}",
            str(o.hours),
            f"{o.upfront_fee:,.2f} {o.currency}",
            f"{o.per_instance_hour:,.2f} {o.currency}",
        )
    console = _console()
    console.print(table)
    best = offerings[0]
    console.print(f"cheapest: trnctl capacity buy {best.offering_id} --region {resolved} --yes")
    flags = capacity.deploy_flags(
        availability_zone=best.availability_zone,
        instance_type=best.instance_type,
        count=best.instance_count,
        reservation_id=capacity.RESERVATION_PLACEHOLDER,
    )
    console.print(f"then deploy with: {flags}", soft_wrap=True)


@capacity_app.command("buy")
def capacity_buy(
    offering_id: Annotated[str, typer.Argument(help="Offering id from capacity find (cb-...).")],
    yes: Annotated[bool, typer.Option("--yes", help="Buy; without it, a dry run.")] = False,
    platform: Annotated[str, typer.Option("--platform")] = capacity.PLATFORM,
    region: RegionOption = None,
) -> None:
    """Buy a Capacity Block (charged up front, not refundable); a dry run unless --yes."""
    ec2 = aws.client("ec2", _region(region))
    console = _console()
    if not yes:
        capacity.dry_run_purchase(ec2, offering_id, platform)
        console.print(
            f"dry run: EC2 would sell {offering_id}; nothing was bought. Rerun with --yes to buy "
            "(charged up front, not refundable). After buying, deploy with: "
            "-c capacity=capacity-block -c capacity_reservation_id=<the id it prints>",
            soft_wrap=True,
        )
        return
    reservation = capacity.purchase(ec2, offering_id, platform)
    flags = capacity.deploy_flags(
        availability_zone=reservation["AvailabilityZone"],
        instance_type=reservation["InstanceType"],
        count=int(reservation["TotalInstanceCount"]),
        reservation_id=reservation["CapacityReservationId"],
    )
    console.print(
        f"bought {offering_id}: reservation {reservation['CapacityReservationId']}, "
        f"{reservation['TotalInstanceCount']} x {reservation['InstanceType']} in "
        f"{reservation['AvailabilityZone']}, {reservation.get('StartDate')} to "
        f"{reservation.get('EndDate')} (EKS drains the nodes 40 minutes before the end)",
        soft_wrap=True,
    )
    console.print(f"deploy with: {flags}", soft_wrap=True)


data_app = typer.Typer(help="Stage training data in S3.", no_args_is_help=True)
app.add_typer(data_app, name="data")


@data_app.command("stage")
def data_stage(
    source: Annotated[Path, typer.Argument(help="A text file, or a directory of *.txt files.")],
    dest: Annotated[
        str, typer.Argument(help="s3://BUCKET/PREFIX, or with --env a prefix in its bucket.")
    ],
    env: Annotated[
        str | None, typer.Option("--env", help="Environment whose datasets bucket to use.")
    ] = None,
    shard_tokens: Annotated[
        int, typer.Option("--shard-tokens", min=1, help="Tokens per shard.")
    ] = 1 << 24,
    part_size_mib: Annotated[
        int, typer.Option("--part-size-mib", min=5, help="Multipart part size in MiB.")
    ] = 8,
    work_dir: Annotated[
        Path | None,
        typer.Option("--work-dir", help="Keep the shards here; default: a temporary directory."),
    ] = None,
    region: RegionOption = None,
) -> None:
    """Tokenize and shard text in the trainer's format and upload it; a rerun skips shards that
    are already uploaded intact."""
    # trnctl.data imports the trainer and with it torch, which only this command needs.
    from trnctl import data

    if env is not None:
        outputs = environment.lookup(env, aws.client("ssm", _region(region)))
        location = data.S3Prefix.parse(f"s3://{outputs.datasets_bucket}/{dest.lstrip('/')}")
        region = outputs.region
    else:
        location = data.S3Prefix.parse(dest)
    files = data.source_files(source)
    s3 = aws.client("s3", _region(region))
    with tempfile.TemporaryDirectory(prefix="trnctl-stage-") as scratch:
        workdir = work_dir if work_dir is not None else Path(scratch)
        manifest = data.build_shards(source, workdir, shard_tokens=shard_tokens)
        items = data.uploads(workdir, manifest, location)
        todo = data.pending(s3, items, location)
        progress_console = Console(stderr=True)
        with Progress(
            TextColumn("uploading"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=progress_console,
            # Off when stderr is not a terminal: logs get the summary line, not bar frames.
            disable=not progress_console.is_terminal,
        ) as progress:
            task = progress.add_task("upload", total=sum(item.size for item in todo))
            data.upload_all(
                s3,
                todo,
                location,
                part_mib=part_size_mib,
                on_bytes=lambda sent: progress.advance(task, sent),
            )
    tokens = sum(int(s["tokens"]) for s in manifest["shards"])
    _console().print(
        f"staged {len(manifest['shards'])} shards ({tokens:,} tokens, {len(files)} files) at "
        f"{location}: uploaded {len(todo)}, skipped {len(items) - len(todo)} "
        "already intact",
        soft_wrap=True,
    )


def main() -> None:
    app()
