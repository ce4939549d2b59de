"""Preflight: can this account launch ``count`` instances of a type in one availability zone?

Each check returns a :class:`Check` with a concrete fix when it fails. The catalog
(:mod:`trn_catalog`) says what the platform expects of the type; EC2 and Service Quotas say what
the account in that region actually has.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from botocore.exceptions import ClientError

import trn_catalog
from trn_catalog import InstanceSpec, registries, ultraservers
from trn_catalog import devices as device_modes
from trn_catalog.outputs import EnvironmentOutputs
from trnctl.capacity import block_instance_count

# "Running On-Demand Trn instances", counted in vCPUs. The code is the one public infrastructure
# repositories use (docs/platform-facts.md, "Deployment pins"); no AWS page lists it, so the
# check prints the quota name that Service Quotas returns for it.
TRN_ON_DEMAND_QUOTA_CODE = "L-2C3B7624"
TRN_ON_DEMAND_QUOTA_NAME = "Running On-Demand Trn instances"
QUOTA_SOURCE = "quota code from public infrastructure repos (no AWS page found)"
# Sorts a reservation EC2 gives no StartDate (the field is optional in its model) after those
# whose start is known.
_UNKNOWN_START = datetime.max.replace(tzinfo=UTC)


class Status(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Check:
    """One preflight result; ``fix`` says what to do when ``status`` is not PASS."""

    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Request:
    region: str
    availability_zone: str
    instance_type: str
    count: int


def check_catalog(instance_type: str) -> tuple[Check, InstanceSpec | None]:
    """Whether the catalog lists the type (the platform cannot deploy a type it does not know)."""
    try:
        spec = trn_catalog.get(instance_type)
    except trn_catalog.UnknownInstanceTypeError as error:
        return (
            Check(
                "catalog",
                Status.FAIL,
                str(error),
                "add the type with its sources to trn_catalog/instances.py, or pick a listed type",
            ),
            None,
        )
    note = f"; unverified: {', '.join(sorted(spec.unverified))}" if spec.unverified else ""
    return Check("catalog", Status.PASS, f"{instance_type} is in the catalog{note}"), spec


def check_region_offering(ec2: Any, request: Request) -> Check:
    """Whether EC2 offers the type in the region at all (DescribeInstanceTypeOfferings, location
    type ``region``). When it does not, the fix names the catalog's best type the region does
    offer, with the flags that deploy it: trn3 names are unverified and trn3 is not offered
    everywhere trn2 is."""
    offered = _offerings(ec2, [_type_filter(request.instance_type)], "region")
    if request.region in offered:
        return Check(
            "offered in region",
            Status.PASS,
            f"{request.instance_type} is offered in {request.region}",
        )
    spec = trn_catalog.CATALOG.get(request.instance_type)
    unverified = (
        " (the catalog marks the name unverified)"
        if spec is not None and "name" in spec.unverified
        else ""
    )
    detail = f"EC2 offers no {request.instance_type} in {request.region}{unverified}"
    instead = _alternative(ec2, request)
    if instead is None:
        fix = f"no type of the instance catalog is offered in {request.region}; try another region"
    else:
        fix = _deploy_instead(ec2, request, instead)
    return Check("offered in region", Status.FAIL, detail, fix)


def _deploy_instead(ec2: Any, request: Request, instead: str) -> str:
    """The flags that deploy ``instead`` in a zone that offers it (the requested zone if it
    does), and the preflight to run first."""
    zones = sorted(_offerings(ec2, [_type_filter(instead)], "availability-zone"))
    zone = request.availability_zone
    if zones and zone not in zones:
        zone = zones[0]
    return (
        f"deploy {instead} instead (offered in {', '.join(zones)}): npx cdk deploy --all "
        f"-c region={request.region} -c availability_zone={zone} -c instance_type={instead} "
        f"(with your other -c settings); check it first: trnctl preflight --region "
        f"{request.region} --az {zone} --instance-type {instead} --count {request.count}"
    )


def _alternative(ec2: Any, request: Request) -> str | None:
    """The catalog type to deploy where ``request``'s is not offered: of the plain types (not an
    UltraServer's members) the region offers, the newest generation with the most chips."""
    plain = [
        spec
        for name, spec in trn_catalog.CATALOG.items()
        if name != request.instance_type and ultraservers.for_instance_type(name) is None
    ]
    offered = _offered_types(ec2, [spec.name for spec in plain])
    ranked = sorted(
        (spec for spec in plain if spec.name in offered),
        key=lambda spec: (spec.generation, spec.chips),
        reverse=True,
    )
    return ranked[0].name if ranked else None


def _offered_types(ec2: Any, types: list[str]) -> set[str]:
    """Which of ``types`` EC2 offers in the client's region."""
    paginator = ec2.get_paginator("describe_instance_type_offerings")
    pages = paginator.paginate(
        LocationType="region", Filters=[{"Name": "instance-type", "Values": types}]
    )
    return {o["InstanceType"] for page in pages for o in page["InstanceTypeOfferings"]}


def _type_filter(instance_type: str) -> dict[str, Any]:
    return {"Name": "instance-type", "Values": [instance_type]}


def check_offering(ec2: Any, request: Request) -> Check:
    """Whether EC2 offers the type in the availability zone; the fix names the zones that do."""
    offered = _offerings(ec2, [_type_filter(request.instance_type)], "availability-zone")
    if request.availability_zone in offered:
        return Check(
            "offered in AZ",
            Status.PASS,
            f"{request.instance_type} is offered in {request.availability_zone}",
        )
    if offered:
        fix = (
            f"use one of {', '.join(sorted(offered))} "
            f"(--az here, -c availability_zone=... at deploy)"
        )
    else:
        fix = (
            f"{request.instance_type} is offered in no zone of {request.region}; try another region"
        )
    return Check(
        "offered in AZ",
        Status.FAIL,
        f"{request.instance_type} is not offered in {request.availability_zone}",
        fix,
    )


def _offerings(ec2: Any, filters: list[dict[str, Any]], location_type: str) -> set[str]:
    """The locations (regions or zones, by ``location_type``) where EC2 offers what ``filters``
    select."""
    paginator = ec2.get_paginator("describe_instance_type_offerings")
    pages = paginator.paginate(LocationType=location_type, Filters=filters)
    return {o["Location"] for page in pages for o in page["InstanceTypeOfferings"]}


# The images the platform pulls from the region's EKS registry (constructs_lib.plugins).
EKS_IMAGES = (registries.EFA_DEVICE_PLUGIN_IMAGE, registries.DRANET_IMAGE)


def check_eks_images(ecr: Any, region: str) -> Check:
    """Whether the region's EKS registry holds the EFA device plugin and aws-dranet images at
    the pinned charts' tags (ECR BatchGetImage, as a node's pull asks): the platform pulls them
    from there, and the EKS user guide says EKS replicates its registry's images to each region
    it runs in without naming these two. A registry this identity may not read warns."""
    account = registries.EKS_REGISTRY_ACCOUNTS.get(region)
    if account is None:
        return Check(
            "EKS images in region",
            Status.FAIL,
            f"no EKS registry of {region} in trn_catalog/registries.py",
            f"add its account from {registries.GUIDE}",
        )
    missing, unreadable = _missing_images(ecr, account)
    registry = registries.eks_registry(region)
    if missing:
        return Check(
            "EKS images in region",
            Status.FAIL,
            f"{registry} lacks {', '.join(missing)}",
            "the EFA device plugin or aws-dranet would not start there: deploy in a region "
            "whose EKS registry has them",
        )
    if unreadable:
        return Check(
            "EKS images in region",
            Status.WARN,
            f"could not read {', '.join(unreadable)} from {registry}",
            "grant this identity ecr:BatchGetImage to check (the nodes pull with their role)",
        )
    names = ", ".join(f"{i.repository}:{i.tag}" for i in EKS_IMAGES)
    return Check("EKS images in region", Status.PASS, f"{registry} has {names}")


def _missing_images(ecr: Any, account: str) -> tuple[list[str], list[str]]:
    """The images of :data:`EKS_IMAGES` the registry lacks and those it would not show, each
    with ECR's reason."""
    missing: list[str] = []
    unreadable: list[str] = []
    for image in EKS_IMAGES:
        name = f"{image.repository}:{image.tag}"
        try:
            answer = ecr.batch_get_image(
                registryId=account,
                repositoryName=image.repository,
                imageIds=[{"imageTag": image.tag}],
            )
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "?")
            if code == "RepositoryNotFoundException":
                missing.append(f"{name} ({code})")
            else:
                unreadable.append(f"{name} ({code})")
            continue
        if not answer.get("images"):
            reasons = ", ".join(f.get("failureCode", "?") for f in answer.get("failures", []))
            missing.append(f"{name} ({reasons or 'no image'})")
    return missing, unreadable


def describe_type(ec2: Any, instance_type: str) -> dict[str, Any] | None:
    """EC2's description of the type in the client's region, or None when EC2 does not know it."""
    try:
        types = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
    except ec2.exceptions.ClientError as error:
        if error.response.get("Error", {}).get("Code") == "InvalidInstanceType":
            return None
        raise
    return types[0] if types else None


def check_network(
    described: dict[str, Any] | None, spec: InstanceSpec | None, request: Request
) -> list[Check]:
    """EFA support, EFA interface count and network card count against the catalog.

    The catalog's counts become the node group's launch template, so a mismatch means nodes
    whose EFA interfaces are missing or unused.
    """
    if described is None:
        return [
            Check(
                "EC2 knows type",
                Status.FAIL,
                f"EC2 in {request.region} does not know {request.instance_type}",
                "check the type name (the catalog marks unconfirmed names as unverified) and "
                "the region",
            )
        ]
    network = described.get("NetworkInfo", {})
    efa_supported = bool(network.get("EfaSupported"))
    efa_interfaces = int(network.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0))
    cards = int(network.get("MaximumNetworkCards", 1))
    checks = [
        Check(
            "EFA support",
            Status.PASS if efa_supported else Status.FAIL,
            f"EfaSupported={efa_supported}",
            "" if efa_supported else "multi-node training needs an EFA-capable type",
        )
    ]
    if spec is None:
        return checks
    checks.append(
        _compare(
            "EFA interfaces",
            efa_interfaces,
            spec.efa_interfaces,
            spec,
            "efa_interfaces",
            request,
        )
    )
    checks.append(
        _compare("network cards", cards, spec.network_cards, spec, "network_cards", request)
    )
    return checks


def _compare(
    name: str, actual: int, expected: int, spec: InstanceSpec, fact: str, request: Request
) -> Check:
    unverified = " (catalog value unverified)" if fact in spec.unverified else ""
    detail = f"EC2: {actual}, catalog: {expected}{unverified}"
    if actual == expected:
        return Check(name, Status.PASS, detail)
    return Check(
        name,
        Status.FAIL,
        detail,
        f"set {fact}={actual} for {spec.name} in trn_catalog/instances.py, citing "
        f"ec2:DescribeInstanceTypes in {request.region}",
    )


def vcpus_of(described: dict[str, Any] | None, spec: InstanceSpec | None) -> int | None:
    """The type's vCPUs: EC2's figure when it has one, else the catalog's, else None."""
    if described is not None:
        return int(described["VCpuInfo"]["DefaultVCpus"])
    return spec.vcpus if spec is not None else None


def check_quota(quotas: Any, request: Request, vcpus: int | None) -> Check:
    """The account's Trn On-Demand vCPU quota against ``count`` instances of ``vcpus`` each.

    Falls back to the AWS default value when the account has no applied value.
    """
    code = TRN_ON_DEMAND_QUOTA_CODE
    try:
        quota = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
    except quotas.exceptions.NoSuchResourceException:
        quota = quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
    limit = int(quota["Value"])
    label = f"{code} {quota.get('QuotaName', TRN_ON_DEMAND_QUOTA_NAME)!r}"
    if vcpus is None:
        return Check(
            "On-Demand vCPU quota",
            Status.WARN,
            f"{label} = {limit} vCPUs; vCPUs per instance unknown",
            "confirm the type name, then rerun",
        )
    needed = vcpus * request.count
    detail = (
        f"{label} = {limit} vCPUs; {request.count} x {vcpus} = {needed} needed "
        f"(running Trn instances use the same quota; {QUOTA_SOURCE})"
    )
    if limit >= needed:
        return Check("On-Demand vCPU quota", Status.PASS, detail)
    return Check(
        "On-Demand vCPU quota",
        Status.FAIL,
        detail,
        f"aws service-quotas request-service-quota-increase --region {request.region} "
        f"--service-code ec2 --quota-code {code} --desired-value {needed}",
    )


def check_reservations(ec2: Any, request: Request) -> Check:
    """Active or scheduled capacity reservations (ODCRs and Capacity Blocks) for the type in the
    zone: a PASS for an active one with ``count`` free, or a scheduled Capacity Block of at least
    ``count`` (a node group deployed into it launches when it starts; until then EC2 gives its
    size only in a tag, :func:`trnctl.capacity.block_instance_count`). A WARN, not a FAIL, when
    none covers ``count``: On-Demand capacity may still suffice."""
    paginator = ec2.get_paginator("describe_capacity_reservations")
    pages = paginator.paginate(
        Filters=[
            {"Name": "instance-type", "Values": [request.instance_type]},
            {"Name": "availability-zone", "Values": [request.availability_zone]},
            {"Name": "state", "Values": ["active", "scheduled"]},
        ]
    )
    reservations = [r for page in pages for r in page["CapacityReservations"]]
    summary = "; ".join(_reservation_summary(r) for r in reservations)
    # Capacity to use now before a block that starts later, and the sooner block first.
    usable = sorted(
        (r for r in reservations if _covers(r, request.count)),
        key=lambda r: (r["State"] != "active", r.get("StartDate") or _UNKNOWN_START),
    )
    if usable:
        best = usable[0]
        mode = "capacity-block" if best.get("ReservationType") == "capacity-block" else "odcr"
        return Check(
            "capacity reservations",
            Status.PASS,
            f"{summary}; deploy with -c capacity={mode} "
            f"-c capacity_reservation_id={best['CapacityReservationId']}",
        )
    return Check(
        "capacity reservations",
        Status.WARN,
        summary or f"none for {request.instance_type} in {request.availability_zone}",
        f"trnctl capacity find --instance-type {request.instance_type} "
        f"--count {request.count} --days 1",
    )


def _reservation_summary(reservation: dict[str, Any]) -> str:
    head = (
        f"{reservation['CapacityReservationId']} {reservation.get('ReservationType', 'default')} "
        f"{reservation['State']}"
    )
    if reservation["State"] == "scheduled" and reservation.get("ReservationType") == (
        "capacity-block"
    ):
        count = block_instance_count(reservation)
        start = reservation.get("StartDate")
        when = "?" if start is None else f"{start.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
        return (
            f"{head}: {'?' if count is None else count} x {reservation['InstanceType']} from {when}"
        )
    return (
        f"{head} {reservation['AvailableInstanceCount']}/{reservation['TotalInstanceCount']} free"
    )


def _covers(reservation: dict[str, Any], count: int) -> bool:
    if reservation["State"] == "active":
        return bool(reservation["AvailableInstanceCount"] >= count)
    if reservation.get("ReservationType") != "capacity-block":
        return False
    return (block_instance_count(reservation) or 0) >= count


def run(ec2: Any, quotas: Any, request: Request) -> list[Check]:
    """All checks, in the order a reader fixes them.

    Raises:
        botocore.exceptions.ClientError: an AWS call failed (access denied, throttling).
    """
    catalog_check, spec = check_catalog(request.instance_type)
    described = describe_type(ec2, request.instance_type)
    return [
        catalog_check,
        check_region_offering(ec2, request),
        check_offering(ec2, request),
        *check_network(described, spec, request),
        check_quota(quotas, request, vcpus_of(described, spec)),
        check_reservations(ec2, request),
    ]


def check_zone(outputs: EnvironmentOutputs, request: Request) -> Check:
    """Whether ``request``'s zone is the environment's trn zone, which cannot move once deployed
    (its subnets, exports and FSx stay in it; docs/deploying.md, "Moving the trn zone"). Outputs
    written before they named the zone give a warning."""
    deployed, wanted = outputs.availability_zone, request.availability_zone
    if not deployed:
        return Check(
            "trn zone",
            Status.WARN,
            f"the outputs of {outputs.environment} predate the zone key",
            "redeploy its workloads stack to record the zone",
        )
    if deployed == wanted:
        return Check(
            "trn zone", Status.PASS, f"{outputs.environment} runs its trn nodes in {wanted}"
        )
    return Check(
        "trn zone",
        Status.FAIL,
        f"{outputs.environment} runs its trn nodes in {deployed}; {wanted} would move them, and a "
        "deployed environment's zones cannot move",
        f"deploy a new environment in {wanted} (a preview: -c preview=<project> "
        f"-c availability_zone={wanted}; or destroy {outputs.environment} and deploy it again "
        "there), move its data (docs/deploying.md, Moving the trn zone), then destroy the old one",
    )


def check_devices(outputs: EnvironmentOutputs) -> list[Check]:
    """How the environment's trn nodes get their devices and their logical NeuronCore setting,
    from its outputs: ``devices`` (``plugin`` or ``dra``) and, on the plugin path, the nodes'
    LNC; a mode or LNC the instance type cannot run fails."""
    spec = trn_catalog.CATALOG.get(outputs.instance_type)
    if spec is None:
        return [
            Check(
                "device management",
                Status.FAIL,
                f"{outputs.instance_type} is not in the catalog",
                "redeploy with a catalog type",
            )
        ]
    if outputs.devices == "dra":
        return _dra_checks(spec)
    if outputs.devices != "plugin":
        return [
            Check(
                "device management",
                Status.FAIL,
                f"unknown mode {outputs.devices!r} in the environment's outputs",
                "redeploy the workloads stack with this platform version",
            )
        ]
    lnc = outputs.lnc or spec.default_lnc
    mode = Check(
        "device management",
        Status.PASS,
        "plugin: Neuron and EFA device plugins (aws.amazon.com/neuron, vpc.amazonaws.com/efa)",
    )
    if not device_modes.supports_lnc(spec):
        return [mode, Check("LNC", Status.PASS, f"none on {spec.name}: one rank per NeuronCore")]
    problem = device_modes.lnc_problem(spec, lnc)
    if problem:
        return [mode, Check("LNC", Status.FAIL, problem, "redeploy with -c lnc=1 or -c lnc=2")]
    ranks = device_modes.logical_cores(spec, lnc)
    return [
        mode,
        Check(
            "LNC",
            Status.PASS,
            f"{lnc} on every node (node group setting): {ranks} ranks per node",
        ),
    ]


def _dra_checks(spec: InstanceSpec) -> list[Check]:
    if not device_modes.supports_dra(spec):
        return [
            Check(
                "device management",
                Status.FAIL,
                f"dra, but the Neuron DRA driver does not serve {spec.name}",
                "redeploy with -c devices=plugin, or a trn2/trn3 type",
            )
        ]
    per_lnc = ", ".join(
        f"{lnc} ({device_modes.logical_cores(spec, lnc)} ranks per node, runtime "
        f"{device_modes.runtime_name(spec, lnc)})"
        for lnc in device_modes.LNC_VALUES
    )
    return [
        Check(
            "device management",
            Status.PASS,
            f"dra: Neuron DRA driver and aws-dranet (DeviceClasses "
            f"{device_modes.NEURON_DEVICE_CLASS}, {device_modes.EFA_DEVICE_CLASS}); the Neuron "
            "DRA driver is beta",
        ),
        Check(
            "LNC",
            Status.PASS,
            f"per job (trnctl job submit --lnc): {per_lnc}; default {spec.default_lnc}",
        ),
    ]


def failed(checks: list[Check]) -> bool:
    return any(c.status is Status.FAIL for c in checks)


def check_nodes(outputs: EnvironmentOutputs, nodes: dict[str, dict[str, str]]) -> list[Check]:
    """What the trn nodes' own labels say (``nodes``: name -> labels), against the
    environment's outputs: their device-management mode and LNC (``trn-platform/devices``,
    ``trn-platform/lnc``) and, with UltraServer blocks, their UltraServers."""
    if not nodes:
        return [
            Check(
                "node labels",
                Status.WARN,
                f"no trn node of {outputs.environment} has joined the cluster",
                "wait for the node group (a Capacity Block joins nodes from its start)",
            )
        ]
    spec = trn_catalog.CATALOG.get(outputs.instance_type)
    lnc = outputs.lnc or (spec.default_lnc if spec else 0)
    wanted_lnc = device_modes.LNC_PER_JOB if outputs.devices == "dra" else str(lnc)
    checks = [
        _label_check(nodes, "devices on the nodes", device_modes.DEVICES_LABEL, outputs.devices),
        _label_check(nodes, "LNC on the nodes", device_modes.LNC_LABEL, wanted_lnc),
    ]
    if outputs.ultraserver_type or any(
        ultraservers.ULTRASERVER_ID_LABEL in v for v in nodes.values()
    ):
        checks.append(check_ultraservers(outputs, nodes))
        checks.append(check_neuron_ultraserver_labels(outputs, nodes))
    return checks


def _label_check(nodes: dict[str, dict[str, str]], name: str, label: str, wanted: str) -> Check:
    wrong = {
        n: labels.get(label, "(none)") for n, labels in nodes.items() if labels.get(label) != wanted
    }
    if not wrong:
        return Check(name, Status.PASS, f"{label}={wanted} on all {len(nodes)} nodes")
    found = ", ".join(f"{n}: {value}" for n, value in sorted(wrong.items()))
    return Check(
        name,
        Status.FAIL,
        f"{label} differs from the environment's outputs ({wanted}) on {found}",
        "the node group and the workloads stack are from different deploys: cdk deploy --all",
    )


def ultraservers_of(nodes: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """UltraServer id -> its nodes, from the nodes' ``trn-platform/ultraserver-id`` labels."""
    found: dict[str, list[str]] = {}
    for name, labels in sorted(nodes.items()):
        if ultraservers.ULTRASERVER_ID_LABEL in labels:
            found.setdefault(labels[ultraservers.ULTRASERVER_ID_LABEL], []).append(name)
    return found


def check_neuron_ultraserver_labels(
    outputs: EnvironmentOutputs, nodes: dict[str, dict[str, str]]
) -> Check:
    """Whether the Neuron docs' UltraServer labels agree with the platform's: the nodes of each
    UltraServer block share one Neuron server id and hold distinct node ids. This checks, on a
    deployed cluster, that one block is one UltraServer. Labels on no node warn (nothing set
    them; jobs still place by ``trn-platform/ultraserver-id``); a block over several Neuron
    server ids, or two nodes of one position, fails."""
    name = "Neuron UltraServer labels"
    servers = _servers_or_failure(outputs, name)
    if isinstance(servers, Check):
        return servers
    server_label = ultraservers.NEURON_SERVER_ID_LABEL.format(servers=servers)
    node_label = ultraservers.NEURON_NODE_ID_LABEL.format(servers=servers)
    blocks = ultraservers_of(nodes)
    members = [n for names in blocks.values() for n in names]
    if not any(server_label in nodes[n] for n in members):
        return Check(
            name,
            Status.WARN,
            f"{server_label} is on none of the {len(members)} UltraServer nodes",
            "the Neuron device plugin (2.30.0.0 or later, per the Neuron UltraServer guide) "
            "is expected to set it; jobs place by trn-platform/ultraserver-id meanwhile",
        )
    problems = [
        problem
        for uid, names in blocks.items()
        for problem in _block_problems(uid, names, nodes, server_label, node_label)
    ]
    if problems:
        return Check(
            name,
            Status.FAIL,
            "; ".join(problems),
            "a Capacity Block that is not one UltraServer: check the reservation with "
            "aws ec2 describe-instance-topology",
        )
    return Check(
        name, Status.PASS, f"each UltraServer block is one {server_label} with distinct node ids"
    )


def _servers_or_failure(outputs: EnvironmentOutputs, name: str) -> int | Check:
    """The servers of the environment's UltraServer type, or the failed check ``name`` that
    says why the type is not one the catalog confirms."""
    try:
        return ultraservers.get(outputs.ultraserver_type).servers
    except ultraservers.UnconfirmedUltraServerError as error:
        return Check(name, Status.FAIL, str(error), "redeploy with a confirmed type")


def _block_problems(
    uid: str,
    names: list[str],
    nodes: dict[str, dict[str, str]],
    server_label: str,
    node_label: str,
) -> list[str]:
    server_ids = sorted({nodes[n].get(server_label, "(none)") for n in names})
    node_ids = [nodes[n].get(node_label, "(none)") for n in names]
    problems = []
    if len(server_ids) > 1:
        problems.append(f"{uid} spans {server_label} {', '.join(server_ids)}")
    twice = sorted({i for i in node_ids if node_ids.count(i) > 1})
    if twice:
        problems.append(f"{uid} has {node_label} {', '.join(twice)} on more than one node")
    return problems


def check_ultraservers(outputs: EnvironmentOutputs, nodes: dict[str, dict[str, str]]) -> Check:
    """The UltraServers the nodes belong to and their node counts, against the outputs' ids and
    the UltraServer type's servers: a full UltraServer passes, a short or missing one warns, a
    node of an UltraServer the environment does not list fails."""
    found = ultraservers_of(nodes)
    listed = outputs.ultraserver_id_list
    servers = _servers_or_failure(outputs, "UltraServers")
    if isinstance(servers, Check):
        return servers
    detail = "; ".join(
        f"{uid}: {len(found.get(uid, []))}/{servers} nodes"
        for uid in [*listed, *sorted(set(found) - set(listed))]
    )
    unknown = sorted(set(found) - set(listed))
    if unknown:
        return Check(
            "UltraServers",
            Status.FAIL,
            f"{detail}; not in the environment's outputs: {', '.join(unknown)}",
            "the node groups and the workloads stack are from different deploys: cdk deploy --all",
        )
    short = [uid for uid in listed if len(found.get(uid, [])) < servers]
    if short:
        return Check(
            "UltraServers",
            Status.WARN,
            f"{outputs.ultraserver_type} x {len(listed)}: {detail}",
            f"not yet full: {', '.join(short)} (a block joins its nodes from its start)",
        )
    return Check(
        "UltraServers", Status.PASS, f"{outputs.ultraserver_type} x {len(listed)}: {detail}"
    )
