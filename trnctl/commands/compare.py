"""`trnctl compare`: runs side by side (a verdict, time to first step, throughput, MFU, loss,
cost), as a terminal table, as JSON with --json and, with --out, an HTML report with plots."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from botocore.exceptions import BotoCoreError, ClientError
from rich.table import Table

from trn_catalog import prices
from trnctl import aws, compare, compare_report, cost, jobcost, jobs
from trnctl.commands import common
from trnctl.commands.common import RegionOption
from trnctl.compare import Run, Targets
from trnctl.errors import ExitCode, TrnctlError


def compare_command(
    runs: Annotated[
        list[str],
        typer.Argument(
            help="Metrics files, or job names (with --env: the job's metrics in the "
            "environment's checkpoints bucket). The first run is the reference.",
            show_default=False,
        ),
    ],
    env: Annotated[
        str | None, typer.Option("--env", help="Environment of the runs given as job names.")
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            help="RUN=NAME: show the run given as RUN (a file or job name) as NAME; repeatable.",
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write an HTML report with plots here.")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print every figure, the verdict and the prices as JSON instead."
        ),
    ] = False,
    price: Annotated[
        list[str] | None,
        typer.Option(
            "--price",
            help="TYPE=USD_PER_HOUR (On-Demand) or TYPE:cb=USD_PER_HOUR (Capacity Block), per "
            "instance-hour; repeatable; wins over the catalog and --live.",
        ),
    ] = None,
    live: Annotated[
        bool, typer.Option("--live", help="Ask the AWS Pricing API for On-Demand rates.")
    ] = False,
    to_tokens: Annotated[
        float | None,
        typer.Option("--to-tokens", min=1, help="Time and cost to train this many tokens."),
    ] = None,
    to_loss: Annotated[
        float | None, typer.Option("--to-loss", help="Time and cost to reach this loss.")
    ] = None,
    warmup_steps: Annotated[
        int | None,
        typer.Option(
            "--warmup-steps",
            min=0,
            help="Steady state begins after this step; default: after the first logged step.",
        ),
    ] = None,
    region: RegionOption = None,
) -> None:
    """Compare training runs: a verdict first (which reaches the target for less, and how much
    longer it takes), then time to first step, steady tokens/s and MFU, loss at matched token
    counts, and cost at On-Demand and Capacity Block rates. Metrics files need no AWS
    configuration: without a region, runs are priced by --price alone."""
    overrides = compare.parse_prices(price or [])
    outputs = common.outputs_of(env, region) if env else None
    resolved = outputs.region if outputs else region or aws.session_region()
    if live and not resolved:
        raise TrnctlError("--live needs a region: pass --region or set AWS_REGION", ExitCode.USAGE)
    parsed = compare.with_labels([_load(run, outputs) for run in runs], runs, label or [])
    types = sorted({r.header["instance_type"] for r in parsed if r.header["instance_type"]})
    live_rates = _live_rates(types, resolved) if live and resolved else {}
    rates = [
        {
            m: compare.rate_for(r.header["instance_type"], m, resolved, overrides, live_rates)
            for m in prices.MARKETS
        }
        for r in parsed
    ]
    for run_rates, block in zip(rates, _block_rates(parsed, resolved), strict=True):
        if block is not None:
            run_rates["capacity-block"] = block
    targets = Targets(warmup_steps=warmup_steps, to_tokens=to_tokens, to_loss=to_loss)
    summaries, matched = compare.summarize(parsed, rates, targets)
    comparison = compare_report.build(summaries, matched, targets, resolved, datetime.now(UTC))
    if as_json:
        typer.echo(json.dumps(compare_report.to_json(comparison), indent=2))
    else:
        _print(comparison)
    if out is not None:
        out.write_text(compare_report.html_report(comparison), encoding="utf-8")
        typer.echo(f"report: {out}", err=as_json)


def _print(comparison: compare_report.Comparison) -> None:
    """The verdict, the table and the notes on the terminal."""
    console = common.console()
    for line in comparison.verdict:
        console.print(line, highlight=False, soft_wrap=True)
    where = comparison.region or "no region: --price only"
    table = Table(title=f"{len(comparison.summaries)} runs, prices for {where}")
    table.add_column("")
    for summary in comparison.summaries:
        table.add_column(summary.run.label, overflow="fold")
    for row in compare_report.shown(comparison):
        table.add_row(row.name, *row.cells)
    console.print(table)
    for line in compare_report.notes(comparison.summaries):
        console.print(line, highlight=False)


def _load(name: str, outputs: Any) -> Run:
    """The run in the metrics file ``name``, or of the job ``name`` in ``outputs``'
    environment.

    Raises:
        TrnctlError: USAGE when ``name`` is neither a file nor (with --env) a job name;
            NOT_FOUND when the job has no metrics in the checkpoints bucket.
    """
    path = Path(name)
    if path.is_file():
        return compare.parse(path.read_text(encoding="utf-8"), name)
    if outputs is None:
        raise TrnctlError(
            f"RUN {name!r} is not a metrics file; to read a job's metrics, pass its "
            "name with --env ENV"
        )
    try:
        jobs.validate_name(name)
    except TrnctlError as error:
        raise TrnctlError(
            f"RUN {name!r} is neither a metrics file nor a job name: {error}"
        ) from None
    return compare.parse(_job_metrics(name, outputs), name)


def _job_metrics(job: str, outputs: Any) -> str:
    bucket, key = outputs.checkpoints_bucket, jobs.metrics_key(job)
    s3 = aws.client("s3", outputs.region)
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            raise TrnctlError(
                f"job {job!r} has no metrics at s3://{bucket}/{key} (FSx exports "
                f"{jobs.metrics_path(job)} there once the job has logged a step); check the "
                f"name with `trnctl job status {job} --env {outputs.environment}`",
                ExitCode.NOT_FOUND,
            ) from None
        raise
    return str(body.decode("utf-8"))


def _block_rates(runs: Sequence[Run], region: str | None) -> list[compare.Rate | None]:
    """Per run on a Capacity Block (its header's capacity and reservation), the price recorded
    on the block's reservation at purchase; None for other runs, for a block without a recorded
    price, and (with a line on stderr) where EC2 cannot be asked."""
    ids = {r.label: _reservation_ids(r) for r in runs}
    wanted = sorted({i for found in ids.values() for i in found})
    if not wanted or region is None:
        return [None] * len(runs)
    try:
        reservations = jobcost.describe_reservations(aws.client("ec2", region), wanted)
    except (BotoCoreError, ClientError) as error:
        typer.echo(
            f"trnctl: cannot read the Capacity Block reservations {', '.join(wanted)}: "
            f"{error}; their runs are priced by --price or the catalog",
            err=True,
        )
        return [None] * len(runs)
    found: list[compare.Rate | None] = []
    for run in runs:
        recorded = [reservations[i] for i in ids[run.label] if i in reservations]
        rates = [jobcost.block_rate(r) for r in recorded]
        found.append(next((r for r in rates if r is not None), None))
    return found


def _reservation_ids(run: Run) -> list[str]:
    """The reservations a run's header names when it ran on a Capacity Block (an UltraServer
    environment names each of its blocks, comma-separated)."""
    if compare.market_of(run) != "capacity-block":
        return []
    return [i for i in str(run.header.get("capacity_reservation_id") or "").split(",") if i]


def _live_rates(types: Sequence[str], region: str) -> dict[str, float | None]:
    pricing = aws.client("pricing", cost.PRICING_REGION)
    return {t: cost.live_on_demand(pricing, t, region) for t in types}
