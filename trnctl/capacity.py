"""Capacity Blocks for ML: find offerings by price per instance-hour, and buy one.

Durations (botocore's DescribeCapacityBlockOfferings documentation, platform-facts.md): whole
days from 1 to 14, then multiples of 7 days up to 182. One block holds at most 64 instances.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from trn_catalog import ultraservers
from trn_catalog.formats import MAX_BLOCK_INSTANCES
from trnctl.errors import TrnctlError

MAX_INSTANCES = MAX_BLOCK_INSTANCES
MAX_DAYS = 182
_OFFERING_ID = re.compile(r"^cb-[0-9a-f]{8,32}$")
PLATFORM = "Linux/UNIX"
RESERVATION_PLACEHOLDER = "<reservation id printed by trnctl capacity buy --yes>"
COUNT_PLACEHOLDER = "<the block's instance count>"
# Where EC2 keeps a Capacity Block's size until it starts (its TotalInstanceCount is 0 till then).
REQUESTED_QUANTITY_TAG = "aws:ec2capacityreservation:incrementalRequestedQuantity"
# What the block cost, in USD per instance-hour, as `capacity buy --upfront-fee` records it on the
# reservation: EC2 keeps no price on a purchased block (DescribeCapacityReservations and
# DescribeCapacityBlocks have no fee field; botocore's EC2 model), so `job cost` and `compare`
# read the block's rate here.
RATE_TAG = "trn-platform:usd-per-instance-hour"


def duration_hours(days: int) -> int:
    """``days`` as the CapacityDurationHours that EC2 accepts.

    Raises:
        TrnctlError: ``days`` is not 1-14 or a multiple of 7 up to 182 (exit code USAGE).
    """
    if 1 <= days <= 14 or (14 < days <= MAX_DAYS and days % 7 == 0):
        return days * 24
    raise TrnctlError(
        f"--days {days} is not a Capacity Block duration; allowed: 1 to 14, then multiples of 7 "
        f"up to {MAX_DAYS}"
    )


@dataclass(frozen=True)
class Offering:
    offering_id: str
    instance_type: str
    availability_zone: str
    instance_count: int
    start: datetime
    end: datetime
    hours: int
    upfront_fee: Decimal
    currency: str
    # A block that does not start on the hour runs whole hours plus these minutes.
    minutes: int = 0
    # An UltraServer offering's type and count (EC2 returns them on such offerings only).
    ultraserver_type: str | None = None
    ultraserver_count: int | None = None

    @property
    def duration_hours(self) -> Decimal:
        return self.hours + Decimal(self.minutes) / 60

    @property
    def per_instance_hour(self) -> Decimal:
        return self.upfront_fee / (self.instance_count * self.duration_hours)

    @classmethod
    def from_api(cls, item: dict[str, Any]) -> Offering:
        return cls(
            offering_id=item["CapacityBlockOfferingId"],
            instance_type=item.get("InstanceType") or _member_type(item),
            availability_zone=item["AvailabilityZone"],
            instance_count=int(item.get("InstanceCount") or _member_count(item)),
            start=item["StartDate"],
            end=item["EndDate"],
            hours=int(item["CapacityBlockDurationHours"]),
            upfront_fee=Decimal(item["UpfrontFee"]),
            currency=item.get("CurrencyCode", "USD"),
            minutes=int(item.get("CapacityBlockDurationMinutes", 0)),
            ultraserver_type=item.get("UltraserverType"),
            ultraserver_count=item.get("UltraserverCount"),
        )


def _member_type(item: dict[str, Any]) -> str:
    """An UltraServer offering's instance type from the catalog, where EC2 leaves it out."""
    return ultraservers.get(item["UltraserverType"]).instance_type


def _member_count(item: dict[str, Any]) -> int:
    spec = ultraservers.get(item["UltraserverType"])
    return spec.servers * int(item["UltraserverCount"])


def find(
    ec2: Any, *, instance_type: str, count: int, days: int, start_after: datetime | None = None
) -> list[Offering]:
    """Offerings for ``count`` instances over ``days`` days, cheapest per instance-hour first.

    Args:
        start_after: earliest start; naive values are read as UTC. None (the default) lets EC2
            offer any start in its booking window.

    Raises:
        TrnctlError: ``count`` outside 1-64 or ``days`` not an allowed duration (USAGE).
        botocore.exceptions.ClientError: EC2 refused the call.
    """
    if not 1 <= count <= MAX_INSTANCES:
        raise TrnctlError(f"--count {count} is outside 1 to {MAX_INSTANCES} (one Capacity Block)")
    wanted = {"InstanceType": instance_type, "InstanceCount": count}
    return _offerings(ec2, wanted, days, start_after)


def find_ultraservers(
    ec2: Any,
    *,
    ultraserver_type: str,
    count: int,
    days: int,
    start_after: datetime | None = None,
) -> list[Offering]:
    """UltraServer Capacity Block offerings for ``count`` UltraServers of ``ultraserver_type``
    over ``days`` days, cheapest per instance-hour first. The request carries
    ``UltraserverType`` and ``UltraserverCount`` instead of an instance type and count.

    Raises:
        TrnctlError: an UltraServer type no source confirms (the message says why), ``count``
            under 1 or ``days`` not an allowed duration (USAGE).
        botocore.exceptions.ClientError: EC2 refused the call.
    """
    try:
        ultraservers.get(ultraserver_type)
    except ultraservers.UnconfirmedUltraServerError as error:
        raise TrnctlError(f"--ultraserver-type: {error}") from None
    if count < 1:
        raise TrnctlError(f"--ultraserver-count {count} is not allowed; at least 1 UltraServer")
    wanted = {"UltraserverType": ultraserver_type, "UltraserverCount": count}
    return _offerings(ec2, wanted, days, start_after)


def _offerings(
    ec2: Any, wanted: dict[str, Any], days: int, start_after: datetime | None
) -> list[Offering]:
    """``DescribeCapacityBlockOfferings`` for ``wanted`` (instances or UltraServers), every
    page, cheapest per instance-hour first."""
    params: dict[str, Any] = {**wanted, "CapacityDurationHours": duration_hours(days)}
    if start_after is not None:
        params["StartDateRange"] = _utc(start_after)
    pages = ec2.get_paginator("describe_capacity_block_offerings").paginate(**params)
    offerings = [Offering.from_api(o) for page in pages for o in page["CapacityBlockOfferings"]]
    return sorted(offerings, key=lambda o: (o.per_instance_hour, o.start, o.offering_id))


def ultraserver_deploy_flags(
    *, region: str, availability_zone: str, ultraserver_type: str, reservation_ids: list[str]
) -> str:
    """The ``cdk deploy`` context flags that launch one node group per UltraServer block, in
    the region asked (see :func:`deploy_flags`)."""
    spec = ultraservers.get(ultraserver_type)
    return (
        f"-c region={region} -c availability_zone={availability_zone} "
        f"-c instance_type={spec.instance_type} "
        f"-c ultraserver_reservation_ids={','.join(reservation_ids)}"
    )


def ultraserver_type_of(response: dict[str, Any]) -> str | None:
    """The UltraServer type a purchase bought (its ``CapacityBlocks`` name it), or None for an
    instance Capacity Block."""
    kinds = sorted(
        {
            b["UltraserverType"]
            for b in response.get("CapacityBlocks") or []
            if b.get("UltraserverType")
        }
    )
    return kinds[0] if kinds else None


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def deploy_flags(
    *,
    region: str,
    availability_zone: str,
    instance_type: str,
    count: int | str,
    reservation_id: str,
) -> str:
    """The ``cdk deploy`` context flags that launch the trn node group into the block. The
    region is the one asked (a zone's name need not be its region's plus a letter: Local Zones
    are not); ``count`` is the block's instances, or :data:`COUNT_PLACEHOLDER` where EC2 told
    none."""
    return (
        f"-c region={region} -c availability_zone={availability_zone} "
        f"-c instance_type={instance_type} -c trn_nodes={count} "
        f"-c capacity=capacity-block -c capacity_reservation_id={reservation_id}"
    )


def check_offering_id(offering_id: str) -> None:
    """Raises TrnctlError (USAGE) unless ``offering_id`` looks like ``cb-<hex>``."""
    if not _OFFERING_ID.fullmatch(offering_id):
        raise TrnctlError(
            f"{offering_id!r} is not a Capacity Block offering id (cb- and hexadecimal digits, "
            "as trnctl capacity find prints)"
        )


def dry_run_purchase(ec2: Any, offering_id: str, platform: str = PLATFORM) -> None:
    """Ask EC2 whether the purchase would succeed (DryRunOperation), without buying.

    Raises:
        TrnctlError: the offering id is malformed (USAGE).
        botocore.exceptions.ClientError: the purchase would fail (access denied, offering gone).
    """
    check_offering_id(offering_id)
    try:
        ec2.purchase_capacity_block(
            CapacityBlockOfferingId=offering_id, InstancePlatform=platform, DryRun=True
        )
    except ec2.exceptions.ClientError as error:
        if error.response.get("Error", {}).get("Code") != "DryRunOperation":
            raise


def purchase(ec2: Any, offering_id: str, platform: str = PLATFORM) -> dict[str, Any]:
    """Buy the offering (charged up front, not refundable); returns EC2's answer, whose
    :func:`reservations_of` are one reservation, or one per segment of a segmented offering. The
    same call buys an UltraServer offering (PurchaseCapacityBlock takes only the offering id).

    Raises:
        TrnctlError: the offering id is malformed (USAGE).
        botocore.exceptions.ClientError: EC2 refused the purchase.
    """
    check_offering_id(offering_id)
    response: dict[str, Any] = ec2.purchase_capacity_block(
        CapacityBlockOfferingId=offering_id, InstancePlatform=platform
    )
    return response


def block_instance_count(reservation: dict[str, Any]) -> int | None:
    """How many instances a Capacity Block reservation holds, or None where EC2 says neither:
    ``TotalInstanceCount``, which EC2 gives as 0 until the block starts, else the count it keeps
    in the tag :data:`REQUESTED_QUANTITY_TAG` (EC2 User Guide, "View Capacity Blocks")."""
    total = int(reservation.get("TotalInstanceCount") or 0)
    if total:
        return total
    tags = {tag.get("Key"): tag.get("Value", "") for tag in reservation.get("Tags") or []}
    requested = tags.get(REQUESTED_QUANTITY_TAG, "")
    return int(requested) if requested.isdigit() and int(requested) else None


def reservations_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A purchase's CapacityReservations (the list, or the single one older answers carry)."""
    reservations: list[dict[str, Any]] = response.get("CapacityReservations") or [
        response["CapacityReservation"]
    ]
    return reservations


def _tags(reservation: dict[str, Any]) -> dict[str, str]:
    return {tag.get("Key", ""): tag.get("Value", "") for tag in reservation.get("Tags") or []}


def recorded_rate(reservation: dict[str, Any]) -> float | None:
    """The USD per instance-hour :data:`RATE_TAG` records on a reservation, or None (no tag, or
    not a number above 0)."""
    try:
        rate = float(_tags(reservation).get(RATE_TAG, ""))
    except ValueError:
        return None
    return rate if 0 < rate < float("inf") else None


def rate_of_purchase(reservations: list[dict[str, Any]], upfront_fee: Decimal) -> Decimal | None:
    """A purchase's USD per instance-hour: ``upfront_fee`` over the instance-hours of all its
    reservations (a segmented offering makes one per segment); None where EC2 gives a count or
    dates of none of them."""
    hours = Decimal(0)
    for reservation in reservations:
        count = block_instance_count(reservation)
        start, end = reservation.get("StartDate"), reservation.get("EndDate")
        if count is None or start is None or end is None:
            return None
        hours += count * Decimal((end - start).total_seconds()) / 3600
    return upfront_fee / hours if hours > 0 else None


def record_rate(ec2: Any, reservations: list[dict[str, Any]], rate: Decimal) -> None:
    """Tags every reservation with :data:`RATE_TAG` (USD per instance-hour, 6 significant
    digits).

    Raises:
        botocore.exceptions.ClientError: EC2 refused the tags.
    """
    ec2.create_tags(
        Resources=[r["CapacityReservationId"] for r in reservations],
        Tags=[{"Key": RATE_TAG, "Value": f"{rate:.6g}"}],
    )
