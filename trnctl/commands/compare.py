"""`trnctl compare`: runs side by side (time to first step, throughput, MFU, loss, cost), as a
terminal table and, with --out, an HTML report with plots."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from trn_catalog import prices
from trnctl import aws, compare, cost, jobs
from trnctl.commands import common
from trnctl.commands.common import RegionOption
from trnctl.compare import Run, Summary, Targets
from trnctl.errors import ExitCode, TrnctlError

MARKET_NAMES: dict[prices.Market, str] = {
    "on-demand": "On-Demand",
    "capacity-block": "Capacity Block",
}
PLOT_TITLES = ("Loss vs tokens", "Tokens/s vs time")


def compare_command(
    runs: Annotated[
        list[str],
        typer.Argument(
            help="Metrics files, or job names (with --env: the job's metrics in the "
            "environment's checkpoints bucket). The first run is the loss reference.",
            show_default=False,
        ),
    ],
    env: Annotated[
        str | None, typer.Option("--env", help="Environment of the runs given as job names.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write an HTML report with plots here.")
    ] = None,
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
    """Compare training runs: time to first step, steady tokens/s and MFU, loss at matched
    token counts, and cost at On-Demand and Capacity Block rates."""
    overrides = compare.parse_prices(price or [])
    outputs = common.outputs_of(env, region) if env else None
    resolved = outputs.region if outputs else common.region_of(region)
    parsed = [_load(run, outputs) for run in runs]
    types = sorted({r.header["instance_type"] for r in parsed if r.header["instance_type"]})
    live_rates = _live_rates(types, resolved) if live else {}
    rates = [
        {
            m: compare.rate_for(r.header["instance_type"], m, resolved, overrides, live_rates)
            for m in prices.MARKETS
        }
        for r in parsed
    ]
    targets = Targets(warmup_steps=warmup_steps, to_tokens=to_tokens, to_loss=to_loss)
    summaries, matched = compare.summarize(parsed, rates, targets)
    rows = table_rows(summaries, matched, targets)
    table = Table(title=f"{len(parsed)} runs, prices for {resolved}")
    table.add_column("")
    for summary in summaries:
        table.add_column(summary.run.label, overflow="fold")
    for name, cells in rows:
        table.add_row(name, *cells)
    common.console().print(table)
    for line in notes(summaries):
        common.console().print(line, highlight=False)
    if out is not None:
        out.write_text(html_report(summaries, rows, matched), encoding="utf-8")
        common.console().print(f"report: {out}", highlight=False)


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


def _live_rates(types: Sequence[str], region: str) -> dict[str, float | None]:
    pricing = aws.client("pricing", cost.PRICING_REGION)
    return {t: cost.live_on_demand(pricing, t, region) for t in types}


def _number(value: float | None, fmt: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def money(value: float | None) -> str:
    """``$1,234.57``, or four significant digits below $100 (runs of seconds cost cents)."""
    if value is None:
        return "-"
    return f"${value:,.2f}" if value >= 100 else f"${value:.4g}"


def _reached(seconds: float | None) -> str:
    return "not reached" if seconds is None else f"{seconds:,.1f} s"


def _cost_reached(seconds: float | None, usd: float | None) -> str:
    return "not reached" if seconds is None else money(usd)


def table_rows(
    summaries: Sequence[Summary], matched: Sequence[float], targets: Targets
) -> list[tuple[str, list[str]]]:
    """The table, one row per figure, one cell per run."""

    def row(name: str, cell: Callable[[Summary], str]) -> tuple[str, list[str]]:
        return name, [cell(s) for s in summaries]

    reference = summaries[0].run.label
    at = f"loss at {matched[-1]:,.0f} tokens" if matched else "loss at matched tokens"
    rows = [
        row("target", lambda s: compare.target_of(s.run)),
        row("instance", lambda s: f"{s.run.header['nodes']} x {_instance(s.run)}"),
        row(
            "device, precision", lambda s: f"{s.run.header['device']}, {s.run.header['precision']}"
        ),
        row("model", lambda s: str(s.run.header["model"])),
        row("global batch (tokens)", lambda s: f"{s.run.header['global_batch_tokens']:,}"),
        row("time to first step", lambda s: f"{s.first_step_s:,.1f} s"),
        row("steady tokens/s", lambda s: _number(s.tokens_per_s, ",.1f")),
        row("MFU", lambda s: _number(s.mfu, ".2%")),
        row("run time", lambda s: f"{s.total_s:,.1f} s"),
        row("tokens trained", lambda s: f"{s.total_tokens:,}"),
        row(at, lambda s: _number(s.loss_at_matched, ".4f")),
        row(f"mean |loss - {reference}|", lambda s: _number(s.loss_difference, ".4f")),
    ]
    for market, name in MARKET_NAMES.items():
        rows += [
            (f"{name} $/instance-h", [money(s.rates[market].usd_per_hour) for s in summaries]),
            (f"{name} $ per 1M tokens", [money(s.per_million[market]) for s in summaries]),
            (f"{name} $ for the run", [money(s.whole_run[market]) for s in summaries]),
        ]
    if targets.to_tokens is not None:
        goal = f"{targets.to_tokens:,.0f} tokens"
        rows.append(row(f"time to {goal}", lambda s: _reached(s.to_tokens_s)))
        rows += [
            (
                f"{name} $ to {goal}",
                [_cost_reached(s.to_tokens_s, s.to_tokens_cost[market]) for s in summaries],
            )
            for market, name in MARKET_NAMES.items()
        ]
    if targets.to_loss is not None:
        goal = f"loss {targets.to_loss:g}"
        rows.append(row(f"time to {goal}", lambda s: _reached(s.to_loss_s)))
        rows += [
            (
                f"{name} $ to {goal}",
                [_cost_reached(s.to_loss_s, s.to_loss_cost[market]) for s in summaries],
            )
            for market, name in MARKET_NAMES.items()
        ]
    return rows


def _instance(run: Run) -> str:
    return str(run.header["instance_type"] or "local")


def notes(summaries: Sequence[Summary]) -> list[str]:
    """Where each rate comes from (or what to pass), and runs without a steady state."""
    lines = []
    for s in summaries:
        for market, name in MARKET_NAMES.items():
            lines.append(f"{s.run.label}: {name}: {s.rates[market].source}")
        if s.tokens_per_s is None:
            lines.append(f"{s.run.label}: no logged interval after warm-up; lower --warmup-steps")
        if s.run.restarts:
            lines.append(f"{s.run.label}: resumed {s.run.restarts} time(s); run time adds up")
    return lines


def plots(summaries: Sequence[Summary]) -> list[tuple[str, str]]:
    """(title, base64 PNG) of loss vs tokens and tokens/s vs run time, one line per run."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    images = []
    for title, x_key, y_key, x_label, y_label in (
        (PLOT_TITLES[0], "tokens", "loss", "tokens", "loss"),
        (PLOT_TITLES[1], "time_s", "tokens_per_s", "run time (s)", "tokens/s"),
    ):
        fig, ax = plt.subplots(figsize=(8, 4))
        for s in summaries:
            records = s.run.records
            ax.plot([r[x_key] for r in records], [r[y_key] for r in records], label=s.run.label)
        ax.set(title=title, xlabel=x_label, ylabel=y_label)
        ax.legend()
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        plt.close(fig)
        images.append((title, base64.b64encode(buffer.getvalue()).decode("ascii")))
    return images


def html_report(
    summaries: Sequence[Summary], rows: Sequence[tuple[str, list[str]]], matched: Sequence[float]
) -> str:
    """A self-contained page: both plots (inline PNG), the table, the losses at every matched
    token count and the sources of the prices."""
    e = html.escape
    head = "".join(f"<th>{e(s.run.label)}</th>" for s in summaries)
    body = "".join(
        f"<tr><th>{e(name)}</th>{''.join(f'<td>{e(c)}</td>' for c in cells)}</tr>"
        for name, cells in rows
    )
    figures = "".join(
        f'<figure><img alt="{e(title)}" src="data:image/png;base64,{png}">'
        f"<figcaption>{e(title)}</figcaption></figure>"
        for title, png in plots(summaries)
    )
    losses = [compare.losses_at(s.run, matched) for s in summaries]
    loss_rows = "".join(
        f"<tr><td>{tokens:,.0f}</td>{''.join(f'<td>{run[i]:.4f}</td>' for run in losses)}</tr>"
        for i, tokens in enumerate(matched)
    )
    used = sorted(
        {rate.source.rsplit(": ", 1)[-1] for s in summaries for rate in s.rates.values()}
        & set(prices.PRICE_SOURCES)
    )
    sources = "".join(f"<li><b>{e(k)}</b>: {e(prices.PRICE_SOURCES[k])}</li>" for k in used)
    notes_html = "".join(f"<li>{e(line)}</li>" for line in notes(summaries))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>trnctl compare</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}"
        "</style></head><body><h1>trnctl compare</h1>"
        f"{figures}<h2>Runs</h2><table id='summary'><tr><th></th>{head}</tr>{body}</table>"
        f"<h2>Loss at matched token counts</h2><table id='losses'><tr><th>tokens</th>{head}</tr>"
        f"{loss_rows}</table><h2>Prices</h2><ul>{notes_html}</ul><h3>Sources</h3>"
        f"<ul>{sources}</ul></body></html>\n"
    )
