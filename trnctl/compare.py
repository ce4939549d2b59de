"""`trnctl compare`: time, throughput, loss and cost of training runs side by side.

Pure functions over parsed metrics files (the trainer's JSON lines: a ``"kind": "run"`` header,
then ``train`` records with ``step``, ``loss``, ``tokens``, ``tokens_per_s`` and ``elapsed_s``,
and ``eval`` records, which are ignored here). The command in :mod:`trnctl.commands.compare`
reads the files, resolves prices and prints.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class Run:
    """One run's metrics: its first header and its train records, oldest step first, each with
    ``time_s``, seconds of run time when it was written (restarts add up; see :func:`parse`)."""

    label: str
    header: dict[str, Any]
    records: list[dict[str, Any]]
    restarts: int


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
    return Run(label, header, records, starts - 1)


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
    steady = steady_records(run, warmup_steps)
    return float(statistics.median(r["tokens_per_s"] for r in steady)) if steady else None


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
    region: str,
    overrides: Mapping[tuple[str, prices.Market], float],
    live: Mapping[str, float | None],
) -> Rate:
    """The rate a run is costed at: ``--price``, else (On-Demand) the Pricing API's with
    ``--live``, else the catalog's for ``region``; a Rate without a price says what to pass."""
    if instance_type is None:
        return Rate(None, "no instance type in the run header (a local run)")
    flag = f"--price {instance_type}{CB_SUFFIX if market == 'capacity-block' else ''}=USD"
    if (instance_type, market) in overrides:
        return Rate(overrides[(instance_type, market)], f"{flag.removesuffix('=USD')} (given)")
    if market == "on-demand" and live.get(instance_type) is not None:
        return Rate(live[instance_type], f"AWS Pricing API, {region}, now")
    price = prices.lookup(instance_type, region, market)
    if price is None:
        return Rate(None, f"no price for {instance_type} in {region}: pass {flag}")
    status = "verified" if price.verified else "unverified"
    return Rate(price.usd_per_hour, f"{region}, as of {price.as_of}, {status}: {price.source}")


def cost_per_million_tokens(rate: Rate, nodes: int, tokens_per_s: float | None) -> float | None:
    """USD per 1M tokens at ``tokens_per_s`` (the whole job's) on ``nodes`` instances."""
    if rate.usd_per_hour is None or not tokens_per_s:
        return None
    return rate.usd_per_hour * nodes / SECONDS_PER_HOUR / tokens_per_s * MILLION


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
    mfu: float | None
    total_s: float
    total_tokens: int
    loss_at_matched: float | None
    loss_difference: float | None
    rates: dict[prices.Market, Rate]
    per_million: dict[prices.Market, float | None]
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
                mfu=mfu(run, tps),
                total_s=total_s,
                total_tokens=int(run.records[-1]["tokens"]),
                loss_at_matched=losses_at(run, matched[-1:])[0] if matched else None,
                loss_difference=mean_abs_loss_difference(run, runs[0], matched),
                rates=run_rates,
                per_million={
                    m: cost_per_million_tokens(r, nodes, tps) for m, r in run_rates.items()
                },
                whole_run={m: cost_of(r, nodes, total_s) for m, r in run_rates.items()},
                to_tokens_s=to_tokens,
                to_loss_s=to_loss,
                to_tokens_cost={m: cost_of(r, nodes, to_tokens) for m, r in run_rates.items()},
                to_loss_cost={m: cost_of(r, nodes, to_loss) for m, r in run_rates.items()},
            )
        )
    return summaries, matched
