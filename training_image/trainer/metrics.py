"""Metrics as JSON lines, and a one-line progress display for interactive runs."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TextIO

from trn_catalog import observability as obs
from trn_catalog.workspace import GPU_INSTANCE_TYPE_ENV

TRAIN = "train"
EVAL = "eval"
# Where a platform job's header names its environment, job and capacity (the runtime and trnctl
# set these variables; a run outside the platform has none, and its header no such keys).
CAPACITY_ENV = obs.CAPACITY_ENV
CAPACITY_RESERVATION_ENV = obs.CAPACITY_RESERVATION_ENV
PLATFORM_FIELDS = {
    "environment": obs.ENVIRONMENT_ENV,
    "job": obs.JOB_ENV,
    "capacity": CAPACITY_ENV,
    "capacity_reservation_id": CAPACITY_RESERVATION_ENV,
}
# The first record a run writes (each start of a resumed run writes its own); see run_header.
RUN = "run"


def train_flops_per_token(
    *, matmul_params: int, trained_params: int, layers: int, width: int, seq_len: int
) -> float:
    """Training FLOPs per token of the work a step does, the numerator of :func:`mfu`.

    ``matmul_params`` (N) are the weights of matrix products, every one of them trained or not
    (embedding lookups are not products and are left out; a tied output head counts once);
    ``trained_params`` (N_t) are those of them that get gradients. The forward multiplies by
    every weight: 2N. Backward computes the gradient with respect to the activations through
    every weight, frozen or not: 2N; and the gradient with respect to the weights only for the
    trained ones: 2 N_t. Attention scores and values add 12 * layers * width * seq_len
    (forward and both halves of backward; PaLM appendix B), none of it skipped by freezing.
    Full training (N_t = N) is the familiar 6N + 12 L d T; a LoRA run, whose base weights are
    frozen, does 4N + 2 N_t + 12 L d T with N including the adapters.
    """
    return 4.0 * matmul_params + 2.0 * trained_params + 12.0 * layers * width * seq_len


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak; None when the peak is
    unknown."""
    if not peak_flops:
        return None
    return tokens_per_s * flops_per_token / peak_flops


def node_instance_type(env: Mapping[str, str] = os.environ) -> str | None:
    """The instance type of the node a job runs on: ``TRN_GPU_INSTANCE_TYPE`` on a GPU node of
    the ``cuda-torch`` runtime, else ``TRN_INSTANCE_TYPE`` (every trn job); None outside the
    platform."""
    return env.get(GPU_INSTANCE_TYPE_ENV) or env.get("TRN_INSTANCE_TYPE") or None


def run_header(
    *,
    started_at: datetime,
    nodes: int,
    world_size: int,
    device: str,
    precision: str,
    model: str,
    seq_len: int,
    global_batch_tokens: int,
    flops_per_token: float | None,
    peak_flops_per_rank: float | None,
    settings: Mapping[str, Any] | None = None,
    env: Mapping[str, str] = os.environ,
) -> dict[str, Any]:
    """The ``"kind": "run"`` record that opens a run's metrics (``trnctl compare`` reads it):
    what ran where, and what its MFU is computed from. ``instance_type`` is the node's
    (:func:`node_instance_type`), None outside the platform (a local run); ``started_at``
    (timezone-aware) is written as UTC ISO-8601; ``settings`` (default none: left out) are the
    training settings the run took from flags and defaults (see
    :meth:`trainer.config.TrainConfig.settings`). A platform job's header also names its
    environment, job, capacity (``on-demand``, ``capacity-block`` or ``odcr``) and reservation,
    each where its variable (:data:`PLATFORM_FIELDS`) is set."""
    optional = {} if settings is None else {"settings": dict(settings)}
    platform = {key: env[name] for key, name in PLATFORM_FIELDS.items() if env.get(name)}
    return {
        "kind": RUN,
        "instance_type": node_instance_type(env),
        "nodes": nodes,
        "world_size": world_size,
        "device": device,
        "precision": precision,
        "model": model,
        "global_batch_tokens": global_batch_tokens,
        "seq_len": seq_len,
        "flops_per_token": flops_per_token,
        "peak_flops_per_rank": peak_flops_per_rank,
        "started_at": started_at.astimezone(UTC).isoformat(),
        **optional,
        **platform,
    }


class Sink(Protocol):
    """Where else the records go (:class:`trainer.emf.EmfSink`: CloudWatch)."""

    def train(self, record: dict[str, Any]) -> None: ...

    def eval(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class MetricsLog:
    """Appends one JSON object per line to ``path`` (none when empty), flushing each line so that
    a killed run keeps every interval it logged; draws a progress line on ``stream`` when
    ``progress`` is True (None: when the stream is a terminal).

    With a ``header`` (see :func:`run_header`) it writes that first, and every later record
    carries ``elapsed_s``: seconds since ``started``, a :func:`time.perf_counter` reading taken
    when the run started (default: now). With a ``sink`` (default none) every record also goes
    there."""

    def __init__(
        self,
        path: str,
        *,
        total_steps: int,
        progress: bool | None = None,
        stream: TextIO = sys.stderr,
        header: dict[str, Any] | None = None,
        started: float | None = None,
        sink: Sink | None = None,
    ) -> None:
        self.total_steps, self.stream, self.sink = total_steps, stream, sink
        self.progress = stream.isatty() if progress is None else progress
        self._file: TextIO | None = None
        self._started: float | None = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the run
        if header is not None:
            self._started = time.perf_counter() if started is None else started
            self._append(header)

    def _append(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def _timed(self, record: dict[str, Any]) -> dict[str, Any]:
        if self._started is None:
            return record
        return {**record, "elapsed_s": time.perf_counter() - self._started}

    def write(self, record: dict[str, Any]) -> None:
        self._append(self._timed(record))
        if self.sink is not None:
            self.sink.train(record)
        if self.progress:
            mfu_text = "" if record.get("mfu") is None else f" mfu {record['mfu']:.1%}"
            self.stream.write(
                f"\rstep {record['step']}/{self.total_steps} loss {record['loss']:.4f} "
                f"lr {record['lr']:.2e} {record['tokens_per_s']:,.0f} tok/s{mfu_text}   "
            )
            self.stream.flush()

    def write_eval(self, record: dict[str, Any]) -> None:
        """Appends an eval record (``step``, ``eval_loss``, ``eval_tokens``), marked
        ``"kind": "eval"``; the progress line is left as it is."""
        self._append(self._timed({"kind": EVAL, **record}))
        if self.sink is not None:
            self.sink.eval(record)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
        if self.progress:
            self.stream.write("\n")
        if self._file is not None:
            self._file.close()


def read(path: str | Path, kind: str = TRAIN) -> list[dict[str, Any]]:
    """Records of a metrics file of one ``kind``: :data:`TRAIN` (default; records without a
    ``kind``) or :data:`EVAL` (:data:`RUN` headers have no step: read them with
    :func:`headers`). When steps repeat (a resumed run re-trains the steps after its last
    checkpoint), the later record wins."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("kind", TRAIN) == kind:
                by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)]


def headers(path: str | Path) -> list[dict[str, Any]]:
    """The :data:`RUN` records of a metrics file, one per start of the run, oldest first."""
    records = (json.loads(line) for line in Path(path).read_text().splitlines() if line.strip())
    return [r for r in records if r.get("kind") == RUN]
