"""`trnctl capacity find|buy`: EC2 Capacity Blocks for ML."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.table import Table

from trnctl import (
    aws,
    capacity,
)
from trnctl.commands import common
from trnctl.commands.common import (
    InstanceTypeOption,
    RegionOption,
)
from trnctl.errors import ExitCode, TrnctlError

app = typer.Typer(help="Find and buy EC2 Capacity Blocks for ML.", no_args_is_help=True)


@app.command("find")
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
    resolved = common.region_of(region)
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
            f"{o.hours}:{o.minutes:02d}" if o.minutes else str(o.hours),
            f"{o.upfront_fee:,.2f} {o.currency}",
            f"{o.per_instance_hour:,.2f} {o.currency}",
        )
    console = common.console()
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


@app.command("buy")
def capacity_buy(
    offering_id: Annotated[str, typer.Argument(help="Offering id from capacity find (cb-...).")],
    yes: Annotated[bool, typer.Option("--yes", help="Buy; without it, a dry run.")] = False,
    platform: Annotated[str, typer.Option("--platform")] = capacity.PLATFORM,
    region: RegionOption = None,
) -> None:
    """Buy a Capacity Block (charged up front, not refundable); a dry run unless --yes."""
    ec2 = aws.client("ec2", common.region_of(region))
    console = common.console()
    if not yes:
        capacity.dry_run_purchase(ec2, offering_id, platform)
        console.print(
            f"dry run: EC2 would sell {offering_id}; nothing was bought. Rerun with --yes to buy "
            "(charged up front, not refundable). After buying, deploy with: "
            "-c capacity=capacity-block -c capacity_reservation_id=<the id it prints>",
            soft_wrap=True,
        )
        return
    # A segmented offering yields one reservation per segment; a node group uses one of them.
    for reservation in capacity.purchase(ec2, offering_id, platform):
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
