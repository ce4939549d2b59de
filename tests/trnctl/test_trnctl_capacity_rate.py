"""A Capacity Block's price, recorded on its reservation at purchase (EC2 keeps none): `capacity
buy --upfront-fee` tags the reservations with USD per instance-hour, `capacity find` prints the
fee in its buy command, and `compare` prices a run on the block at that rate."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from trnctl import capacity

START = datetime(2026, 12, 3, 11, 30, tzinfo=UTC)


def _reservation(reservation_id: str, count: int, days: int) -> dict[str, Any]:
    return {
        "CapacityReservationId": reservation_id,
        "InstanceType": "trn2.48xlarge",
        "AvailabilityZone": "us-east-2a",
        "TotalInstanceCount": 0,  # EC2's answer until the block starts
        "StartDate": START,
        "EndDate": START + timedelta(days=days),
        "Tags": [{"Key": capacity.REQUESTED_QUANTITY_TAG, "Value": str(count)}],
    }


def test_a_segmented_purchase_is_priced_over_all_its_instance_hours() -> None:
    # 4 instances for 2 days and 2 for 1 day: 192 + 48 = 240 instance-hours for $7,200.
    reservations = [
        _reservation("cr-0123456789abcdef0", 4, 2),
        _reservation("cr-0fedcba9876543210", 2, 1),
    ]
    assert capacity.rate_of_purchase(reservations, Decimal("7200")) == Decimal(30)
    del reservations[1]["Tags"]
    assert capacity.rate_of_purchase(reservations, Decimal("7200")) is None


@pytest.mark.parametrize(("value", "rate"), [("31.5", 31.5), ("abc", None), ("-3", None)])
def test_the_recorded_rate_is_read_back_or_ignored(value: str, rate: float | None) -> None:
    reservation = {"Tags": [{"Key": capacity.RATE_TAG, "Value": value}]}
    assert capacity.recorded_rate(reservation) == rate


def test_buy_with_the_fee_records_the_rate_on_the_reservation(
    trnctl: Any, clients: Any, stub: Any
) -> None:
    ec2 = stub(clients("ec2"))
    reservation = _reservation("cr-0123456789abcdef0", 4, 2)
    ec2.add_response(
        "purchase_capacity_block",
        {"CapacityReservation": reservation},
        {"CapacityBlockOfferingId": "cb-0bbbbbbbbbbbbbbbb", "InstancePlatform": "Linux/UNIX"},
    )
    ec2.add_response(
        "create_tags",
        {},
        {
            "Resources": ["cr-0123456789abcdef0"],
            "Tags": [{"Key": capacity.RATE_TAG, "Value": "30.5"}],
        },
    )

    # 4 instances x 48 h at $30.50 is $5,856.
    run = trnctl("capacity", "buy", "cb-0bbbbbbbbbbbbbbbb", "--upfront-fee", "5856", "--yes")

    assert run.exit_code == 0, run.stderr
    assert (
        f"recorded $30.50 per instance-hour ({capacity.RATE_TAG}) on cr-0123456789abcdef0"
        in run.stdout
    )
    ec2.assert_no_pending_responses()


def test_compare_prices_a_run_on_a_block_at_its_recorded_rate(
    trnctl: Any, clients: Any, stub: Any, tmp_path: Path
) -> None:
    header = {
        "kind": "run",
        "instance_type": "trn2.48xlarge",
        "nodes": 2,
        "world_size": 128,
        "device": "neuron",
        "precision": "bf16",
        "model": "125m",
        "global_batch_tokens": 1000,
        "seq_len": 100,
        "flops_per_token": 1e9,
        "peak_flops_per_rank": 1e13,
        "started_at": "2026-12-03T12:00:00+00:00",
        "environment": "trn-dev",
        "job": "train-a",
        "capacity": "capacity-block",
        "capacity_reservation_id": "cr-0123456789abcdef0",
    }
    records = [
        {
            "step": s,
            "loss": 5 - s / 10,
            "tokens": 1000 * s,
            "tokens_per_s": 100.0,
            "elapsed_s": 10.0 * s,
        }
        for s in range(1, 5)
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (header, *records)))
    ec2 = stub(clients("ec2"), "DescribeCapacityReservations")
    tagged = {
        **_reservation("cr-0123456789abcdef0", 4, 2),
        "Tags": [{"Key": capacity.RATE_TAG, "Value": "30.5"}],
    }
    ec2.add_response(
        "describe_capacity_reservations",
        {"CapacityReservations": [tagged]},
        {"CapacityReservationIds": ["cr-0123456789abcdef0"]},
    )

    run = trnctl("compare", str(path), "--price", "trn2.48xlarge:cb=99", "--json")

    assert run.exit_code == 0, run.stderr
    document = json.loads(run.stdout)
    (verdict,) = document["verdict"]["runs"]
    assert verdict["market"] == "capacity-block"
    assert verdict["usd_per_instance_hour"] == 30.5
    assert verdict["price_source"] == (
        "Capacity Block cr-0123456789abcdef0: the price recorded on the reservation at purchase"
    )
    # 2 nodes at $30.50 for the run's 40 s.
    figures = document["runs"][0]["figures"]
    assert figures["capacity_block_usd_for_the_run"] == pytest.approx(30.5 * 2 * 40 / 3600)
    # A run alone: what reaching the goal (every token it trained) took, at the block's rate.
    assert document["verdict"]["sentences"] == [
        f"On this job, {path} reaches 4,000 tokens in 40 s for ${30.5 * 2 * 40 / 3600:.4g}."
    ]
