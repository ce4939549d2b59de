"""trnctl capacity find|buy, with a Stubber on EC2 (moto has no Capacity Blocks)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from trnctl import capacity
from trnctl.errors import TrnctlError

START = datetime(2026, 12, 1, 11, 30, tzinfo=UTC)


def offering(offering_id: str, fee: str, count: int = 2, hours: int = 48) -> dict[str, Any]:
    return {
        "CapacityBlockOfferingId": offering_id,
        "InstanceType": "trn2.48xlarge",
        "AvailabilityZone": "us-east-2b",
        "InstanceCount": count,
        "StartDate": START,
        "EndDate": datetime(2026, 12, 3, 11, 30, tzinfo=UTC),
        "CapacityBlockDurationHours": hours,
        "UpfrontFee": fee,
        "CurrencyCode": "USD",
    }


@pytest.mark.parametrize(("days", "hours"), [(1, 24), (14, 336), (21, 504), (182, 4368)])
def test_allowed_durations(days: int, hours: int) -> None:
    assert capacity.duration_hours(days) == hours


@pytest.mark.parametrize("days", [0, 15, 20, 189, -7])
def test_other_durations_are_refused_with_the_rule(days: int) -> None:
    with pytest.raises(
        TrnctlError,
        match=rf"--days {days} is not a Capacity Block duration; "
        r"allowed: 1 to 14, then multiples of 7 up to 182",
    ):
        capacity.duration_hours(days)


def test_find_sorts_by_price_per_instance_hour_and_prints_the_deploy_flags(
    trnctl: Any, clients: Any, stub: Any
) -> None:
    ec2 = stub(clients("ec2"))
    ec2.add_response(
        "describe_capacity_block_offerings",
        {
            "CapacityBlockOfferings": [
                # 3000 / (2 x 48) = 31.25 per instance-hour
                offering("cb-0aaaaaaaaaaaaaaaa", "3000.00"),
                # 1200 / (1 x 48) = 25.00: cheaper per instance-hour, though a smaller total
                offering("cb-0bbbbbbbbbbbbbbbb", "1200.00", count=1),
            ],
            "NextToken": "page-2",
        },
        {
            "InstanceType": "trn2.48xlarge",
            "InstanceCount": 2,
            "CapacityDurationHours": 48,
            "StartDateRange": datetime(2026, 12, 1, tzinfo=UTC),
        },
    )
    ec2.add_response(
        "describe_capacity_block_offerings",
        {"CapacityBlockOfferings": [offering("cb-0ccccccccccccccccc", "2880.00")]},
        {
            "InstanceType": "trn2.48xlarge",
            "InstanceCount": 2,
            "CapacityDurationHours": 48,
            "StartDateRange": datetime(2026, 12, 1, tzinfo=UTC),
            "NextToken": "page-2",
        },
    )

    run = trnctl(
        "capacity",
        "find",
        "--instance-type",
        "trn2.48xlarge",
        "--count",
        "2",
        "--days",
        "2",
        "--start-after",
        "2026-12-01",
    )

    assert run.exit_code == 0, run.stderr
    order = [line.split("│")[1].strip() for line in run.stdout.splitlines() if "│ cb-" in line]
    assert order == ["cb-0bbbbbbbbbbbbbbbb", "cb-0ccccccccccccccccc", "cb-0aaaaaaaaaaaaaaaa"]
    assert "25.00 USD" in run.stdout and "30.00 USD" in run.stdout and "31.25 USD" in run.stdout
    assert (
        "cheapest: trnctl capacity buy cb-0bbbbbbbbbbbbbbbb --upfront-fee 1200.00 "
        "--region us-east-2 "
        "--yes" in run.stdout
    )
    assert (
        "then deploy with: -c region=us-east-2 -c availability_zone=us-east-2b "
        "-c instance_type=trn2.48xlarge -c trn_nodes=1 -c capacity=capacity-block "
        "-c capacity_reservation_id=<reservation id printed by trnctl capacity buy --yes>"
    ) in run.stdout
    ec2.assert_no_pending_responses()


def test_find_without_offerings_exits_4(trnctl: Any, clients: Any, stub: Any) -> None:
    stub(clients("ec2")).add_response(
        "describe_capacity_block_offerings", {"CapacityBlockOfferings": []}
    )

    run = trnctl(
        "capacity", "find", "--instance-type", "trn2.48xlarge", "--count", "64", "--days", "7"
    )

    assert run.exit_code == 4
    assert run.stderr == (
        "trnctl: no Capacity Block offerings for 64 x trn2.48xlarge over 7 days in us-east-2; "
        "try other dates, fewer instances or another region\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--count", "65", "--days", "1"],
            "trnctl: --count 65 is outside 1 to 64 (one Capacity Block)\n",
        ),
        (
            ["--count", "1", "--days", "16"],
            "trnctl: --days 16 is not a Capacity Block duration; "
            "allowed: 1 to 14, then multiples of 7 up to 182\n",
        ),
    ],
)
def test_find_refuses_bad_sizes_before_calling_aws(
    trnctl: Any, clients: Any, stub: Any, args: list[str], message: str
) -> None:
    ec2 = stub(clients("ec2"))  # no responses queued: any call would fail the test

    run = trnctl("capacity", "find", "--instance-type", "trn2.48xlarge", *args)

    assert run.exit_code == 2
    assert run.stderr == message
    ec2.assert_no_pending_responses()


def test_buy_without_yes_is_a_dry_run(trnctl: Any, clients: Any, stub: Any) -> None:
    ec2 = stub(clients("ec2"))
    ec2.add_client_error(
        "purchase_capacity_block",
        "DryRunOperation",
        "Request would have succeeded, but DryRun flag is set.",
        412,
        expected_params={
            "CapacityBlockOfferingId": "cb-0bbbbbbbbbbbbbbbb",
            "InstancePlatform": "Linux/UNIX",
            "DryRun": True,
        },
    )

    run = trnctl("capacity", "buy", "cb-0bbbbbbbbbbbbbbbb")

    assert run.exit_code == 0, run.stderr
    assert "dry run: EC2 would sell cb-0bbbbbbbbbbbbbbbb; nothing was bought" in run.stdout
    assert "-c capacity=capacity-block -c capacity_reservation_id=" in run.stdout
    ec2.assert_no_pending_responses()


def test_dry_run_that_ec2_refuses_reports_the_reason(trnctl: Any, clients: Any, stub: Any) -> None:
    stub(clients("ec2")).add_client_error(
        "purchase_capacity_block", "UnauthorizedOperation", "You are not authorized.", 403
    )

    run = trnctl("capacity", "buy", "cb-0bbbbbbbbbbbbbbbb")

    assert run.exit_code == 3
    assert run.stderr.startswith(
        "trnctl: access denied calling PurchaseCapacityBlock (UnauthorizedOperation): "
        "You are not authorized.;"
    )


SIZE_TAG = capacity.REQUESTED_QUANTITY_TAG


@pytest.mark.parametrize(
    ("counts", "nodes"),
    [
        # Before a block starts EC2 gives it 0 instances and keeps its size in a tag (EC2 User
        # Guide, "View Capacity Blocks"); a purchase answers before the start.
        ({"TotalInstanceCount": 0, "Tags": [{"Key": SIZE_TAG, "Value": "2"}]}, "2"),
        ({"TotalInstanceCount": 2, "AvailableInstanceCount": 2}, "2"),
        ({"TotalInstanceCount": 0}, capacity.COUNT_PLACEHOLDER),
    ],
)
def test_buy_with_yes_purchases_and_prints_the_exact_deploy_flags(
    trnctl: Any, clients: Any, stub: Any, counts: dict[str, Any], nodes: str
) -> None:
    ec2 = stub(clients("ec2"))
    ec2.add_response(
        "purchase_capacity_block",
        {
            "CapacityReservation": {
                "CapacityReservationId": "cr-0123456789abcdef0",
                "InstanceType": "trn2.48xlarge",
                "AvailabilityZone": "us-east-2b",
                "State": "payment-pending",
                "ReservationType": "capacity-block",
                "StartDate": START,
                **counts,
            }
        },
        {"CapacityBlockOfferingId": "cb-0bbbbbbbbbbbbbbbb", "InstancePlatform": "Linux/UNIX"},
    )

    run = trnctl("capacity", "buy", "cb-0bbbbbbbbbbbbbbbb", "--yes")

    assert run.exit_code == 0, run.stderr
    shown = "?" if nodes == capacity.COUNT_PLACEHOLDER else nodes
    assert (
        f"bought cb-0bbbbbbbbbbbbbbbb: reservation cr-0123456789abcdef0, {shown} x trn2.48xlarge "
        "in us-east-2b"
    ) in run.stdout
    assert (
        "deploy with: -c region=us-east-2 -c availability_zone=us-east-2b "
        f"-c instance_type=trn2.48xlarge -c trn_nodes={nodes} -c capacity=capacity-block "
        "-c capacity_reservation_id=cr-0123456789abcdef0\n"
    ) in run.stdout
    ec2.assert_no_pending_responses()


def test_the_deploy_flags_name_the_region_asked_not_one_cut_from_the_zone() -> None:
    """A Local Zone's name is its region's and more (us-west-2-lax-1a)."""
    flags = capacity.deploy_flags(
        region="us-west-2",
        availability_zone="us-west-2-lax-1a",
        instance_type="trn2.48xlarge",
        count=2,
        reservation_id="cr-0123456789abcdef0",
    )
    assert flags.startswith("-c region=us-west-2 -c availability_zone=us-west-2-lax-1a ")
    ultra = capacity.ultraserver_deploy_flags(
        region="us-west-2",
        availability_zone="us-west-2-lax-1a",
        ultraserver_type="u-trn2x64",
        reservation_ids=["cr-0123456789abcdef0"],
    )
    assert ultra.startswith("-c region=us-west-2 -c availability_zone=us-west-2-lax-1a ")


def test_a_segmented_block_prints_every_reservation(trnctl: Any, clients: Any, stub: Any) -> None:
    def reservation(rid: str, zone: str) -> dict[str, Any]:
        return {
            "CapacityReservationId": rid,
            "InstanceType": "trn2.48xlarge",
            "AvailabilityZone": zone,
            "TotalInstanceCount": 1,
            "State": "scheduled",
            "ReservationType": "capacity-block",
            "StartDate": START,
        }

    ec2 = stub(clients("ec2"))
    first = reservation("cr-0123456789abcdef0", "us-east-2b")
    ec2.add_response(
        "purchase_capacity_block",
        {
            "CapacityReservation": first,
            "CapacityReservations": [first, reservation("cr-0fedcba9876543210", "us-east-2b")],
        },
        {"CapacityBlockOfferingId": "cb-0bbbbbbbbbbbbbbbb", "InstancePlatform": "Linux/UNIX"},
    )
    run = trnctl("capacity", "buy", "cb-0bbbbbbbbbbbbbbbb", "--yes")
    assert run.exit_code == 0, run.stderr
    assert run.stdout.count("deploy with: ") == 2
    assert "capacity_reservation_id=cr-0fedcba9876543210" in run.stdout


def test_price_per_instance_hour_counts_the_minutes() -> None:
    item = offering("cb-0aaaaaaaaaaaaaaaa", "2475.00", count=1)
    item.update({"CapacityBlockDurationHours": 24, "CapacityBlockDurationMinutes": 45})
    block = capacity.Offering.from_api(item)
    # 2475 / 24.75 h = 100 per instance-hour, not 2475 / 24 = 103.125
    assert block.per_instance_hour == Decimal("100")


def test_buy_refuses_a_malformed_offering_id(trnctl: Any) -> None:
    run = trnctl("capacity", "buy", "cr-0123456789abcdef0", "--yes")

    assert run.exit_code == 2
    assert run.stderr == (
        "trnctl: 'cr-0123456789abcdef0' is not a Capacity Block offering id (cb- and "
        "hexadecimal digits, as trnctl capacity find prints)\n"
    )
