"""`trnctl job top`: what a running job's nodes and the job itself do now, from CloudWatch.

Per node, Container Insights' NeuronCore utilization, Neuron device memory and EFA traffic (by
``ClusterName``, ``InstanceId`` and ``NodeName``); for the job, the trainer's tokens/s, MFU,
loss, step and step time (by ``Environment`` and ``Job``), each the latest value of the last
minutes; and the time left to ``--max-steps`` at the latest step time. The names are
:mod:`trn_catalog.observability`'s, the ones the dashboard draws.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from trn_catalog import observability as obs

# How far back a "latest" value may be: Container Insights publishes every 60 s by default, the
# trainer at each logged interval.
LOOKBACK = timedelta(minutes=15)
PERIOD_S = 60
NODE_METRICS: tuple[tuple[str, obs.AgentMetric, str], ...] = (
    ("utilization", obs.NEURONCORE_UTILIZATION, "Average"),
    ("device_memory", obs.NEURON_DEVICE_MEMORY, "Maximum"),
    # The agent publishes EFA figures per EFA device, each under the node's dimensions too
    # (amazon-contributing/opentelemetry-collector-contrib, awscontainerinsightreceiver
    # internal/efa/efaSysfs.go, GetMetrics: one node metric per device): the node's traffic is
    # their sum, as the dashboard draws it; their average would be one interface's share.
    ("efa_rx", obs.EFA_RX_BYTES, "Sum"),
    ("efa_tx", obs.EFA_TX_BYTES, "Sum"),
)
JOB_METRICS: tuple[tuple[str, str, str], ...] = (
    ("tokens_per_s", obs.TOKENS_PER_SECOND, "Average"),
    ("mfu", obs.MFU, "Average"),
    ("loss", obs.LOSS, "Average"),
    ("step", obs.STEP, "Maximum"),
    ("step_time", obs.STEP_TIME, "Average"),
)
_MAX_STEPS = re.compile(r"^--max-steps(?:=(\d+))?$")


@dataclass(frozen=True)
class NodeRef:
    """A node of the job and its EC2 instance."""

    name: str
    instance_id: str | None


def queries(
    cluster: str, environment: str, job: str, nodes: Sequence[NodeRef]
) -> list[dict[str, Any]]:
    """The GetMetricData queries of one refresh: ids ``n<i>_<figure>`` per node and
    ``job_<figure>`` for the job (nodes without an instance id get no query)."""
    found = []
    for i, node in enumerate(nodes):
        if node.instance_id is None:
            continue
        dimensions = {"ClusterName": cluster, "InstanceId": node.instance_id, "NodeName": node.name}
        for figure, metric, stat in NODE_METRICS:
            found.append(
                _query(
                    f"n{i}_{figure}",
                    obs.CONTAINER_INSIGHTS_NAMESPACE,
                    metric.name,
                    dimensions,
                    stat,
                )
            )
    dimensions = {obs.ENVIRONMENT: environment, obs.JOB: job}
    for figure, name, stat in JOB_METRICS:
        found.append(_query(f"job_{figure}", obs.NAMESPACE, name, dimensions, stat))
    return found


def _query(
    query_id: str, namespace: str, name: str, dimensions: Mapping[str, str], stat: str
) -> dict[str, Any]:
    return {
        "Id": query_id,
        "MetricStat": {
            "Metric": {
                "Namespace": namespace,
                "MetricName": name,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions.items()],
            },
            "Period": PERIOD_S,
            "Stat": stat,
        },
        "ReturnData": True,
    }


def latest(
    cloudwatch: Any, metric_queries: list[dict[str, Any]], now: datetime
) -> dict[str, float]:
    """The newest value of each query that has one in the last :data:`LOOKBACK`, by id."""
    values: dict[str, tuple[datetime, float]] = {}
    for start in range(0, len(metric_queries), 500):  # GetMetricData takes 500 queries a call
        pages = cloudwatch.get_paginator("get_metric_data").paginate(
            MetricDataQueries=metric_queries[start : start + 500],
            StartTime=now - LOOKBACK,
            EndTime=now,
            ScanBy="TimestampDescending",
        )
        for page in pages:
            for result in page["MetricDataResults"]:
                for moment, value in zip(result["Timestamps"], result["Values"], strict=True):
                    held = values.get(result["Id"])
                    if held is None or moment > held[0]:
                        values[result["Id"]] = (moment, float(value))
    return {k: v for k, (_, v) in values.items()}


def max_steps(job: Mapping[str, Any]) -> int | None:
    """``--max-steps`` of a ``trn-train run`` job, from its TrainJob's arguments."""
    args = [str(a) for a in (job.get("spec", {}).get("trainer", {}).get("args") or [])]
    for i, arg in enumerate(args):
        found = _MAX_STEPS.match(arg)
        if found and found[1]:
            return int(found[1])
        if found and i + 1 < len(args) and args[i + 1].isdigit():
            return int(args[i + 1])
    return None


def seconds_left(step: float | None, step_time: float | None, total: int | None) -> float | None:
    """Time to ``total`` steps from ``step`` at ``step_time`` seconds a step."""
    if step is None or step_time is None or total is None:
        return None
    return max(0.0, total - step) * step_time
