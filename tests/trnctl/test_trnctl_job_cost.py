"""trnctl job cost: a job's pods with known start and end times on nodes of known type and
capacity (On-Demand, a Capacity Block with its price recorded on the reservation, an On-Demand
Capacity Reservation), each node's hours times its rate, the reservations' idle share and the
totals worked out by hand. The real CLI against the fake Kubernetes API; EC2's instances and
reservations from botocore's Stubber (moto 5.2.5 implements no capacity reservations and returns
no CapacityReservationId on instances)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import test_trnctl_kube
from fake_kube import FakeKube

from trnctl import capacity

fake = test_trnctl_kube.fake
Trnctl = Callable[..., Any]

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
TRN2 = "trn2.48xlarge"
BLOCK, ODCR = "cr-0123456789abcdef1", "cr-0123456789abcdef2"
# Node -> (instance id, type, reservation, in a Capacity Block).
NODES = {
    "ip-10-0-0-10.ec2.internal": ("i-0aaaaaaaaaaaaaaa1", TRN2, None, False),
    "ip-10-0-0-11.ec2.internal": ("i-0aaaaaaaaaaaaaaa2", TRN2, BLOCK, True),
    "ip-10-0-0-12.ec2.internal": ("i-0aaaaaaaaaaaaaaa3", TRN2, ODCR, False),
}
BLOCK_RATE, OD_RATE = 30.0, 40.0


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(
    name: str, node: str | None, start: datetime | None, end: datetime | None
) -> dict[str, Any]:
    state: dict[str, Any] = (
        {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": _iso(end)}}
        if end is not None
        else {"running": {"startedAt": _iso(start)}}
        if start is not None
        else {"waiting": {}}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "training",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": "train-a",
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "batch.kubernetes.io/job-completion-index": "0",
            },
        },
        "spec": {"nodeName": node, "containers": [{"name": "node", "image": "trainer:1"}]},
        "status": {
            "phase": "Succeeded" if end else "Running" if start else "Pending",
            **({"startTime": _iso(start)} if start else {}),
            "containerStatuses": [
                {
                    "name": "node",
                    "image": "trainer:1",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        },
    }


def _instances() -> dict[str, Any]:
    found = []
    for instance_id, instance_type, reservation, block in NODES.values():
        item: dict[str, Any] = {"InstanceId": instance_id, "InstanceType": instance_type}
        if reservation:
            item["CapacityReservationId"] = reservation
        if block:
            item["InstanceLifecycle"] = "capacity-block"
        found.append(item)
    return {"Reservations": [{"Instances": found}]}


def _reservation(
    reservation_id: str, count: int, block: bool, rate: float | None
) -> dict[str, Any]:
    tags = [{"Key": capacity.RATE_TAG, "Value": f"{rate:g}"}] if rate is not None else []
    return {
        "CapacityReservationId": reservation_id,
        "InstanceType": "trn2.48xlarge",
        "TotalInstanceCount": count,
        "ReservationType": "capacity-block" if block else "default",
        "StartDate": T0 - timedelta(hours=1),
        "EndDate": T0 + timedelta(days=2),
        "Tags": tags,
    }


@pytest.fixture
def job(fake: FakeKube, clients: Any, stub: Any) -> FakeKube:
    """train-a: node A (On-Demand) 10:00-12:00; node B (the Capacity Block) 10:00-11:30 and a
    retry 11:15-12:00 (2 h once the overlap is counted once); node C (the ODCR) 10:30-12:00;
    and a pod never scheduled."""
    fake.trainjobs["train-a"] = {"metadata": {"name": "train-a"}, "spec": {}}
    a, b, c = NODES
    fake.pods += [
        _pod("train-a-node-0-0-aaaaa", a, T0, T0 + timedelta(hours=2)),
        _pod("train-a-node-0-1-bbbbb", b, T0, T0 + timedelta(hours=1.5)),
        _pod("train-a-node-0-1-ccccc", b, T0 + timedelta(hours=1.25), T0 + timedelta(hours=2)),
        _pod("train-a-node-0-2-ddddd", c, T0 + timedelta(hours=0.5), T0 + timedelta(hours=2)),
        _pod("train-a-node-0-3-eeeee", None, None, None),
    ]
    for node, (instance_id, *_) in NODES.items():
        fake.nodes[node] = {"node.kubernetes.io/instance-type": "trn2.48xlarge"}
        fake.provider_ids[node] = f"aws:///us-east-2a/{instance_id}"
    ec2 = stub(clients("ec2"), "DescribeInstances", "DescribeCapacityReservations")
    ids = sorted(i for i, *_ in NODES.values())
    ec2.add_response("describe_instances", _instances(), {"InstanceIds": ids})
    ec2.add_response(
        "describe_capacity_reservations",
        {
            "CapacityReservations": [
                _reservation("cr-0123456789abcdef1", 4, True, BLOCK_RATE),
                _reservation("cr-0123456789abcdef2", 2, False, None),
            ]
        },
        {"CapacityReservationIds": ["cr-0123456789abcdef1", "cr-0123456789abcdef2"]},
    )
    return fake


def test_each_node_at_its_rate_and_the_idle_share_apart(job: FakeKube, trnctl: Trnctl) -> None:
    run = trnctl(
        "job",
        "cost",
        "train-a",
        "--env",
        "trn-dev",
        "--price",
        f"trn2.48xlarge={OD_RATE}",
        "--json",
    )

    assert run.exit_code == 0, run.stderr
    cost = json.loads(run.stdout)
    by_node = {n["node"]: n for n in cost["nodes"]}
    a, b, c = (by_node[n] for n in NODES)
    # By hand: A 2 h On-Demand, B 2 h (10:00-11:30 and 11:15-12:00) in the block, C 1.5 h ODCR.
    assert (a["hours"], b["hours"], c["hours"]) == pytest.approx((2.0, 2.0, 1.5))
    assert (a["capacity"], b["capacity"], c["capacity"]) == ("on-demand", "capacity-block", "odcr")
    assert (a["usd"], b["usd"], c["usd"]) == pytest.approx((80.0, 60.0, 60.0))
    assert b["price_source"] == (
        "Capacity Block cr-0123456789abcdef1: the price recorded on the reservation at purchase"
    )
    assert c["price_source"].startswith("On-Demand Capacity Reservation, billed On-Demand: --price")
    assert cost["node_hours"] == pytest.approx(5.5)
    assert cost["usd"] == pytest.approx(200.0)
    # The window is 10:00-12:00: the block's 4 instances reserved 8 h, the job used 2 of them;
    # the ODCR's 2 instances 4 h, the job used 1.5.
    idle = {i["reservation_id"]: i for i in cost["idle"]}
    block, odcr = idle["cr-0123456789abcdef1"], idle["cr-0123456789abcdef2"]
    assert (block["reserved_hours"], block["idle_hours"], block["usd"]) == pytest.approx(
        (8, 6, 180)
    )
    assert (odcr["reserved_hours"], odcr["idle_hours"], odcr["usd"]) == pytest.approx((4, 2.5, 100))
    assert cost["usd_with_idle"] == pytest.approx(480.0)
    assert cost["window"] == [T0.isoformat(), (T0 + timedelta(hours=2)).isoformat()]
    assert cost["running"] is False


def test_the_table_shows_the_same_and_an_unpriced_node_exits_1(
    job: FakeKube, trnctl: Trnctl
) -> None:
    run = trnctl("job", "cost", "train-a", "--env", "trn-dev")

    # No On-Demand price for trn2.48xlarge in us-east-2's catalog: nodes A and C have none.
    assert run.exit_code == 1
    assert "job: $60.00 for 5.500 node-hours; with the reservations' idle share: $240.00" in (
        run.stdout
    )
    assert (
        "ip-10-0-0-10.ec2.internal: no price (no price for trn2.48xlarge in us-east-2: pass "
        "--price trn2.48xlarge=USD)" in run.stdout
    )


def test_a_job_whose_pods_never_started_costs_nothing_and_says_so(
    fake: FakeKube, trnctl: Trnctl
) -> None:
    fake.trainjobs["train-b"] = {"metadata": {"name": "train-b"}, "spec": {}}
    run = trnctl("job", "cost", "train-b", "--env", "trn-dev")
    assert run.exit_code == 4
    assert "TrainJob 'train-b' has no pod that started on a node yet" in run.stderr
