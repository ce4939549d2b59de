"""What a job cost: each node's hours for the job (its pods' start to end) times that node's
rate, a reservation's idle share apart. Pure functions over what the Kubernetes API and EC2
answer; the command in :mod:`trnctl.commands.job` asks them.

A node's rate follows how EC2 bills it: On-Demand, and an On-Demand Capacity Reservation, at the
type's On-Demand rate; a Capacity Block at its own price, which EC2's reservation carries in the
tag :data:`trnctl.capacity.RATE_TAG` when ``trnctl capacity buy`` bought it (EC2 does not return
the price of a purchased block: DescribeCapacityReservations and DescribeCapacityBlocks have no
fee field), else ``--price TYPE:cb=USD``, else the catalog's. A reservation is paid for whether
it is used or not: over the job's window, the reserved instance-hours its nodes did not spend on
the job are its idle share, shown apart from the job's own cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trn_catalog import prices
from trnctl import capacity, compare
from trnctl.compare import Rate

SECONDS_PER_HOUR = 3600
# EC2's InstanceLifecycle of an instance in a Capacity Block (botocore's InstanceLifecycleType).
CAPACITY_BLOCK_LIFECYCLE = "capacity-block"


@dataclass(frozen=True)
class Span:
    """One pod of the job on one node, from its start to its end (now while it runs)."""

    pod: str
    node: str
    start: datetime
    end: datetime
    running: bool

    @property
    def hours(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds()) / SECONDS_PER_HOUR


def spans(pods: Iterable[Any], now: datetime) -> list[Span]:
    """The spans of pods (``V1Pod``) that started on a node: from ``status.start_time`` to the
    last container's ``finished_at``, or ``now`` while one still runs. Pods not yet scheduled or
    started cost nothing and are left out."""
    found = []
    for pod in pods:
        status, spec = pod.status, pod.spec
        node = spec.node_name if spec else None
        start = status.start_time if status else None
        if not node or start is None:
            continue
        ends = []
        running = False
        for container in (status.container_statuses or []) if status else []:
            state = container.state
            if state is not None and state.terminated is not None:
                ends.append(state.terminated.finished_at or now)
            else:
                running = True
        end = now if running or not ends else max(ends)
        found.append(Span(pod.metadata.name, node, start, end, running))
    return found


def instance_id(provider_id: str | None) -> str | None:
    """The EC2 instance id of a node's ``spec.providerID`` (``aws:///us-east-2a/i-0abc...``)."""
    if not provider_id or not provider_id.startswith("aws://"):
        return None
    last = provider_id.rstrip("/").rsplit("/", 1)[-1]
    return last if last.startswith("i-") else None


@dataclass(frozen=True)
class Instance:
    """What EC2 says of a node's instance."""

    instance_id: str
    instance_type: str
    reservation_id: str | None
    capacity_block: bool

    @classmethod
    def from_api(cls, item: Mapping[str, Any]) -> Instance:
        return cls(
            instance_id=item["InstanceId"],
            instance_type=item["InstanceType"],
            reservation_id=item.get("CapacityReservationId") or None,
            capacity_block=item.get("InstanceLifecycle") == CAPACITY_BLOCK_LIFECYCLE,
        )

    @property
    def capacity(self) -> str:
        """``capacity-block``, ``odcr`` (an On-Demand Capacity Reservation) or ``on-demand``."""
        if self.capacity_block:
            return "capacity-block"
        return "odcr" if self.reservation_id else "on-demand"


def describe_instances(ec2: Any, ids: Sequence[str]) -> dict[str, Instance]:
    """The instances of ``ids`` by id (every page)."""
    found = {}
    pages = ec2.get_paginator("describe_instances").paginate(InstanceIds=list(ids))
    for page in pages:
        for reservation in page["Reservations"]:
            for item in reservation["Instances"]:
                found[item["InstanceId"]] = Instance.from_api(item)
    return found


@dataclass(frozen=True)
class Reservation:
    """What EC2 says of a capacity reservation the job's nodes ran in."""

    reservation_id: str
    instance_type: str
    instances: int | None
    capacity_block: bool
    start: datetime | None
    end: datetime | None
    usd_per_hour: float | None

    @classmethod
    def from_api(cls, item: Mapping[str, Any]) -> Reservation:
        return cls(
            reservation_id=item["CapacityReservationId"],
            instance_type=item["InstanceType"],
            instances=capacity.block_instance_count(dict(item)),
            capacity_block=item.get("ReservationType") == "capacity-block",
            start=item.get("StartDate"),
            end=item.get("EndDate"),
            usd_per_hour=capacity.recorded_rate(dict(item)),
        )


def describe_reservations(ec2: Any, ids: Sequence[str]) -> dict[str, Reservation]:
    """The capacity reservations of ``ids`` by id (none asked: none)."""
    if not ids:
        return {}
    found = {}
    pages = ec2.get_paginator("describe_capacity_reservations").paginate(
        CapacityReservationIds=list(ids)
    )
    for page in pages:
        for item in page["CapacityReservations"]:
            found[item["CapacityReservationId"]] = Reservation.from_api(item)
    return found


def block_rate(reservation: Reservation) -> Rate | None:
    """A Capacity Block's rate from its reservation's :data:`trnctl.capacity.RATE_TAG`."""
    if reservation.usd_per_hour is None:
        return None
    return Rate(
        reservation.usd_per_hour,
        f"Capacity Block {reservation.reservation_id}: the price recorded on the reservation "
        "at purchase",
    )


def node_rate(
    instance: Instance,
    reservations: Mapping[str, Reservation],
    region: str | None,
    overrides: Mapping[tuple[str, prices.Market], float],
    live: Mapping[str, float | None],
) -> Rate:
    """The rate a node is billed at (see the module's docstring)."""
    if instance.capacity == "capacity-block":
        reservation = reservations.get(instance.reservation_id or "")
        recorded = block_rate(reservation) if reservation is not None else None
        if recorded is not None:
            return recorded
        return compare.rate_for(instance.instance_type, "capacity-block", region, overrides, live)
    rate = compare.rate_for(instance.instance_type, "on-demand", region, overrides, live)
    if instance.capacity == "odcr":
        return Rate(
            rate.usd_per_hour, f"On-Demand Capacity Reservation, billed On-Demand: {rate.source}"
        )
    return rate


@dataclass(frozen=True)
class NodeCost:
    """One node's hours for the job (overlapping pods counted once) and their cost."""

    node: str
    instance: Instance | None
    hours: float
    rate: Rate

    @property
    def usd(self) -> float | None:
        return None if self.rate.usd_per_hour is None else self.rate.usd_per_hour * self.hours


def merged_hours(intervals: Iterable[tuple[datetime, datetime]]) -> float:
    """Hours covered by ``intervals``, overlaps counted once (a node's retried pods)."""
    total = 0.0
    current: tuple[datetime, datetime] | None = None
    for start, end in sorted(intervals):
        if current is None or start > current[1]:
            if current is not None:
                total += (current[1] - current[0]).total_seconds()
            current = (start, end)
        elif end > current[1]:
            current = (current[0], end)
    if current is not None:
        total += (current[1] - current[0]).total_seconds()
    return total / SECONDS_PER_HOUR


def node_costs(
    job_spans: Sequence[Span],
    instances: Mapping[str, Instance],
    node_instances: Mapping[str, str | None],
    rate_of: Any,
) -> list[NodeCost]:
    """Per node of ``job_spans``: its hours and cost. ``node_instances`` maps a node to its
    instance id; ``rate_of(instance)`` gives an instance's :class:`Rate`."""
    costs = []
    for node in sorted({s.node for s in job_spans}):
        hours = merged_hours((s.start, s.end) for s in job_spans if s.node == node)
        instance = instances.get(node_instances.get(node) or "")
        rate = (
            rate_of(instance)
            if instance is not None
            else Rate(None, f"node {node}: no EC2 instance found (the node is gone)")
        )
        costs.append(NodeCost(node, instance, hours, rate))
    return costs


@dataclass(frozen=True)
class IdleShare:
    """A reservation's instance-hours over the job's window that the job did not use."""

    reservation: Reservation
    reserved_hours: float
    used_hours: float
    rate: Rate

    @property
    def idle_hours(self) -> float:
        return max(0.0, self.reserved_hours - self.used_hours)

    @property
    def usd(self) -> float | None:
        if self.rate.usd_per_hour is None:
            return None
        return self.rate.usd_per_hour * self.idle_hours


def window(job_spans: Sequence[Span]) -> tuple[datetime, datetime] | None:
    """From the job's first pod start to its last pod end; None without pods."""
    if not job_spans:
        return None
    return min(s.start for s in job_spans), max(s.end for s in job_spans)


def idle_shares(
    costs: Sequence[NodeCost],
    reservations: Mapping[str, Reservation],
    job_window: tuple[datetime, datetime] | None,
) -> list[IdleShare]:
    """Per reservation the job's nodes ran in: its instances x the job's window (within the
    reservation's own dates), less the job's hours on it."""
    if job_window is None:
        return []
    shares = []
    used = {c.instance.reservation_id for c in costs if c.instance and c.instance.reservation_id}
    for reservation_id in sorted(i for i in used if i is not None):
        reservation = reservations.get(reservation_id)
        if reservation is None or reservation.instances is None:
            continue
        start = max(job_window[0], reservation.start or job_window[0])
        end = min(job_window[1], reservation.end or job_window[1])
        reserved = (
            reservation.instances * max(0.0, (end - start).total_seconds()) / SECONDS_PER_HOUR
        )
        on_it = [c for c in costs if c.instance and c.instance.reservation_id == reservation_id]
        shares.append(IdleShare(reservation, reserved, sum(c.hours for c in on_it), on_it[0].rate))
    return shares


@dataclass(frozen=True)
class JobCost:
    """A job's cost: per node, the reservations' idle shares, and the totals."""

    job: str
    nodes: list[NodeCost]
    idle: list[IdleShare]
    window: tuple[datetime, datetime] | None
    running: bool

    @property
    def node_hours(self) -> float:
        return sum(n.hours for n in self.nodes)

    @property
    def usd(self) -> float:
        """The job's nodes' cost, nodes without a rate left out (see :attr:`unpriced`)."""
        return sum(n.usd for n in self.nodes if n.usd is not None)

    @property
    def idle_usd(self) -> float:
        return sum(i.usd for i in self.idle if i.usd is not None)

    @property
    def unpriced(self) -> list[NodeCost]:
        return [n for n in self.nodes if n.usd is None]

    def to_json(self) -> dict[str, Any]:
        """Every figure, machine-readable."""
        return {
            "job": self.job,
            "running": self.running,
            "window": None if self.window is None else [t.isoformat() for t in self.window],
            "nodes": [
                {
                    "node": n.node,
                    "instance_id": n.instance.instance_id if n.instance else None,
                    "instance_type": n.instance.instance_type if n.instance else None,
                    "capacity": n.instance.capacity if n.instance else None,
                    "reservation_id": n.instance.reservation_id if n.instance else None,
                    "hours": n.hours,
                    "usd_per_hour": n.rate.usd_per_hour,
                    "price_source": n.rate.source,
                    "usd": n.usd,
                }
                for n in self.nodes
            ],
            "idle": [
                {
                    "reservation_id": i.reservation.reservation_id,
                    "instances": i.reservation.instances,
                    "reserved_hours": i.reserved_hours,
                    "used_hours": i.used_hours,
                    "idle_hours": i.idle_hours,
                    "usd_per_hour": i.rate.usd_per_hour,
                    "usd": i.usd,
                }
                for i in self.idle
            ],
            "node_hours": self.node_hours,
            "usd": self.usd,
            "idle_usd": self.idle_usd,
            "usd_with_idle": self.usd + self.idle_usd,
            "unpriced_nodes": [n.node for n in self.unpriced],
        }
