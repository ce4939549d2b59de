"""trnctl job top --once: a running job's nodes and figures from CloudWatch (moto) and the fake
Kubernetes API, under the names the agent and the trainer publish (trn_catalog.observability)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import test_trnctl_kube
from fake_kube import FakeKube
from rich.console import Console
from test_trnctl_job_cost import _pod

from trn_catalog import observability as obs
from trnctl import top
from trnctl.commands import job_watch

fake = test_trnctl_kube.fake
Trnctl = Callable[..., Any]
NODE, INSTANCE = "ip-10-0-0-10.ec2.internal", "i-0aaaaaaaaaaaaaaa1"


def _rows(stdout: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.split("│")[1:-1]]
        for line in stdout.splitlines()
        if line.startswith("│")
    ]


def _put(namespace: str, name: str, dimensions: dict[str, str], values: list[float]) -> None:
    now = datetime.now(UTC)
    boto3.client("cloudwatch").put_metric_data(
        Namespace=namespace,
        MetricData=[
            {
                "MetricName": name,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions.items()],
                "Timestamp": now - timedelta(minutes=len(values) - i),
                "Value": value,
            }
            for i, value in enumerate(values)
        ],
    )


def test_once_shows_the_nodes_and_the_job_with_the_time_left(
    fake: FakeKube, trnctl: Trnctl
) -> None:
    args = ["--preset", "125m", "--data", "/datasets/c", "--max-steps", "1000"]
    fake.trainjobs["train-a"] = {
        "metadata": {"name": "train-a"},
        "spec": {"trainer": {"args": args}},
    }
    fake.pods.append(_pod("train-a-node-0-0-aaaaa", NODE, datetime.now(UTC), None))
    fake.nodes[NODE] = {}
    fake.provider_ids[NODE] = f"aws:///us-east-2a/{INSTANCE}"
    node = {"ClusterName": "trn-dev", "InstanceId": INSTANCE, "NodeName": NODE}
    _put(obs.CONTAINER_INSIGHTS_NAMESPACE, obs.NEURONCORE_UTILIZATION.name, node, [50.0, 87.5])
    _put(obs.CONTAINER_INSIGHTS_NAMESPACE, obs.NEURON_DEVICE_MEMORY.name, node, [64 * 2**30])
    _put(obs.CONTAINER_INSIGHTS_NAMESPACE, obs.EFA_RX_BYTES.name, node, [3 * 2**20])
    job = {obs.ENVIRONMENT: "trn-dev", obs.JOB: "train-a"}
    _put(obs.NAMESPACE, obs.STEP, job, [380, 400])
    _put(obs.NAMESPACE, obs.STEP_TIME, job, [1.5, 1.5])
    _put(obs.NAMESPACE, obs.TOKENS_PER_SECOND, job, [120_000.0])
    _put(obs.NAMESPACE, obs.MFU, job, [41.25])
    _put(obs.NAMESPACE, obs.LOSS, job, [3.25])

    run = trnctl("job", "top", "train-a", "--env", "trn-dev", "--once")

    assert run.exit_code == 0, run.stderr
    summary, node_row = _rows(run.stdout)
    # 600 steps left at 1.5 s: 15 minutes.
    assert summary == ["400 / 1,000", "120,000", "41.2%", "3.2500", "1.50 s", "15.0 min"]
    assert node_row == [NODE, INSTANCE, "87.5%", "64.0 GiB", "3.0 MiB/s", "-"]


def test_a_job_without_metrics_yet_shows_dashes(fake: FakeKube, trnctl: Trnctl) -> None:
    fake.trainjobs["train-b"] = {"metadata": {"name": "train-b"}, "spec": {}}
    run = trnctl("job", "top", "train-b", "--env", "trn-dev", "--once")
    assert run.exit_code == 0, run.stderr
    (summary,) = _rows(run.stdout)
    assert summary == ["-", "-", "-", "-", "-", "-"]


def test_under_dra_the_nodes_table_says_why_efa_is_empty() -> None:
    """A DRA environment's trn nodes report no Container Insights EFA metrics (they come with the
    EFA device plugin): the nodes' table says so under DRA and only there."""
    now = datetime.now(UTC)
    nodes = [top.NodeRef(NODE, INSTANCE)]

    def rendered(devices: str) -> str:
        console = Console(record=True, width=200)
        for table in job_watch.top_tables("train-a", {}, nodes, {}, now, devices):
            console.print(table)
        return console.export_text()

    assert job_watch.DRA_CAPTION in rendered("dra")
    assert "EFA: none" not in rendered("plugin")


def test_a_nodes_efa_traffic_is_the_sum_of_its_devices(fake: FakeKube, trnctl: Trnctl) -> None:
    """The agent publishes one EFA datapoint per device under the node's dimensions: the node's
    row shows their sum (two devices at 1 MiB/s each: 2 MiB/s), as the dashboard's SUM does."""
    fake.trainjobs["train-a"] = {"metadata": {"name": "train-a"}, "spec": {}}
    fake.pods.append(_pod("train-a-node-0-0-aaaaa", NODE, datetime.now(UTC), None))
    fake.nodes[NODE] = {}
    fake.provider_ids[NODE] = f"aws:///us-east-2a/{INSTANCE}"
    node = {"ClusterName": "trn-dev", "InstanceId": INSTANCE, "NodeName": NODE}
    moment = (datetime.now(UTC) - timedelta(minutes=2)).replace(second=0, microsecond=0)
    for metric in (obs.EFA_RX_BYTES, obs.EFA_TX_BYTES):
        boto3.client("cloudwatch").put_metric_data(
            Namespace=obs.CONTAINER_INSIGHTS_NAMESPACE,
            MetricData=[
                {
                    "MetricName": metric.name,
                    "Dimensions": [{"Name": k, "Value": v} for k, v in node.items()],
                    "Timestamp": moment,
                    "Value": float(2**20),
                }
                for _device in ("rdmap16s27", "rdmap32s27")
            ],
        )

    run = trnctl("job", "top", "train-a", "--env", "trn-dev", "--once")

    assert run.exit_code == 0, run.stderr
    _, node_row = _rows(run.stdout)
    assert node_row[-2:] == ["2.0 MiB/s", "2.0 MiB/s"]
