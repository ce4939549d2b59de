"""`trnctl compare`: time, throughput, loss and cost of training runs side by side.

Pure functions over parsed metrics files (the trainer's JSON lines: a ``"kind": "run"`` header,
then ``train`` records with ``step``, ``loss``, ``tokens``, ``tokens_per_s`` and ``elapsed_s``,
of a classification or recommendation run also ``examples_per_s``, and ``eval`` records, whose
last one gives a run's held-out figures: :data:`EVAL_FIGURES`). The command in
:mod:`trnctl.commands.compare` reads the files, resolves prices and prints.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import trn_catalog
from trn_catalog import prices
from trnctl.errors import ExitCode, TrnctlError

SECONDS_PER_HOUR = 3600
MILLION = 1_000_000
# The header's fields that compare relies on (the trainer writes more).
HEADER_FIELDS = (
    "instance_type",
    "nodes",
    "world_size",
    "device",
    "precision",
    "model",
    "global_batch_tokens",
    "flops_per_token",
    "peak_flops_per_rank",
    "started_at",
)
# --price TYPE:cb=USD sets a Capacity Block rate; TYPE=USD an On-Demand one.
CB_SUFFIX = ":cb"
# The held-out figures of an eval record that compare shows, as the trainer names them: the loss
# (any task), a classifier's accuracy (multi-label: exact match) and F1 (trainer.classify), a
# two-tower model's recall@10, NDCG@10 and MRR (trainer.recommend).
EVAL_FIGURES = (
    "eval_loss",
    "eval_accuracy",
    "eval_exact_match",
    "eval_macro_f1",
    "eval_micro_f1",
    "eval_recall@10",
    "eval_ndcg@10",
    "eval_mrr",
)


@dataclass(frozen=True)
class Run:
    """One run's metrics: its first header and its train records, oldest step first, each with
    ``time_s``, seconds of run time when it was written (restarts add up; see :func:`parse`),
    and its eval records, oldest step first (default none)."""

    label: str
    header: dict[str, Any]
    records: list[dict[str, Any]]
    restarts: int
    evals: list[dict[str, Any]] = field(default_factory=list)


def parse(text: str, label: str) -> Run:
    """The run in a metrics file's ``text``. Each start of a run writes a header and times its
    records from that start (``elapsed_s``); a resumed run's records continue from the previous
    start's last record, so the time between the two starts (queueing, a new node) is not
    counted. When steps repeat, the later record wins, as in ``trainer.metrics.read``.

    Raises:
        TrnctlError: USAGE when a line is not JSON, the file has no run header (a trainer older
            than the header, or not a metrics file) or no train record, or a field is missing.
    """
    header: dict[str, Any] | None = None
    by_step: dict[int, dict[str, Any]] = {}
    evals: dict[int, dict[str, Any]] = {}
    offset = last_time = 0.0
    starts = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise TrnctlError(f"{label}:{number}: not a JSON line ({error.msg})") from None
        kind = record.get("kind", "train")
        if kind == "run":
            starts += 1
            header = header or record
            offset = last_time
        elif kind == "train":
            if header is None:
                raise TrnctlError(_no_header(label))
            last_time = offset + _field(record, "elapsed_s", label, number)
            by_step[_field(record, "step", label, number)] = {**record, "time_s": last_time}
        elif kind == "eval" and isinstance(record.get("step"), int):
            evals[record["step"]] = record
    if header is None:
        raise TrnctlError(_no_header(label))
    missing = [name for name in HEADER_FIELDS if name not in header]
    if missing:
        raise TrnctlError(f"{label}: the run header lacks {', '.join(missing)}")
    if not by_step:
        raise TrnctlError(f"{label}: no train records yet (the run has not logged a step)")
    records = [by_step[step] for step in sorted(by_step)]
    for record in records:
        for name in ("loss", "tokens", "tokens_per_s"):
            _field(record, name, label, None)
    return Run(label, header, records, starts - 1, [evals[step] for step in sorted(evals)])


def _no_header(label: str) -> str:
    return (
        f'{label}: no run header (a first line with "kind": "run"); it was written by a '
        "trainer older than the header, or is not a trainer's metrics file"
    )


def _field(record: dict[str, Any], name: str, label: str, line: int | None) -> Any:
    if name not in record:
        where = f"{label}:{line}" if line is not None else f"{label} step {record.get('step')}"
        raise TrnctlError(f"{where}: a train record without {name!r}")
    return record[name]


def time_to_first_step(run: Run) -> float:
    """Seconds from the run's start to its first logged step: set-up, compilation and warm-up
    (and the other steps of that logging interval when ``--log-every`` is above 1)."""
    return float(run.records[0]["time_s"])


def steady_records(run: Run, warmup_steps: int | None) -> list[dict[str, Any]]:
    """The records whose logging interval begins after step ``warmup_steps`` (an interval
    begins at the previous record's step, the first at 0); None: every record but the first,
    whose interval holds the compilation."""
    after = run.records[0]["step"] if warmup_steps is None else warmup_steps
    previous = [0] + [r["step"] for r in run.records[:-1]]
    return [r for r, begins in zip(run.records, previous, strict=True) if begins >= after]


def steady_tokens_per_s(run: Run, warmup_steps: int | None) -> float | None:
    """Median tokens/s (whole job) of :func:`steady_records`; None when there is none."""
    return steady_median(run, warmup_steps, "tokens_per_s")


def steady_median(run: Run, warmup_steps: int | None, name: str) -> float | None:
    """Median of the figure ``name`` (``tokens_per_s``, a classifier's ``examples_per_s``) over
    :func:`steady_records`; None when there is none or a record lacks it."""
    steady = steady_records(run, warmup_steps)
    if not steady or any(name not in r for r in steady):
        return None
    return float(statistics.median(r[name] for r in steady))


def last_eval(run: Run) -> dict[str, Any]:
    """The run's newest eval record's :data:`EVAL_FIGURES` that are numbers, and its ``step``
    as ``eval_step``; empty for a run without an eval record."""
    if not run.evals:
        return {}
    record = run.evals[-1]
    figures = {
        name: float(record[name])
        for name in EVAL_FIGURES
        if isinstance(record.get(name), int | float) and not isinstance(record[name], bool)
    }
    return {"eval_step": record["step"], **figures}


def mfu(run: Run, tokens_per_s: float | None) -> float | None:
    """Model FLOPs utilisation at ``tokens_per_s``, from the header's FLOPs per token and peak
    per rank, as the trainer computes it; None when either of those (a script's metrics may
    leave out the FLOPs per token) or the throughput is unknown."""
    peak, flops = run.header["peak_flops_per_rank"], run.header["flops_per_token"]
    if not peak or not flops or tokens_per_s is None:
        return None
    per_rank = tokens_per_s / run.header["world_size"]
    return float(per_rank * flops / peak)


def target_of(run: Run) -> str:
    """Where a run ran: ``trn`` or ``gpu`` (its instance type in the Trainium or the GPU
    catalog), ``local`` without an instance type, else the type's name."""
    instance = run.header["instance_type"]
    if instance is None:
        return "local"
    if instance in trn_catalog.GPU_CATALOG:
        return "gpu"
    return "trn" if instance in trn_catalog.CATALOG else str(instance)


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Linear interpolation of ``points`` (sorted by x) at ``x``, inside their range."""
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if points and x == points[-1][0]:
        return points[-1][1]
    raise ValueError(f"{x} is outside {points[0][0]}..{points[-1][0]}")


def loss_curve(run: Run) -> list[tuple[float, float]]:
    """(tokens trained, mean loss of the interval) per record."""
    return [(float(r["tokens"]), float(r["loss"])) for r in run.records]


def matched_tokens(runs: Sequence[Run]) -> list[float]:
    """The first run's token counts that every run's loss curve covers: where the runs' losses
    are compared."""
    curves = [loss_curve(run) for run in runs]
    low = max(curve[0][0] for curve in curves)
    high = min(curve[-1][0] for curve in curves)
    return [tokens for tokens, _ in curves[0] if low <= tokens <= high]


def losses_at(run: Run, tokens: Sequence[float]) -> list[float]:
    curve = loss_curve(run)
    return [interpolate(curve, t) for t in tokens]


def mean_abs_loss_difference(run: Run, reference: Run, tokens: Sequence[float]) -> float | None:
    """Mean of ``|loss(run) - loss(reference)|`` at ``tokens``; None when there is none."""
    if not tokens:
        return None
    pairs = zip(losses_at(run, tokens), losses_at(reference, tokens), strict=True)
    return statistics.fmean(abs(a - b) for a, b in pairs)


def first_reaching(
    run: Run, *, tokens: float | None = None, loss: float | None = None
) -> float | None:
    """Run time (s) at the first record with at least ``tokens`` trained, or with a loss at or
    below ``loss``; None when no record does ("not reached")."""
    for record in run.records:
        if (tokens is not None and record["tokens"] >= tokens) or (
            loss is not None and record["loss"] <= loss
        ):
            return float(record["time_s"])
    return None


@dataclass(frozen=True)
class Rate:
    """USD per instance-hour for one market, or None with the reason in ``source``."""

    usd_per_hour: float | None
    source: str


def parse_prices(values: Sequence[str]) -> dict[tuple[str, prices.Market], float]:
    """``--price`` values: ``TYPE=USD_PER_HOUR`` (On-Demand) or ``TYPE:cb=USD_PER_HOUR``
    (Capacity Block), per instance-hour.

    Raises:
        TrnctlError: USAGE, naming the flag and the value, for another form, a missing type or
            a rate that is not a number above 0.
    """
    parsed: dict[tuple[str, prices.Market], float] = {}
    for value in values:
        key, sep, amount = value.partition("=")
        market: prices.Market = "on-demand"
        if key.endswith(CB_SUFFIX):
            key, market = key.removesuffix(CB_SUFFIX), "capacity-block"
        try:
            rate = float(amount.strip().removeprefix("$"))
        except ValueError:
            rate = math.nan
        if not sep or not key.strip() or ":" in key or not (0 < rate < math.inf):
            raise TrnctlError(
                f"--price {value!r}: expected TYPE=USD_PER_HOUR (On-Demand) or "
                "TYPE:cb=USD_PER_HOUR (Capacity Block) with a rate above 0, "
                "e.g. --price p5.48xlarge=55.04",
                ExitCode.USAGE,
            )
        parsed[(key.strip(), market)] = rate
    return parsed


def rate_for(
    instance_type: str | None,
    market: prices.Market,
    region: str | None,
    overrides: Mapping[tuple[str, prices.Market], float],
    live: Mapping[str, float | None],
) -> Rate:
    """The rate a run is costed at: ``--price``, else (On-Demand) the Pricing API's with
    ``--live``, else the catalog's for ``region`` (None: no region configured, so nothing but
    ``--price`` prices it); a Rate without a price says what to pass."""
    if instance_type is None:
        return Rate(None, "no instance type in the run header (a local run)")
    flag = f"--price {instance_type}{CB_SUFFIX if market == 'capacity-block' else ''}=USD"
    if (instance_type, market) in overrides:
        return Rate(overrides[(instance_type, market)], f"{flag.removesuffix('=USD')} (given)")
    if region is None:
        return Rate(None, f"no AWS region to look up {instance_type} in: pass --region or {flag}")
    if market == "on-demand" and live.get(instance_type) is not None:
        return Rate(live[instance_type], f"AWS Pricing API, {region}, now")
    price = prices.lookup(instance_type, region, market)
    if price is None:
        return Rate(None, f"no price for {instance_type} in {region}: pass {flag}")
    status = "verified" if price.verified else "unverified"
    return Rate(price.usd_per_hour, f"{region}, as of {price.as_of}, {status}: {price.source}")


def cost_per_million(rate: Rate, nodes: int, per_s: float | None) -> float | None:
    """USD per 1M tokens (or examples) at ``per_s`` of them (the whole job's) on ``nodes``
    instances."""
    if rate.usd_per_hour is None or not per_s:
        return None
    return rate.usd_per_hour * nodes / SECONDS_PER_HOUR / per_s * MILLION


def cost_of(rate: Rate, nodes: int, seconds: float | None) -> float | None:
    """USD for ``nodes`` instances over ``seconds``."""
    if rate.usd_per_hour is None or seconds is None:
        return None
    return rate.usd_per_hour * nodes * seconds / SECONDS_PER_HOUR


@dataclass(frozen=True)
class Summary:
    """What the table shows for one run; None where a figure is unknown or not reached."""

    run: Run
    first_step_s: float
    tokens_per_s: float | None
    examples_per_s: float | None
    eval_figures: dict[str, Any]
    mfu: float | None
    total_s: float
    total_tokens: int
    nodes: int
    instance_hours: float
    loss_at_matched: float | None
    loss_difference: float | None
    rates: dict[prices.Market, Rate]
    per_million: dict[prices.Market, float | None]
    per_million_examples: dict[prices.Market, float | None]
    whole_run: dict[prices.Market, float | None]
    to_tokens_s: float | None
    to_loss_s: float | None
    to_tokens_cost: dict[prices.Market, float | None]
    to_loss_cost: dict[prices.Market, float | None]


@dataclass(frozen=True)
class Targets:
    """What to compare the runs at: ``warmup_steps`` (None: the first logged interval),
    ``to_tokens`` and ``to_loss`` (None: not asked)."""

    warmup_steps: int | None = None
    to_tokens: float | None = None
    to_loss: float | None = None


def summarize(
    runs: Sequence[Run], rates: Sequence[dict[prices.Market, Rate]], targets: Targets
) -> tuple[list[Summary], list[float]]:
    """A :class:`Summary` per run (``rates[i]`` for ``runs[i]``) and the matched token counts;
    losses and their differences are taken at the last and at all of them, against the first
    run."""
    matched = matched_tokens(runs)
    summaries = []
    for run, run_rates in zip(runs, rates, strict=True):
        nodes = run.header["nodes"]
        tps = steady_tokens_per_s(run, targets.warmup_steps)
        eps = steady_median(run, targets.warmup_steps, "examples_per_s")
        total_s = float(run.records[-1]["time_s"])
        to_tokens = (
            None if targets.to_tokens is None else first_reaching(run, tokens=targets.to_tokens)
        )
        to_loss = None if targets.to_loss is None else first_reaching(run, loss=targets.to_loss)
        summaries.append(
            Summary(
                run=run,
                first_step_s=time_to_first_step(run),
                tokens_per_s=tps,
                examples_per_s=eps,
                eval_figures=last_eval(run),
                mfu=mfu(run, tps),
                total_s=total_s,
                total_tokens=int(run.records[-1]["tokens"]),
                nodes=nodes,
                instance_hours=nodes * total_s / SECONDS_PER_HOUR,
                loss_at_matched=losses_at(run, matched[-1:])[0] if matched else None,
                loss_difference=mean_abs_loss_difference(run, runs[0], matched),
                rates=run_rates,
                per_million={m: cost_per_million(r, nodes, tps) for m, r in run_rates.items()},
                per_million_examples={
                    m: cost_per_million(r, nodes, eps) for m, r in run_rates.items()
                },
                whole_run={m: cost_of(r, nodes, total_s) for m, r in run_rates.items()},
                to_tokens_s=to_tokens,
                to_loss_s=to_loss,
                to_tokens_cost={m: cost_of(r, nodes, to_tokens) for m, r in run_rates.items()},
                to_loss_cost={m: cost_of(r, nodes, to_loss) for m, r in run_rates.items()},
            )
        )
    return summaries, matched


def with_labels(runs: Sequence[Run], names: Sequence[str], values: Sequence[str]) -> list[Run]:
    """``runs`` (given on the command line as ``names``) relabelled by ``--label RUN=NAME``
    ``values``; a run without one keeps its name.

    Raises:
        TrnctlError: USAGE, naming the flag and the value, for another form, a RUN that is not
            one of ``names``, a RUN labelled twice, or two runs with the same label.
    """
    labels: dict[str, str] = {}
    for value in values:
        run, sep, label = value.partition("=")
        if not sep or not label.strip() or run not in names:
            raise TrnctlError(
                f"--label {value!r}: expected RUN=NAME where RUN is one of the runs given "
                f"({', '.join(names)}), e.g. --label {names[0]}=trn2",
                ExitCode.USAGE,
            )
        if run in labels:
            raise TrnctlError(f"--label: run {run!r} is labelled twice", ExitCode.USAGE)
        labels[run] = label.strip()
    relabelled = [replace(r, label=labels.get(n, n)) for r, n in zip(runs, names, strict=True)]
    seen = [r.label for r in relabelled]
    twice = sorted({label for label in seen if seen.count(label) > 1})
    if twice:
        raise TrnctlError(
            f"two runs share the label {twice[0]!r}; give each a name of its own with "
            "--label RUN=NAME",
            ExitCode.USAGE,
        )
    return relabelled


def market_of(run: Run) -> prices.Market:
    """How the run's nodes were paid for: ``capacity-block`` when its header says it ran on a
    Capacity Block (the trainer records the node group's ``capacity``), else On-Demand (an ODCR
    is billed at the On-Demand rate)."""
    return "capacity-block" if run.header.get("capacity") == "capacity-block" else "on-demand"


@dataclass(frozen=True)
class Goal:
    """What the verdict compares the runs at: a ``loss`` to reach or ``tokens`` to train."""

    kind: Literal["loss", "tokens"]
    value: float

    def describe(self) -> str:
        return f"loss {self.value:g}" if self.kind == "loss" else f"{self.value:,.0f} tokens"


def goal_of(targets: Targets, matched: Sequence[float]) -> Goal | None:
    """``--to-loss``, else ``--to-tokens``, else the most tokens every run trained (the last
    matched count); None when the runs' token counts do not overlap."""
    if targets.to_loss is not None:
        return Goal("loss", targets.to_loss)
    if targets.to_tokens is not None:
        return Goal("tokens", targets.to_tokens)
    return Goal("tokens", matched[-1]) if matched else None


@dataclass(frozen=True)
class Outcome:
    """One run at the goal: run time to reach it (None: not reached) and what that cost at the
    run's own market (None: not reached, or no price)."""

    label: str
    market: prices.Market
    rate: Rate
    seconds: float | None
    usd: float | None


def outcomes(summaries: Sequence[Summary], goal: Goal) -> list[Outcome]:
    """Each run's :class:`Outcome` at ``goal``, at the rate of :func:`market_of`."""
    found = []
    for s in summaries:
        market = market_of(s.run)
        if goal.kind == "loss":
            seconds = first_reaching(s.run, loss=goal.value)
        else:
            seconds = first_reaching(s.run, tokens=goal.value)
        rate = s.rates[market]
        found.append(Outcome(s.run.label, market, rate, seconds, cost_of(rate, s.nodes, seconds)))
    return found


def duration(seconds: float) -> str:
    """``42 s``, ``17.5 min`` or ``3.2 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * SECONDS_PER_HOUR:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / SECONDS_PER_HOUR:.1f} h"


def usd(value: float) -> str:
    """``$1,234.57``; four significant digits below $1 (runs of seconds cost fractions of a
    cent)."""
    return f"${value:,.2f}" if value >= 1 else f"${value:.4g}"


def verdict(outcomes_: Sequence[Outcome], goal: Goal) -> list[str]:
    """One sentence per run after the first, comparing it with the first (the reference):
    which reaches ``goal`` for less and how much longer it takes, or why that is unknown; for
    a run alone, what it took to reach ``goal``."""
    reference = outcomes_[0]
    if len(outcomes_) == 1:
        if reference.seconds is None:
            return [f"On this job, {reference.label} did not reach {goal.describe()}."]
        return [f"On this job, {reference.label} reaches {goal.describe()} {_reach(reference)}."]
    return [_sentence(reference, other, goal) for other in outcomes_[1:]]


def _reach(o: Outcome) -> str:
    cost = "at an unknown cost" if o.usd is None else f"for {usd(o.usd)}"
    return f"in {duration(o.seconds or 0.0)} {cost}"


def _sentence(a: Outcome, b: Outcome, goal: Goal) -> str:
    missed = [o.label for o in (a, b) if o.seconds is None]
    if missed:
        reached = [o for o in (a, b) if o.seconds is not None]
        head = f"On this job, {' and '.join(missed)} did not reach {goal.describe()}"
        if not reached:
            return head + "."
        return f"{head}; {reached[0].label} reaches it {_reach(reached[0])}."
    head = f"On this job, {a.label} reaches {goal.describe()} {_reach(a)} and {b.label} {_reach(b)}"
    assert a.seconds is not None and b.seconds is not None
    if a.usd is None or b.usd is None:
        faster, slower = (a, b) if a.seconds <= b.seconds else (b, a)
        unpriced = ", ".join(o.label for o in (a, b) if o.usd is None)
        return (
            f"{head}: {faster.label} is {_percent(slower.seconds or 0.0, faster.seconds or 0.0)} "
            f"faster; no price for {unpriced}, so no cost comparison."
        )
    cheap, dear = (a, b) if a.usd <= b.usd else (b, a)
    assert cheap.usd is not None and dear.usd is not None
    cost = (
        f"{cheap.label} costs {_percent(dear.usd, cheap.usd)} less"
        if dear.usd > cheap.usd
        else f"both cost {usd(cheap.usd)}"
    )
    if cheap.seconds == dear.seconds:
        time = "takes as long"
    elif (cheap.seconds or 0.0) > (dear.seconds or 0.0):
        time = f"takes {_percent(cheap.seconds or 0.0, dear.seconds or 0.0, longer=True)} longer"
    else:
        time = f"is {_percent(dear.seconds or 0.0, cheap.seconds or 0.0)} faster"
    return f"{head}: {cost} and {time}."


def _percent(high: float, low: float, *, longer: bool = False) -> str:
    """How much ``low`` is below ``high``, in percent of ``high`` (or, ``longer``, how much
    ``high`` is above ``low``, in percent of ``low``)."""
    base = low if longer else high
    return f"{(high - low) / base * 100:.0f}%" if base else "0%"
