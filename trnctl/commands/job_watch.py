"""`trnctl job top|cost`: what a job does now (CloudWatch) and what it cost (its pods' hours on
each node at that node's rate)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from trnctl import aws, compare, cost, jobcost, jobs, kube, top
from trnctl.commands import common
from trnctl.commands.common import EnvOption, RegionOption
from trnctl.compare_report import money
from trnctl.errors import ExitCode, TrnctlError

NameArgument = Annotated[str, typer.Argument(help="TrainJob name.")]


def _job_nodes(
    cluster: kube.Cluster, name: str
) -> tuple[dict[str, Any], list[Any], dict[str, str | None]]:
    """The TrainJob, its node pods and each of their nodes' EC2 instance id."""
    job = cluster.get(name)
    pods = cluster.pods(name)
    names = sorted({p.spec.node_name for p in pods if p.spec and p.spec.node_name})
    return (
        job,
        pods,
        {n: jobcost.instance_id(pid) for n, pid in cluster.provider_ids(names).items()},
    )


def job_top(
    name: NameArgument,
    env: EnvOption,
    once: Annotated[bool, typer.Option("--once", help="Print one table and exit.")] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=1, help="Seconds between refreshes.")
    ] = 15,
    region: RegionOption = None,
) -> None:
    """Show a job's nodes (NeuronCore utilization, device memory, EFA traffic) and the job
    (tokens/s, MFU, loss, step, time left to --max-steps), from CloudWatch; refreshes like top
    until Ctrl-C, or prints once with --once."""
    jobs.validate_name(name)
    outputs = common.outputs_of(env, region)
    cluster = common.cluster_of(outputs)
    cloudwatch = aws.client("cloudwatch", outputs.region)

    def render() -> Group:
        job, _, nodes = _job_nodes(cluster, name)
        refs = [top.NodeRef(n, i) for n, i in nodes.items()]
        now = datetime.now(UTC)
        values = top.latest(
            cloudwatch, top.queries(outputs.cluster_name, outputs.environment, name, refs), now
        )
        return Group(*top_tables(name, job, refs, values, now, outputs.devices))

    if once:
        common.console().print(render())
        return
    try:
        with Live(render(), console=common.console(), auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(render(), refresh=True)
    except KeyboardInterrupt:
        return


# Container Insights' EFA metrics need the EFA device plugin; DRA trn nodes use aws-dranet.
DRA_CAPTION = "EFA: none from DRA trn nodes (Container Insights reads device-plugin EFA only)"


def _figure(value: float | None, fmt: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def _bytes(value: float | None, per_second: bool = False) -> str:
    if value is None:
        return "-"
    suffix = "/s" if per_second else ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:,.1f} {unit}{suffix}"
        value /= 1024
    raise AssertionError("unreachable")


def top_tables(
    name: str,
    job: dict[str, Any],
    nodes: list[top.NodeRef],
    values: dict[str, float],
    now: datetime,
    devices: str = "plugin",
) -> list[Table]:
    """The job's table (its figures and the time left) and the nodes' table; in an environment
    whose trn nodes get their devices by DRA (``devices``), a caption under the nodes says why
    their EFA columns stay empty (:data:`trn_catalog.observability.DEVICE_PLUGIN_ONLY`)."""
    step = values.get("job_step")
    total = top.max_steps(job)
    left = top.seconds_left(step, values.get("job_step_time"), total)
    summary = Table(title=f"TrainJob {name} at {now:%Y-%m-%d %H:%M:%S} UTC")
    for column in ("step", "tokens/s", "MFU", "loss", "step time", "left to --max-steps"):
        summary.add_column(column, overflow="fold")
    steps = "-" if step is None else f"{step:,.0f}" + (f" / {total:,}" if total else "")
    summary.add_row(
        steps,
        _figure(values.get("job_tokens_per_s"), ",.0f"),
        _figure(values.get("job_mfu"), ".1f", "%"),
        _figure(values.get("job_loss"), ".4f"),
        _figure(values.get("job_step_time"), ".2f", " s"),
        "-" if left is None else compare.duration(left),
    )
    table = Table(title=f"nodes of {name}", caption=DRA_CAPTION if devices == "dra" else None)
    for column in ("node", "instance", "NeuronCore util", "device memory", "EFA rx", "EFA tx"):
        table.add_column(column, overflow="fold")
    for i, node in enumerate(nodes):
        table.add_row(
            node.name,
            node.instance_id or "-",
            _figure(values.get(f"n{i}_utilization"), ".1f", "%"),
            _bytes(values.get(f"n{i}_device_memory")),
            _bytes(values.get(f"n{i}_efa_rx"), per_second=True),
            _bytes(values.get(f"n{i}_efa_tx"), per_second=True),
        )
    return [summary, table]


def job_cost(
    name: NameArgument,
    env: EnvOption,
    price: Annotated[
        list[str] | None,
        typer.Option(
            "--price",
            help="TYPE=USD_PER_HOUR (On-Demand) or TYPE:cb=USD_PER_HOUR (Capacity Block), per "
            "instance-hour; wins over the catalog and --live, not over a block's recorded price.",
        ),
    ] = None,
    live: Annotated[
        bool, typer.Option("--live", help="Ask the AWS Pricing API for On-Demand rates.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print every figure as JSON.")] = False,
    region: RegionOption = None,
) -> None:
    """What a job cost: each node's hours for the job (its pods' start to end, now while they
    run) times the node's rate (On-Demand; an On-Demand Capacity Reservation at the On-Demand
    rate; a Capacity Block at the price recorded on its reservation), the reservations' idle
    share over the job's window apart, and the totals. Exit 1 when a node has no price."""
    jobs.validate_name(name)
    overrides = compare.parse_prices(price or [])
    outputs = common.outputs_of(env, region)
    cluster = common.cluster_of(outputs)
    _, pods, nodes = _job_nodes(cluster, name)
    now = datetime.now(UTC)
    job_spans = jobcost.spans(pods, now)
    if not job_spans:
        raise TrnctlError(
            f"TrainJob {name!r} has no pod that started on a node yet: nothing to cost; see "
            f"trnctl job status {name} --env {env}",
            ExitCode.NOT_FOUND,
        )
    ec2 = aws.client("ec2", outputs.region)
    ids = sorted({i for i in nodes.values() if i})
    instances = jobcost.describe_instances(ec2, ids) if ids else {}
    reservation_ids = sorted({i.reservation_id for i in instances.values() if i.reservation_id})
    reservations = jobcost.describe_reservations(ec2, reservation_ids)
    types = sorted({i.instance_type for i in instances.values()})
    live_rates = _live_rates(types, outputs.region) if live else {}

    def rate_of(instance: jobcost.Instance) -> compare.Rate:
        return jobcost.node_rate(instance, reservations, outputs.region, overrides, live_rates)

    costs = jobcost.node_costs(job_spans, instances, nodes, rate_of)
    job_window = jobcost.window(job_spans)
    result = jobcost.JobCost(
        job=name,
        nodes=costs,
        idle=jobcost.idle_shares(costs, reservations, job_window),
        window=job_window,
        running=any(s.running for s in job_spans),
    )
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        _print_cost(result)
    if result.unpriced:
        raise typer.Exit(int(ExitCode.FAILED))


def _live_rates(types: list[str], region: str) -> dict[str, float | None]:
    pricing = aws.client("pricing", cost.PRICING_REGION)
    return {t: cost.live_on_demand(pricing, t, region) for t in types}


def _print_cost(result: jobcost.JobCost) -> None:
    console = common.console()
    state = "running: costs so far" if result.running else "ended"
    title = f"TrainJob {result.job} ({state})"
    if result.window is not None:
        start, end = result.window
        title += f", {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"
    table = Table(title=title)
    for column in ("node", "instance", "capacity", "reservation", "hours", "$/h", "$", "price"):
        table.add_column(column, overflow="fold")
    for n in result.nodes:
        instance = n.instance
        table.add_row(
            n.node,
            instance.instance_type if instance else "-",
            instance.capacity if instance else "-",
            (instance.reservation_id if instance else None) or "-",
            f"{n.hours:,.3f}",
            money(n.rate.usd_per_hour),
            money(n.usd),
            n.rate.source,
        )
    console.print(table)
    for share in result.idle:
        r = share.reservation
        console.print(
            f"idle share of {r.reservation_id} ({r.instances} x {r.instance_type}): "
            f"{share.idle_hours:,.3f} of {share.reserved_hours:,.3f} reserved instance-hours "
            f"over the job's window, {money(share.usd)}",
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        f"job: {money(result.usd)} for {result.node_hours:,.3f} node-hours"
        + (
            f"; with the reservations' idle share: {money(result.usd + result.idle_usd)}"
            if result.idle
            else ""
        ),
        highlight=False,
        soft_wrap=True,
    )
    for n in result.unpriced:
        console.print(f"{n.node}: no price ({n.rate.source})", highlight=False, soft_wrap=True)
