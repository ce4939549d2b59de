"""trnctl capacity find|buy for UltraServer Capacity Blocks, with botocore's Stubber on EC2: moto
has no Capacity Block offerings, and the Stubber checks every request against botocore's EC2
model (UltraserverType and UltraserverCount included)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from trnctl import capacity
from trnctl.commands import capacity as capacity_command
from trnctl.errors import TrnctlError

START = datetime(2026, 12, 1, 11, 30, tzinfo=UTC)
END = datetime(2026, 12, 3, 11, 30, tzinfo=UTC)


def ultra_offering(offering_id: str, fee: str, servers: int = 1) -> dict[str, Any]:
    return {
        "CapacityBlockOfferingId": offering_id,
        "InstanceType": "trn2u.48xlarge",
        "AvailabilityZone": "us-east-2b",
        "InstanceCount": 4 * servers,
        "StartDate": START,
        "EndDate": END,
        "CapacityBlockDurationHours": 48,
        "UpfrontFee": fee,
        "CurrencyCode": "USD",
        "UltraserverType": "u-trn2x64",
        "UltraserverCount": servers,
    }


def test_find_passes_the_ultraserver_parameters_and_shows_them(
    trnctl: Any, clients: Any, stub: Any
) -> None:
    ec2 = stub(clients("ec2"))
    ec2.add_response(
        "describe_capacity_block_offerings",
        {
            "CapacityBlockOfferings": [
                # 19200 / (8 x 48) = 50.00 per instance-hour
                ultra_offering("cb-0aaaaaaaaaaaaaaaa", "19200.00", servers=2),
                # 7680 / (4 x 48) = 40.00
                ultra_offering("cb-0bbbbbbbbbbbbbbbb", "7680.00"),
            ]
        },
        {"UltraserverType": "u-trn2x64", "UltraserverCount": 2, "CapacityDurationHours": 48},
    )

    run = trnctl(
        "capacity",
        "find",
        "--ultraserver-type",
        "u-trn2x64",
        "--ultraserver-count",
        "2",
        "--days",
        "2",
    )

    assert run.exit_code == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if "│ cb-" in line]
    assert [row.split("│")[1].strip() for row in rows] == [
        "cb-0bbbbbbbbbbbbbbbb",
        "cb-0aaaaaaaaaaaaaaaa",
    ]
    cells = [cell.strip() for cell in rows[1].split("│")]
    assert "2 x u-trn2x64" in cells and "8 x trn2u.48xlarge" in cells
    assert "50.00 USD" in cells
    assert "Capacity Blocks: 2 x UltraServer u-trn2x64, 2 days, us-east-2" in run.stdout
    assert (
        "then deploy with: -c region=us-east-2 -c availability_zone=us-east-2b "
        "-c instance_type=trn2u.48xlarge -c ultraserver_reservation_ids="
        "<reservation id printed by trnctl capacity buy --yes>"
    ) in run.stdout
    ec2.assert_no_pending_responses()


def test_an_offering_without_instance_type_and_count_takes_them_from_the_ultraserver(
    trnctl: Any, clients: Any, stub: Any
) -> None:
    """EC2's CapacityBlockOffering has InstanceType and InstanceCount as optional members; an
    UltraServer offering without them is 2 x u-trn2x64 = 8 x trn2u.48xlarge (the catalog), and
    its 19200 USD over 48 hours is 50.00 per instance-hour, not per UltraServer-hour."""
    bare = {
        k: v
        for k, v in ultra_offering("cb-0aaaaaaaaaaaaaaaa", "19200.00", servers=2).items()
        if k not in ("InstanceType", "InstanceCount")
    }
    ec2 = stub(clients("ec2"))
    ec2.add_response(
        "describe_capacity_block_offerings",
        {"CapacityBlockOfferings": [bare]},
        {"UltraserverType": "u-trn2x64", "UltraserverCount": 2, "CapacityDurationHours": 48},
    )

    run = trnctl(
        "capacity", "find", "--ultraserver-type", "u-trn2x64", "--ultraserver-count", "2",
        "--days", "2",
    )  # fmt: skip

    assert run.exit_code == 0, run.stderr
    (row,) = [line for line in run.stdout.splitlines() if "│ cb-" in line]
    cells = [cell.strip() for cell in row.split("│")]
    assert "8 x trn2u.48xlarge" in cells and "50.00 USD" in cells
    offering = capacity.Offering.from_api(bare)
    assert (offering.instance_type, offering.instance_count) == ("trn2u.48xlarge", 8)
    ec2.assert_no_pending_responses()


def test_no_offerings_says_the_type_name_is_unverified_at_ec2(
    trnctl: Any, clients: Any, stub: Any
) -> None:
    ec2 = stub(clients("ec2"))
    ec2.add_response(
        "describe_capacity_block_offerings",
        {"CapacityBlockOfferings": []},
        {"UltraserverType": "u-trn2x64", "UltraserverCount": 1, "CapacityDurationHours": 24},
    )

    run = trnctl(
        "capacity",
        "find",
        "--ultraserver-type",
        "u-trn2x64",
        "--ultraserver-count",
        "1",
        "--days",
        "1",
    )

    assert run.exit_code == 4
    text = " ".join(run.stderr.split())
    assert "no Capacity Block offerings for 1 x UltraServer u-trn2x64" in text
    assert "no EC2 document or API model lists the values of UltraserverType" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--ultraserver-type", "u-trn3x64", "--ultraserver-count", "1"],
            r"--ultraserver-type: UltraServer type 'u-trn3x64' is not confirmed: Trn3 "
            r"UltraServers .* have no EC2 UltraserverType name that a source confirms.*"
            r"confirmed: u-trn2x64",
        ),
        (
            ["--ultraserver-type", "u-p6e-gb200x72", "--ultraserver-count", "1"],
            r"UltraServer type 'u-p6e-gb200x72' is not one a source confirms .*"
            r"confirmed: u-trn2x64",
        ),
        (
            ["--ultraserver-type", "u-trn2x64", "--ultraserver-count", "0"],
            r"--ultraserver-count 0 is not allowed; at least 1 UltraServer",
        ),
        (
            ["--ultraserver-type", "u-trn2x64"],
            r"--ultraserver-type and --ultraserver-count go together",
        ),
        (
            ["--ultraserver-type", "u-trn2x64", "--ultraserver-count", "1", "--count", "4"],
            r"leave out --instance-type and --count",
        ),
        ([], r"capacity find needs --instance-type and --count, or --ultraserver-type"),
    ],
)
def test_find_refuses_bad_ultraserver_options_before_calling_aws(
    trnctl: Any, clients: Any, stub: Any, args: list[str], message: str
) -> None:
    ec2 = stub(clients("ec2"))  # nothing queued: a call would fail the test

    run = trnctl("capacity", "find", "--days", "2", *args)

    assert run.exit_code == 2
    assert run.stderr.startswith("trnctl: ")
    assert re.search(message, run.stderr), run.stderr
    ec2.assert_no_pending_responses()


@pytest.mark.parametrize(
    ("kind", "count", "days", "message"),
    [
        ("u-trn3x144", 1, 1, r"--ultraserver-type: UltraServer type 'u-trn3x144' is not confirmed"),
        ("trn2u.48xlarge", 1, 1, r"UltraServer type 'trn2u.48xlarge' is not one a source"),
        ("u-trn2x64", -1, 1, r"--ultraserver-count -1 is not allowed; at least 1 UltraServer"),
        ("u-trn2x64", 1, 15, r"--days 15 is not a Capacity Block duration"),
    ],
)
def test_the_library_call_refuses_before_calling_ec2(
    kind: str, count: int, days: int, message: str
) -> None:
    with pytest.raises(TrnctlError, match=message):
        capacity.find_ultraservers(None, ultraserver_type=kind, count=count, days=days)


def test_buying_an_ultraserver_block_prints_one_node_group_per_ultraserver(
    trnctl: Any, clients: Any, stub: Any
) -> None:
    def reservation(rid: str) -> dict[str, Any]:
        return {
            "CapacityReservationId": rid,
            "InstanceType": "trn2u.48xlarge",
            "AvailabilityZone": "us-east-2b",
            # A block not yet started: 0 instances, its size in EC2's tag.
            "TotalInstanceCount": 0,
            "Tags": [{"Key": capacity.REQUESTED_QUANTITY_TAG, "Value": "4"}],
            "State": "payment-pending",
            "ReservationType": "capacity-block",
            "StartDate": START,
        }

    first, second = reservation("cr-0123456789abcdef0"), reservation("cr-0fedcba9876543210")
    ec2 = stub(clients("ec2"))
    ec2.add_response(
        "purchase_capacity_block",
        {
            "CapacityReservation": first,
            "CapacityReservations": [first, second],
            "CapacityBlocks": [
                {
                    "CapacityBlockId": "cb-0aaaaaaaaaaaaaaaa",
                    "UltraserverType": "u-trn2x64",
                    "AvailabilityZone": "us-east-2b",
                    "CapacityReservationIds": ["cr-0123456789abcdef0", "cr-0fedcba9876543210"],
                }
            ],
        },
        {"CapacityBlockOfferingId": "cb-0aaaaaaaaaaaaaaaa", "InstancePlatform": "Linux/UNIX"},
    )

    run = trnctl("capacity", "buy", "cb-0aaaaaaaaaaaaaaaa", "--yes")

    assert run.exit_code == 0, run.stderr
    assert run.stdout.count("bought cb-0aaaaaaaaaaaaaaaa: reservation ") == 2
    assert run.stdout.count("deploy with: ") == 1
    assert (
        "deploy with: -c region=us-east-2 -c availability_zone=us-east-2b "
        "-c instance_type=trn2u.48xlarge "
        "-c ultraserver_reservation_ids=cr-0123456789abcdef0,cr-0fedcba9876543210\n"
    ) in run.stdout
    ec2.assert_no_pending_responses()


def test_an_ultraserver_reservation_of_another_size_is_left_out_and_said(
    trnctl: Any, clients: Any, stub: Any
) -> None:
    odd = {
        "CapacityReservationId": "cr-0123456789abcdef0",
        "InstanceType": "trn2u.48xlarge",
        "AvailabilityZone": "us-east-2b",
        "TotalInstanceCount": 8,
    }
    ec2 = stub(clients("ec2"))
    ec2.add_response(
        "purchase_capacity_block",
        {
            "CapacityReservations": [odd],
            "CapacityBlocks": [{"UltraserverType": "u-trn2x64"}],
        },
        {"CapacityBlockOfferingId": "cb-0aaaaaaaaaaaaaaaa", "InstancePlatform": "Linux/UNIX"},
    )

    run = trnctl("capacity", "buy", "cb-0aaaaaaaaaaaaaaaa", "--yes")

    assert run.exit_code == 0, run.stderr
    assert (
        "reservation cr-0123456789abcdef0 holds 8 instances, not one u-trn2x64 (4); it is left "
        "out of the flags"
    ) in run.stdout
    assert "deploy with: " not in run.stdout


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ((None, 4, "u-trn2x64", 1), r"leave out --instance-type and --count"),
        (("trn2u.48xlarge", None, "u-trn2x64", 1), r"leave out --instance-type and --count"),
        ((None, None, None, 1), r"--ultraserver-type and --ultraserver-count go together"),
        ((None, None, "u-trn2x64", None), r"--ultraserver-type and --ultraserver-count go"),
    ],
)
def test_the_option_pairs_are_refused_naming_the_options(
    given: tuple[Any, Any, Any, Any], message: str
) -> None:
    with pytest.raises(TrnctlError, match=message):
        capacity_command._ultraserver_options(*given)
