"""`trnctl capacity find|buy`: EC2 Capacity Blocks for ML."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any

import typer
from rich.table import Table

from trn_catalog import ultraservers
from trnctl import (
    aws,
    capacity,
)
from trnctl.commands import common
from trnctl.commands.common import RegionOption
from trnctl.errors import ExitCode, TrnctlError

app = typer.Typer(help="Find and buy EC2 Capacity Blocks for ML.", no_args_is_help=True)


@app.command("find")
def capacity_find(
    days: Annotated[int, typer.Option("--days", help="Duration: 1-14, then multiples of 7.")],
    instance_type: Annotated[
        str | None, typer.Option("--instance-type", help="Instance type, e.g. trn2.48xlarge.")
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", help="Instances in the block (1-64).")
    ] = None,
    ultraserver_type: Annotated[
        str | None,
        typer.Option(
            "--ultraserver-type",
            help="UltraServer type, e.g. u-trn2x64 (instead of --instance-type).",
        ),
    ] = None,
    ultraserver_count: Annotated[
        int | None,
        typer.Option("--ultraserver-count", help="UltraServers in the offering (with the type)."),
    ] = None,
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
    """List Capacity Block offerings (instances, or UltraServers), cheapest per instance-hour
    first; exit 4 if there are none."""
    resolved = common.region_of(region)
    ec2 = aws.client("ec2", resolved)
    if ultraserver_type is not None or ultraserver_count is not None:
        kind, number = _ultraserver_options(
            instance_type, count, ultraserver_type, ultraserver_count
        )
        offerings = capacity.find_ultraservers(
            ec2,
            ultraserver_type=kind,
            count=number,
            days=days,
            start_after=start_after,
        )
        wanted = f"{ultraserver_count} x UltraServer {ultraserver_type}"
    else:
        if instance_type is None or count is None:
            raise TrnctlError(
                "capacity find needs --instance-type and --count, or --ultraserver-type and "
                "--ultraserver-count"
            )
        offerings = capacity.find(
            ec2, instance_type=instance_type, count=count, days=days, start_after=start_after
        )
        wanted = f"{count} x {instance_type}"
    if not offerings:
        raise TrnctlError(
            f"no Capacity Block offerings for {wanted} over {days} days in "
            f"{resolved}; try other dates, fewer instances or another region"
            + _unverified_name(ultraserver_type),
            ExitCode.NOT_FOUND,
        )
    _print_offerings(offerings, f"Capacity Blocks: {wanted}, {days} days, {resolved}", resolved)


def _unverified_name(ultraserver_type: str | None) -> str:
    """Why an empty answer may also mean EC2 calls the UltraServer type otherwise."""
    if ultraserver_type is None:
        return ""
    reason = ultraservers.get(ultraserver_type).unverified.get("name")
    return f" (note: {reason})" if reason else ""


def _ultraserver_options(
    instance_type: str | None,
    count: int | None,
    ultraserver_type: str | None,
    ultraserver_count: int | None,
) -> tuple[str, int]:
    """The UltraServer type and count, when the options make an UltraServer search."""
    if instance_type is not None or count is not None:
        raise TrnctlError(
            "--ultraserver-type/--ultraserver-count search UltraServer offerings; leave out "
            "--instance-type and --count (an UltraServer's instance type and count are fixed)"
        )
    if ultraserver_type is None or ultraserver_count is None:
        raise TrnctlError("--ultraserver-type and --ultraserver-count go together")
    return ultraserver_type, ultraserver_count


def _print_offerings(offerings: list[capacity.Offering], title: str, region: str) -> None:
    ultra = any(o.ultraserver_type for o in offerings)
    table = Table(title=title)
    columns = ["offering", "AZ", "start (UTC)", "end (UTC)", "hours", "upfront", "per inst-h"]
    if ultra:
        columns[1:1] = ["UltraServers", "instances"]
    for column in columns:
        table.add_column(column, overflow="fold")
    for o in offerings:
        cells = [
            o.offering_id,
            o.availability_zone,
            f"{o.start:%Y-%m-%d %H:%M}",
            f"{o.end:%Y-%m-%d %H:%M}",
            f"{o.hours}:{o.minutes:02d}" if o.minutes else str(o.hours),
            f"{o.upfront_fee:,.2f} {o.currency}",
            f"{o.per_instance_hour:,.2f} {o.currency}",
        ]
        if ultra:
            cells[1:1] = [
                f"{o.ultraserver_count} x {o.ultraserver_type}",
                f"{o.instance_count} x {o.instance_type}",
            ]
        table.add_row(*cells)
    console = common.console()
    console.print(table)
    best = offerings[0]
    fee = f" --upfront-fee {best.upfront_fee}" if best.currency == "USD" else ""
    console.print(
        f"cheapest: trnctl capacity buy {best.offering_id}{fee} --region {region} --yes",
        soft_wrap=True,
    )
    if best.ultraserver_type:
        flags = capacity.ultraserver_deploy_flags(
            region=region,
            availability_zone=best.availability_zone,
            ultraserver_type=best.ultraserver_type,
            reservation_ids=[capacity.RESERVATION_PLACEHOLDER],
        )
    else:
        flags = capacity.deploy_flags(
            region=region,
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
    upfront_fee: Annotated[
        float | None,
        typer.Option(
            "--upfront-fee",
            min=0.01,
            help="The offering's upfront fee in USD, as capacity find prints it: recorded on "
            "the reservation as USD per instance-hour, which job cost and compare read (EC2 "
            "keeps no price on a bought block).",
        ),
    ] = None,
    region: RegionOption = None,
) -> None:
    """Buy a Capacity Block or an UltraServer Capacity Block (charged up front, not
    refundable); a dry run unless --yes."""
    resolved = common.region_of(region)
    ec2 = aws.client("ec2", resolved)
    console = common.console()
    if not yes:
        capacity.dry_run_purchase(ec2, offering_id, platform)
        console.print(
            f"dry run: EC2 would sell {offering_id}; nothing was bought. Rerun with --yes to buy "
            "(charged up front, not refundable). After buying, deploy with: "
            "-c capacity=capacity-block -c capacity_reservation_id=<the id it prints> "
            "(an UltraServer block: -c ultraserver_reservation_ids=<the ids it prints>)",
            soft_wrap=True,
        )
        return
    response = capacity.purchase(ec2, offering_id, platform)
    reservations = capacity.reservations_of(response)
    if upfront_fee is not None:
        _record_rate(ec2, reservations, Decimal(str(upfront_fee)))
    for reservation in reservations:
        count = capacity.block_instance_count(reservation)
        console.print(
            f"bought {offering_id}: reservation {reservation['CapacityReservationId']}, "
            f"{'?' if count is None else count} x {reservation['InstanceType']} in "
            f"{reservation['AvailabilityZone']}, {reservation.get('StartDate')} to "
            f"{reservation.get('EndDate')} (EKS drains the nodes 40 minutes before the end)",
            soft_wrap=True,
        )
    ultraserver_type = capacity.ultraserver_type_of(response)
    if ultraserver_type is not None:
        _print_ultraserver_flags(resolved, ultraserver_type, reservations)
        return
    # A segmented offering yields one reservation per segment; a node group uses one of them.
    for reservation in reservations:
        count = capacity.block_instance_count(reservation)
        flags = capacity.deploy_flags(
            region=resolved,
            availability_zone=reservation["AvailabilityZone"],
            instance_type=reservation["InstanceType"],
            count=capacity.COUNT_PLACEHOLDER if count is None else count,
            reservation_id=reservation["CapacityReservationId"],
        )
        console.print(f"deploy with: {flags}", soft_wrap=True)


def _record_rate(ec2: Any, reservations: list[dict[str, Any]], fee: Decimal) -> None:
    """Records the block's USD per instance-hour on its reservations, or says why not."""
    console = common.console()
    rate = capacity.rate_of_purchase(reservations, fee)
    if rate is None:
        console.print(
            "EC2 gave no instance count or dates for the reservation: its price is not "
            f"recorded; tag it {capacity.RATE_TAG}=<USD per instance-hour> yourself",
            soft_wrap=True,
        )
        return
    capacity.record_rate(ec2, reservations, rate)
    console.print(
        f"recorded ${rate:,.2f} per instance-hour ({capacity.RATE_TAG}) on "
        f"{', '.join(r['CapacityReservationId'] for r in reservations)}",
        soft_wrap=True,
    )


def _print_ultraserver_flags(
    region: str, ultraserver_type: str, reservations: list[dict[str, Any]]
) -> None:
    """One node group per UltraServer reservation: the deploy flags list them all."""
    console = common.console()
    try:
        spec = ultraservers.get(ultraserver_type)
    except ultraservers.UnconfirmedUltraServerError as error:
        console.print(f"not deployable by this platform: {error}", soft_wrap=True)
        return
    whole = [r for r in reservations if capacity.block_instance_count(r) == spec.servers]
    for other in (r for r in reservations if r not in whole):
        count = capacity.block_instance_count(other)
        console.print(
            f"reservation {other['CapacityReservationId']} holds "
            f"{'an unknown number of' if count is None else count} instances, not one "
            f"{spec.name} ({spec.servers}); it is left out of the flags",
            soft_wrap=True,
        )
    if whole:
        flags = capacity.ultraserver_deploy_flags(
            region=region,
            availability_zone=whole[0]["AvailabilityZone"],
            ultraserver_type=spec.name,
            reservation_ids=[r["CapacityReservationId"] for r in whole],
        )
        console.print(f"deploy with: {flags}", soft_wrap=True)
