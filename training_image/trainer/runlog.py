"""Metrics for your own training code, in the records ``trnctl compare`` reads.

A job submitted with ``trnctl job submit -- COMMAND`` gets ``TRN_METRICS_FILE`` (the job's
``/fsx/checkpoints/<job>/metrics.jsonl``, which FSx exports beside its checkpoints, where
``trnctl compare JOB --env E`` reads it). A script writes to it with this module, which the
platform's images carry (``/opt/training_image`` is on their ``PYTHONPATH``); it needs only the
standard library and the instance catalog beside it::

    try:
        from trainer import runlog
    except ImportError:  # not on the platform's image: no metrics file
        runlog = None

    log = runlog.start(model="my-lm", device="cuda", precision="bf16 autocast",
                       global_batch_tokens=4096, seq_len=512, flops_per_token=6 * n_params)
    ...
    if log is not None:
        log.step(step, loss, tokens_trained_so_far)

:func:`start` returns None where ``TRN_METRICS_FILE`` is unset (a run outside the platform) and
on every rank but 0, so the same script runs anywhere. The records are the trainer's own: a
``"kind": "run"`` header (instance type from the node, nodes and world size from torchrun's
environment, the peak FLOP/s per rank from the catalogs), then one train record per call with
``step``, ``loss``, ``tokens``, ``tokens_per_s`` (over the interval since the previous call) and
``elapsed_s``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainer import emf
from trainer.metrics import Sink, node_instance_type, run_header

METRICS_FILE_ENV = "TRN_METRICS_FILE"


class RunLog:
    """Appends train records after a run header to a metrics file (see :func:`start`).

    ``start_tokens`` is what the run had trained before this start (a resumed run), so that the
    first interval's tokens/s counts only this start's tokens; ``clock`` (seconds) times the
    intervals and must be the one that ``started`` was read from; every record also goes to
    ``sink`` when given (CloudWatch, :mod:`trainer.emf`).
    """

    def __init__(
        self,
        path: str,
        header: dict[str, Any],
        *,
        start_tokens: int = 0,
        started: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sink: Sink | None = None,
    ) -> None:
        self._clock, self._sink = clock, sink
        self._started = clock() if started is None else started
        self._last_time, self._last_tokens = self._started, start_tokens
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the run
        self._write(header)

    def _write(self, record: dict[str, Any]) -> None:
        # A line at a time, flushed: a killed run keeps every interval it logged.
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def step(self, step: int, loss: float, tokens: int) -> None:
        """Records ``step`` with its ``loss`` (a float: read it from the device every few steps,
        not every step) and ``tokens``, the run's tokens trained so far, all ranks together.

        Raises:
            ValueError: ``tokens`` below the previous record's.
        """
        now = self._clock()
        if tokens < self._last_tokens:
            raise ValueError(
                f"tokens {tokens} is below the previous record's {self._last_tokens}: pass the "
                "run's tokens trained so far, all ranks together"
            )
        interval = now - self._last_time
        rate = (tokens - self._last_tokens) / interval if interval > 0 else 0.0
        record = {
            "step": step,
            "loss": float(loss),
            "tokens": tokens,
            "tokens_per_s": rate,
            "elapsed_s": now - self._started,
        }
        self._write(record)
        if self._sink is not None:
            self._sink.train(record)
        self._last_time, self._last_tokens = now, tokens

    def close(self) -> None:
        self._file.close()
        if self._sink is not None:
            self._sink.close()


def start(
    *,
    model: str,
    device: str,
    precision: str,
    global_batch_tokens: int,
    seq_len: int,
    flops_per_token: float | None = None,
    peak_flops_per_rank: float | None = None,
    start_tokens: int = 0,
    env: Mapping[str, str] = os.environ,
) -> RunLog | None:
    """A :class:`RunLog` writing ``TRN_METRICS_FILE`` (its header written now), or None where
    the variable is unset or this is not rank 0 (``RANK``). On the platform (the runtime names
    the CloudWatch agent, the environment and the job) each record also becomes CloudWatch
    metrics (:mod:`trainer.emf`).

    Args:
        model: a name for the model, as the report shows it.
        device: ``cpu``, ``cuda`` or ``neuron``.
        precision: what the matmuls run in, e.g. ``fp32`` or ``bf16 autocast``.
        global_batch_tokens: tokens per optimizer step, all ranks together.
        seq_len: tokens per sequence.
        flops_per_token: training FLOPs per token (about 6 x parameters for a dense model);
            None: the report shows no MFU.
        peak_flops_per_rank: the peak MFU is measured against; default
            :func:`catalog_peak_flops_per_rank` of the node's instance type.
        start_tokens: tokens trained before this start (a resumed run).
        env: the environment (default: this process's).
    """
    path = env.get(METRICS_FILE_ENV)
    if not path or env.get("RANK", "0") != "0":
        return None
    world = int(env.get("WORLD_SIZE", "1"))
    local = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    instance = node_instance_type(env)
    peak = peak_flops_per_rank
    if peak is None and instance is not None:
        peak = catalog_peak_flops_per_rank(instance, env)
    header = run_header(
        started_at=datetime.now(UTC),
        nodes=max(1, world // max(1, local)),
        world_size=world,
        device=device,
        precision=precision,
        model=model,
        seq_len=seq_len,
        global_batch_tokens=global_batch_tokens,
        flops_per_token=flops_per_token,
        peak_flops_per_rank=peak,
        env=env,
    )
    return RunLog(path, header, start_tokens=start_tokens, sink=emf.from_env(env))


def catalog_peak_flops_per_rank(instance_type: str, env: Mapping[str, str]) -> float | None:
    """The dense BF16 peak of one rank on ``instance_type``, as the platform's trainer counts
    it: one GPU of a GPU-catalog type, or one logical NeuronCore of a trn type
    (``NEURON_LOGICAL_NC_CONFIG`` physical cores, default the type's; see
    ``trainer.device.neuron_peak_flops``); None for a type in neither catalog."""
    import trn_catalog

    if instance_type in trn_catalog.GPU_CATALOG:
        return trn_catalog.GPU_CATALOG[instance_type].bf16_tflops_per_gpu * 1e12
    if instance_type in trn_catalog.CATALOG:
        spec = trn_catalog.CATALOG[instance_type]
        lnc = int(env.get("NEURON_LOGICAL_NC_CONFIG", spec.default_lnc))
        return spec.bf16_tflops_per_chip * 1e12 * lnc / spec.neuron_cores_per_chip
    return None
