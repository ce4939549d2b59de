"""What `trnctl compare` shows: the table's rows, the verdict, the JSON document and the HTML
page with its plots, all from one list of :class:`trnctl.compare.Summary`.

Every figure is a :class:`Row` holding the raw values (for ``--json``) and the text of each cell
(for the terminal and the page), so that the JSON and the table cannot disagree.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trn_catalog import prices
from trnctl import compare
from trnctl.compare import Goal, Outcome, Run, Summary, Targets

MARKET_NAMES: dict[prices.Market, str] = {
    "on-demand": "On-Demand",
    "capacity-block": "Capacity Block",
}
PLOT_TITLES = ("Loss vs tokens", "Tokens/s vs time", "Loss vs cost")
# What a cell shows for a figure that is not known (no price, no steady interval).
UNKNOWN = "n/a"
NOT_REACHED = "not reached"
# The page's table of losses at matched token counts shows at most this many counts.
LOSS_ROWS = 24


@dataclass(frozen=True)
class Row:
    """One figure of the comparison: its ``name`` in the table, its ``key`` in the JSON, the
    value per run (None: unknown) and the cell text per run."""

    name: str
    key: str
    section: str
    values: list[Any]
    cells: list[str]

    @property
    def known(self) -> bool:
        """Whether any run has this figure; rows without one are left out of the table."""
        return any(cell != UNKNOWN for cell in self.cells)


@dataclass(frozen=True)
class Comparison:
    """Everything one ``trnctl compare`` shows."""

    summaries: list[Summary]
    matched: list[float]
    targets: Targets
    region: str | None
    goal: Goal | None
    outcomes: list[Outcome]
    verdict: list[str]
    rows: list[Row]
    generated_at: datetime


def build(
    summaries: Sequence[Summary],
    matched: Sequence[float],
    targets: Targets,
    region: str | None,
    now: datetime,
) -> Comparison:
    """The comparison of ``summaries`` (see :func:`trnctl.compare.summarize`)."""
    goal = compare.goal_of(targets, matched)
    found = compare.outcomes(summaries, goal) if goal is not None else []
    sentences = compare.verdict(found, goal) if goal is not None else []
    if goal is None:
        sentences = ["The runs' token counts do not overlap: there is no common target."]
    return Comparison(
        summaries=list(summaries),
        matched=list(matched),
        targets=targets,
        region=region,
        goal=goal,
        outcomes=found,
        verdict=sentences,
        rows=rows(summaries, matched, targets),
        generated_at=now,
    )


def _number(value: float | None, fmt: str, unit: str = "") -> str:
    return UNKNOWN if value is None else f"{value:{fmt}}{unit}"


def money(value: float | None) -> str:
    """``$1,234.57``, or four significant digits below $100; ``n/a`` when unknown."""
    return UNKNOWN if value is None else compare.usd(value)


def _reached(seconds: float | None) -> str:
    return NOT_REACHED if seconds is None else f"{seconds:,.1f} s"


def _cost_reached(seconds: float | None, usd: float | None, rate: float | None) -> str:
    """The cost to a target: unknown without a rate, else "not reached" or the amount."""
    if rate is None:
        return UNKNOWN
    return NOT_REACHED if seconds is None else money(usd)


def date_of(run: Run) -> str | None:
    """The UTC date and time the run started (its header's ``started_at``), to the minute."""
    started = run.header.get("started_at")
    if not started:
        return None
    return f"{datetime.fromisoformat(started):%Y-%m-%d %H:%M} UTC"


def rows(summaries: Sequence[Summary], matched: Sequence[float], targets: Targets) -> list[Row]:
    """Every figure, one :class:`Row` each, in the table's order."""
    built: list[Row] = []

    def add(
        name: str,
        key: str,
        section: str,
        value: Callable[[Summary], Any],
        cell: Callable[[Summary], str],
    ) -> None:
        built.append(
            Row(name, key, section, [value(s) for s in summaries], [cell(s) for s in summaries])
        )

    header = "run"
    add("started", "started_at", header, lambda s: s.run.header.get("started_at"), _started)
    add(
        "environment",
        "environment",
        header,
        lambda s: s.run.header.get("environment"),
        lambda s: s.run.header.get("environment") or UNKNOWN,
    )
    add("target", "target", header, _target, _target)
    add("instance", "instance", header, _instance_value, _instance_cell)
    add("device, precision", "device", header, _device_value, _device_cell)
    add(
        "model",
        "model",
        header,
        lambda s: s.run.header["model"],
        lambda s: str(s.run.header["model"]),
    )
    batch = "global_batch_tokens"
    add("global batch (tokens)", batch, header, lambda s: s.run.header[batch], _batch)
    speed = "throughput"
    add(
        "time to first step",
        "time_to_first_step_s",
        speed,
        lambda s: s.first_step_s,
        lambda s: f"{s.first_step_s:,.1f} s",
    )
    add(
        "steady tokens/s",
        "steady_tokens_per_s",
        speed,
        lambda s: s.tokens_per_s,
        lambda s: _number(s.tokens_per_s, ",.1f"),
    )
    add(
        "steady examples/s",
        "steady_examples_per_s",
        speed,
        lambda s: s.examples_per_s,
        lambda s: _number(s.examples_per_s, ",.1f"),
    )
    add("MFU", "mfu", speed, lambda s: s.mfu, lambda s: _number(s.mfu, ".2%"))
    add("run time", "run_time_s", speed, lambda s: s.total_s, lambda s: f"{s.total_s:,.1f} s")
    add(
        "instance-hours",
        "instance_hours",
        speed,
        lambda s: s.instance_hours,
        lambda s: f"{s.instance_hours:,.4g}",
    )
    add(
        "tokens trained",
        "tokens_trained",
        speed,
        lambda s: s.total_tokens,
        lambda s: f"{s.total_tokens:,}",
    )
    reference = summaries[0].run.label
    at = f"loss at {matched[-1]:,.0f} tokens" if matched else "loss at matched tokens"
    add(at, "loss_at_matched_tokens", "loss", lambda s: s.loss_at_matched, _loss_cell)
    add(
        f"mean |loss - {reference}|",
        "mean_abs_loss_difference",
        "loss",
        lambda s: s.loss_difference,
        lambda s: _number(s.loss_difference, ".4f"),
    )
    built += _eval_rows(summaries)
    for market in MARKET_NAMES:
        built += _market_rows(summaries, market)
    built += _target_rows(summaries, targets)
    return built


# The eval rows: each figure of the run's last eval record (trnctl.compare.EVAL_FIGURES) by
# name in the table, and how its cell shows it.
EVAL_ROWS = (
    ("last eval at step", "eval_step", ","),
    ("eval loss", "eval_loss", ".4f"),
    ("eval accuracy", "eval_accuracy", ".2%"),
    ("eval exact match", "eval_exact_match", ".2%"),
    ("eval macro F1", "eval_macro_f1", ".4f"),
    ("eval micro F1", "eval_micro_f1", ".4f"),
    ("eval recall@10", "eval_recall@10", ".2%"),
    ("eval NDCG@10", "eval_ndcg@10", ".4f"),
    ("eval MRR", "eval_mrr", ".4f"),
)


def _eval_rows(summaries: Sequence[Summary]) -> list[Row]:
    """The task's held-out figures of each run's last eval (a classifier's accuracy and F1,
    any run's eval loss); rows no run has are not shown."""
    found = []
    for name, key, fmt in EVAL_ROWS:
        values = [s.eval_figures.get(key) for s in summaries]
        found.append(Row(name, key, "eval", values, [_number(v, fmt) for v in values]))
    return found


def _money_row(
    name: str, key: str, section: str, values: list[float | None], cells: list[str] | None = None
) -> Row:
    return Row(name, key, section, values, cells or [money(v) for v in values])


def _market_rows(summaries: Sequence[Summary], market: prices.Market) -> list[Row]:
    """The rate, the cost per 1M tokens (and of a classifier per 1M examples) and the run's
    cost at ``market``'s rate."""
    name, key = MARKET_NAMES[market], market.replace("-", "_")
    return [
        _money_row(
            f"{name} $/instance-h",
            f"{key}_usd_per_instance_hour",
            "cost",
            [s.rates[market].usd_per_hour for s in summaries],
        ),
        _money_row(
            f"{name} $ per 1M tokens",
            f"{key}_usd_per_million_tokens",
            "cost",
            [s.per_million[market] for s in summaries],
        ),
        _money_row(
            f"{name} $ per 1M examples",
            f"{key}_usd_per_million_examples",
            "cost",
            [s.per_million_examples[market] for s in summaries],
        ),
        _money_row(
            f"{name} $ for the run",
            f"{key}_usd_for_the_run",
            "cost",
            [s.whole_run[market] for s in summaries],
        ),
    ]


def _target_rows(summaries: Sequence[Summary], targets: Targets) -> list[Row]:
    """Time and cost to ``--to-tokens`` and to ``--to-loss``, where asked."""
    found = []
    if targets.to_tokens is not None:
        found += _goal_rows(
            f"{targets.to_tokens:,.0f} tokens",
            "tokens",
            [s.to_tokens_s for s in summaries],
            [s.to_tokens_cost for s in summaries],
            [s.rates for s in summaries],
        )
    if targets.to_loss is not None:
        found += _goal_rows(
            f"loss {targets.to_loss:g}",
            "loss",
            [s.to_loss_s for s in summaries],
            [s.to_loss_cost for s in summaries],
            [s.rates for s in summaries],
        )
    return found


def _goal_rows(
    goal: str,
    kind: str,
    seconds: list[float | None],
    costs: list[dict[prices.Market, float | None]],
    rates: list[dict[prices.Market, compare.Rate]],
) -> list[Row]:
    found = [
        Row(
            f"time to {goal}",
            f"time_to_{kind}_target_s",
            "target",
            list(seconds),
            [_reached(t) for t in seconds],
        )
    ]
    for market, name in MARKET_NAMES.items():
        values = [c[market] for c in costs]
        found.append(
            _money_row(
                f"{name} $ to {goal}",
                f"{market.replace('-', '_')}_usd_to_{kind}_target",
                "target",
                values,
                [
                    _cost_reached(t, v, r[market].usd_per_hour)
                    for t, v, r in zip(seconds, values, rates, strict=True)
                ],
            )
        )
    return found


def _started(s: Summary) -> str:
    return date_of(s.run) or UNKNOWN


def _target(s: Summary) -> str:
    return compare.target_of(s.run)


def _instance_value(s: Summary) -> dict[str, Any]:
    return {"nodes": s.nodes, "type": s.run.header["instance_type"]}


def _instance_cell(s: Summary) -> str:
    return f"{s.nodes} x {s.run.header['instance_type'] or 'local'}"


def _device_value(s: Summary) -> dict[str, Any]:
    return {"device": s.run.header["device"], "precision": s.run.header["precision"]}


def _device_cell(s: Summary) -> str:
    return f"{s.run.header['device']}, {s.run.header['precision']}"


def _batch(s: Summary) -> str:
    return f"{s.run.header['global_batch_tokens']:,}"


def _loss_cell(s: Summary) -> str:
    return _number(s.loss_at_matched, ".4f")


def shown(comparison: Comparison) -> list[Row]:
    """The rows the table and the page show: those with a figure for at least one run."""
    return [row for row in comparison.rows if row.known]


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


def price_lines(comparison: Comparison) -> list[str]:
    """Per run, the rate the verdict used and its source."""
    lines = []
    for o in comparison.outcomes:
        name = MARKET_NAMES[o.market]
        rate = (
            "no price"
            if o.rate.usd_per_hour is None
            else f"{money(o.rate.usd_per_hour)}/instance-h"
        )
        lines.append(f"{o.label}: {name} {rate} ({o.rate.source})")
    return lines


def to_json(comparison: Comparison) -> dict[str, Any]:
    """Every figure of the table (each row's raw values by run), the verdict and the prices."""
    runs = []
    for i, s in enumerate(comparison.summaries):
        figures = {row.key: row.values[i] for row in comparison.rows}
        runs.append(
            {
                "label": s.run.label,
                "job": s.run.header.get("job"),
                "restarts": s.run.restarts,
                "figures": figures,
                "prices": {
                    market: {"usd_per_instance_hour": r.usd_per_hour, "source": r.source}
                    for market, r in s.rates.items()
                },
            }
        )
    goal = comparison.goal
    return {
        "generated_at": comparison.generated_at.isoformat(),
        "region": comparison.region,
        "verdict": {
            "goal": None if goal is None else {"kind": goal.kind, "value": goal.value},
            "sentences": comparison.verdict,
            "runs": [
                {
                    "label": o.label,
                    "market": o.market,
                    "usd_per_instance_hour": o.rate.usd_per_hour,
                    "price_source": o.rate.source,
                    "seconds": o.seconds,
                    "usd": o.usd,
                    "reached": o.seconds is not None,
                }
                for o in comparison.outcomes
            ],
        },
        "rows": [
            {"name": row.name, "key": row.key, "cells": row.cells} for row in shown(comparison)
        ],
        "matched_tokens": comparison.matched,
        "runs": runs,
        "notes": notes(comparison.summaries),
    }


def _cost_curve(s: Summary, market: prices.Market) -> list[tuple[float, float]] | None:
    """(USD spent so far, loss) per record at ``market``'s rate; None without a price."""
    rate = s.rates[market].usd_per_hour
    if rate is None:
        return None
    per_second = rate * s.nodes / compare.SECONDS_PER_HOUR
    return [(r["time_s"] * per_second, float(r["loss"])) for r in s.run.records]


def plots(comparison: Comparison) -> list[tuple[str, str, str]]:
    """(title, caption, base64 PNG) of loss vs tokens, tokens/s vs run time and loss vs money
    spent (each run at the rate of its own market; unpriced runs are named in the caption), one
    line per run."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    summaries = comparison.summaries
    images = []
    for title, x_key, y_key, x_label, y_label in (
        (PLOT_TITLES[0], "tokens", "loss", "tokens", "loss"),
        (PLOT_TITLES[1], "time_s", "tokens_per_s", "run time (s)", "tokens/s"),
    ):
        fig, ax = plt.subplots(figsize=(7, 3.8))
        for s in summaries:
            records = s.run.records
            ax.plot([r[x_key] for r in records], [r[y_key] for r in records], label=s.run.label)
        ax.set(title=title, xlabel=x_label, ylabel=y_label)
        ax.legend()
        images.append((title, title, _png(fig, plt)))
    fig, ax = plt.subplots(figsize=(7, 3.8))
    unpriced = []
    for s in summaries:
        curve = _cost_curve(s, compare.market_of(s.run))
        if curve is None:
            unpriced.append(s.run.label)
            continue
        ax.plot(*zip(*curve, strict=True), label=s.run.label)
    goal = comparison.goal
    if goal is not None and goal.kind == "loss":
        ax.axhline(goal.value, color="grey", linestyle="--", label=goal.describe())
    ax.set(title=PLOT_TITLES[2], xlabel="USD spent (nodes x rate x time)", ylabel="loss")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    caption = PLOT_TITLES[2] + (f" (no price for {', '.join(unpriced)})" if unpriced else "")
    images.append((PLOT_TITLES[2], caption, _png(fig, plt)))
    return images


def _png(fig: Any, plt: Any) -> str:
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


_STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;color:#1d2329;margin:0 auto;
max-width:1180px;padding:24px;line-height:1.45}
h1{font-size:1.6em;margin:0 0 4px}h2{font-size:1.2em;margin:28px 0 8px;border-bottom:1px solid
#d5dbe1;padding-bottom:4px}.meta{color:#5a6570;margin:0}
#verdict{background:#eef5ee;border-left:5px solid #3a7d44;padding:12px 18px;margin-top:18px}
#verdict p.sentence{font-size:1.1em;margin:6px 0}#verdict ul{margin:6px 0;color:#3d4a55}
table{border-collapse:collapse;width:100%;font-size:.92em}
th,td{padding:4px 10px;border-bottom:1px solid #e4e8ec;text-align:right;vertical-align:top}
th:first-child,td:first-child{text-align:left}thead th{background:#f3f5f7}
tr.section td{background:#f8f9fa;font-weight:600;text-align:left;text-transform:capitalize}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(440px,1fr));gap:12px}
figure{margin:0;border:1px solid #e4e8ec;padding:6px}figure img{width:100%;height:auto}
figcaption{text-align:center;color:#5a6570;font-size:.9em}
@media print{body{max-width:none;padding:0;font-size:10pt}
.plots{grid-template-columns:1fr 1fr}section,figure,tr{break-inside:avoid}
h2{break-after:avoid}@page{margin:14mm}}
"""


def html_report(comparison: Comparison) -> str:
    """A self-contained page that reads well on screen and on paper: the verdict with the price
    sources first, the runs, three plots (inline PNG), the figures by section, the losses at
    every matched token count and the notes."""
    e = html.escape
    summaries = comparison.summaries
    labels = "".join(f"<th>{e(s.run.label)}</th>" for s in summaries)
    region = comparison.region or "no region (only --price rates)"
    head = (
        "<header><h1>Training comparison</h1>"
        f"<p class='meta'>{len(summaries)} runs, generated "
        f"{comparison.generated_at:%Y-%m-%d %H:%M} UTC, prices for {e(region)}</p></header>"
    )
    verdict = "".join(f"<p class='sentence'>{e(line)}</p>" for line in comparison.verdict)
    sources = "".join(f"<li>{e(line)}</li>" for line in price_lines(comparison))
    verdict_html = (
        f"<section id='verdict'><h2>Verdict</h2>{verdict}"
        f"<p>Prices used:</p><ul>{sources}</ul></section>"
    )
    figures = "".join(
        f'<figure><img alt="{e(title)}" src="data:image/png;base64,{png}">'
        f"<figcaption>{e(caption)}</figcaption></figure>"
        for title, caption, png in plots(comparison)
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>Training comparison: {e(', '.join(s.run.label for s in summaries))}</title>"
        f"<style>{_STYLE}</style></head><body>{head}{verdict_html}"
        f"<section id='plots'><h2>Plots</h2><div class='plots'>{figures}</div></section>"
        f"<section id='figures'><h2>Figures</h2><table id='summary'><thead><tr><th></th>"
        f"{labels}</tr></thead><tbody>{_figure_rows(comparison)}</tbody></table></section>"
        f"{_losses(comparison, labels)}{_notes(comparison)}</body></html>\n"
    )


def _figure_rows(comparison: Comparison) -> str:
    e = html.escape
    columns = len(comparison.summaries) + 1
    parts, section = [], None
    for row in shown(comparison):
        if row.section != section:
            section = row.section
            parts.append(f"<tr class='section'><td colspan='{columns}'>{e(section)}</td></tr>")
        cells = "".join(f"<td>{e(c)}</td>" for c in row.cells)
        parts.append(f"<tr><th>{e(row.name)}</th>{cells}</tr>")
    return "".join(parts)


def sampled(values: Sequence[float], most: int = LOSS_ROWS) -> list[float]:
    """At most ``most`` of ``values``, evenly spread, the first and the last among them."""
    if len(values) <= most:
        return list(values)
    step = (len(values) - 1) / (most - 1)
    return [values[round(i * step)] for i in range(most)]


def _losses(comparison: Comparison, labels: str) -> str:
    tokens = sampled(comparison.matched)
    losses = [compare.losses_at(s.run, tokens) for s in comparison.summaries]
    body = "".join(
        f"<tr><td>{count:,.0f}</td>{''.join(f'<td>{run[i]:.4f}</td>' for run in losses)}</tr>"
        for i, count in enumerate(tokens)
    )
    return (
        "<section id='loss-table'><h2>Loss at matched token counts</h2><p class='meta'>"
        f"{len(tokens)} of the {len(comparison.matched)} token counts every run reached"
        "</p><table id='losses'>"
        f"<thead><tr><th>tokens</th>{labels}</tr></thead><tbody>{body}</tbody></table>"
        "</section>"
    )


def _notes(comparison: Comparison) -> str:
    e = html.escape
    used = sorted(
        {rate.source.rsplit(": ", 1)[-1] for s in comparison.summaries for rate in s.rates.values()}
        & set(prices.PRICE_SOURCES)
    )
    sources = "".join(f"<li><b>{e(k)}</b>: {e(prices.PRICE_SOURCES[k])}</li>" for k in used)
    lines = "".join(f"<li>{e(line)}</li>" for line in notes(comparison.summaries))
    return (
        f"<section id='notes'><h2>Prices and notes</h2><ul>{lines}</ul>"
        + (f"<h3>Sources</h3><ul>{sources}</ul>" if sources else "")
        + "</section>"
    )
