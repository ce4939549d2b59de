"""`trnctl cost`: what an experiment costs at On-Demand and Capacity Block rates."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from trnctl import (
    aws,
    cost,
)
from trnctl.commands import common
from trnctl.commands.common import (
    InstanceTypeOption,
    RegionOption,
)
from trnctl.errors import ExitCode, TrnctlError


def cost_command(
    instance_type: InstanceTypeOption,
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="Instances in the job.")],
    hours: Annotated[float | None, typer.Option("--hours", help="Wall-clock hours.")] = None,
    tokens: Annotated[
        float | None, typer.Option("--tokens", help="Tokens to train on (with --tokens-per-s).")
    ] = None,
    tokens_per_s: Annotated[
        float | None, typer.Option("--tokens-per-s", help="Throughput of the whole job.")
    ] = None,
    live: Annotated[
        bool, typer.Option("--live", help="Also ask the AWS Pricing API for On-Demand.")
    ] = False,
    region: RegionOption = None,
) -> None:
    """Cost of an experiment at On-Demand and Capacity Block rates; exit 1 if nothing prices it."""
    resolved = common.region_of(region)
    duration = cost.run_hours(hours, tokens, tokens_per_s)
    lines = cost.from_table(instance_type, resolved, nodes, duration)
    if live:
        rate = cost.live_on_demand(
            aws.client("pricing", cost.PRICING_REGION), instance_type, resolved
        )
        note = "AWS Pricing API, now" if rate is not None else "the Pricing API lists no rate"
        lines.append(cost.Line("on-demand (live)", rate, nodes * duration, note))
    table = Table(title=f"{nodes} x {instance_type} in {resolved} for {duration:,.2f} h")
    for column in ("market", "$/instance-h", "instance-h", "total $", "source"):
        table.add_column(column, overflow="fold")
    for line in lines:
        rate_text = "-" if line.usd_per_hour is None else f"{line.usd_per_hour:,.2f}"
        total = line.total
        table.add_row(
            line.market,
            rate_text,
            f"{line.instance_hours:,.2f}",
            "-" if total is None else f"{total:,.2f}",
            line.note,
        )
    common.console().print(table)
    if all(line.total is None for line in lines):
        hint = "" if live else "; try --live"
        raise TrnctlError(
            f"no price for {instance_type} in {resolved} in the catalog{hint}", ExitCode.FAILED
        )
