"""The trainer's figures as CloudWatch metrics: one embedded metric format (EMF) document per
logged interval and per eval, sent to the CloudWatch agent's EMF listener.

EMF (CloudWatch user guide, "Specification: Embedded metric format"): a JSON object whose root
holds ``_aws`` (``Timestamp`` in epoch milliseconds and ``CloudWatchMetrics``, a list of
directives naming the namespace, the dimension sets and the metrics with their units) beside the
dimension and metric values themselves. CloudWatch extracts metrics only from documents whose
``_aws`` is at the root of the log event: a pod's stdout line reaches Container Insights'
application log group nested under ``log_processed`` (the add-on's Fluent Bit config merges JSON
logs with ``Merge_Log_Key log_processed``), so the trainer sends its documents to the agent
instead, one JSON document per line over TCP, where the runtime names the agent in
``AWS_EMF_AGENT_ENDPOINT``. Sending never stops training: a failure is reported once on stderr
and the documents after it are dropped.
"""

from __future__ import annotations

import json
import math
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO
from urllib.parse import urlsplit

from trn_catalog import observability as obs

CONNECT_TIMEOUT_S = 2.0


def document(
    values: Mapping[str, float],
    units: Mapping[str, str],
    *,
    environment: str,
    job: str,
    timestamp_ms: int,
) -> dict[str, Any]:
    """An EMF document of ``values`` (metric name -> value; those without a unit in ``units``
    are left out, and so are NaN and infinities, which JSON cannot carry: a diverged run's
    loss would otherwise make the agent drop the whole document, its tokens/s and logged
    interval with it) in :data:`trn_catalog.observability.NAMESPACE`, by environment and job
    and by environment alone, logged to the environment's training log group."""
    metrics = {
        name: float(value)
        for name, value in values.items()
        if name in units and math.isfinite(value)
    }
    return {
        "_aws": {
            "Timestamp": timestamp_ms,
            "LogGroupName": obs.training_log_group(environment),
            "CloudWatchMetrics": [
                {
                    "Namespace": obs.NAMESPACE,
                    "Dimensions": [list(obs.DIMENSIONS), list(obs.ENVIRONMENT_DIMENSIONS)],
                    "Metrics": [{"Name": name, "Unit": units[name]} for name in metrics],
                }
            ],
        },
        obs.ENVIRONMENT: environment,
        obs.JOB: job,
        **metrics,
    }


def train_values(record: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of a train record (``step``, ``loss``, ``tokens_per_s``, ``step_time_s``,
    ``mfu`` as a fraction or None): MFU in percent, and one logged interval."""
    values = {
        obs.STEP: record["step"],
        obs.LOSS: record["loss"],
        obs.TOKENS_PER_SECOND: record["tokens_per_s"],
        obs.LOGGED_INTERVALS: 1,
    }
    if record.get("step_time_s") is not None:
        values[obs.STEP_TIME] = record["step_time_s"]
    if record.get("mfu") is not None:
        values[obs.MFU] = record["mfu"] * 100
    return {k: float(v) for k, v in values.items()}


def eval_values(record: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of an eval record (``step``, ``eval_loss``; none when it is None)."""
    if record.get("eval_loss") is None:
        return {}
    return {obs.EVAL_LOSS: float(record["eval_loss"])}


class EmfSink:
    """Sends EMF documents to an agent at ``tcp://HOST:PORT``, connecting on the first one.

    Raises:
        ValueError: on construction, an endpoint that is not ``tcp://HOST:PORT``.
    """

    def __init__(
        self, endpoint: str, *, environment: str, job: str, stream: TextIO = sys.stderr
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
            raise ValueError(
                f"{obs.EMF_AGENT_ENDPOINT_ENV} {endpoint!r} is not tcp://HOST:PORT, e.g. "
                f"{obs.EMF_AGENT_ENDPOINT}"
            )
        self.address = (parts.hostname, parts.port)
        self.environment, self.job, self.stream = environment, job, stream
        self._socket: socket.socket | None = None
        self.failed = False

    def train(self, record: Mapping[str, Any]) -> None:
        self._send(train_values(record), obs.TRAIN_METRICS)

    def eval(self, record: Mapping[str, Any]) -> None:
        values = eval_values(record)
        if values:
            self._send(values, obs.EVAL_METRICS)

    def _send(self, values: Mapping[str, float], units: Mapping[str, str]) -> None:
        if self.failed:
            return
        doc = document(
            values,
            units,
            environment=self.environment,
            job=self.job,
            timestamp_ms=int(time.time() * 1000),
        )
        try:
            if self._socket is None:
                self._socket = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT_S)
            self._socket.sendall(json.dumps(doc, allow_nan=False).encode() + b"\n")
        except OSError as error:
            self.failed = True
            self.stream.write(
                f"trn-train: CloudWatch metrics off: cannot send to the agent at "
                f"{self.address[0]}:{self.address[1]} ({error}); training goes on\n"
            )
            self.close()

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def from_env(env: Mapping[str, str], stream: TextIO = sys.stderr) -> EmfSink | None:
    """The sink the environment asks for: an agent endpoint, an environment name and a job name
    (``AWS_EMF_AGENT_ENDPOINT``, ``TRN_ENVIRONMENT``, ``TRN_JOB``); None without all three (a run
    outside the platform).

    Raises:
        ValueError: a malformed endpoint.
    """
    endpoint = env.get(obs.EMF_AGENT_ENDPOINT_ENV)
    environment, job = env.get(obs.ENVIRONMENT_ENV), env.get(obs.JOB_ENV)
    if not endpoint or not environment or not job:
        return None
    return EmfSink(endpoint, environment=environment, job=job, stream=stream)
