"""Turn raw CDK context (strings from ``-c key=value`` or JSON values from cdk.json) into a
validated :class:`PlatformConfig`.

Every problem names the context key, the bad value and what is allowed; all problems found are
reported together so that one synth shows the user everything to fix.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

import trn_catalog
from platform_config.model import (
    CAPACITY_MODES,
    PROFILES,
    RESERVATION_MODES,
    CapacityMode,
    EnvName,
    FsxSettings,
    GpuCapacity,
    PlatformConfig,
    Profile,
    TrnCapacity,
)
from trn_catalog import devices as device_modes
from trn_catalog import formats, registries, ultraservers, versions
from trn_catalog import fsx as fsx_limits
from trn_catalog.outputs import MAX_PREVIEW_TTL_HOURS, MODEL_REGISTRIES, PREVIEW_REGIONS

CONTEXT_KEYS: tuple[str, ...] = (
    "account",
    "region",
    "availability_zone",
    "instance_type",
    "trn_nodes",
    "capacity",
    "capacity_reservation_id",
    "env",
    "preview",
    "ttl_hours",
    "fsx_storage_gib",
    "fsx_throughput_per_tib",
    "efa_fsx",
    "admin_role_arn",
    "budget_email",
    "budget_usd",
    "project",
    "gpu_instance_type",
    "gpu_nodes",
    "gpu_capacity",
    "gpu_capacity_reservation_id",
    "devices",
    "lnc",
    "ultraserver_reservation_ids",
    "model_registry",
)
# Keys that size or reserve the one plain trn node group; UltraServer blocks set both instead.
PLAIN_TRN_CAPACITY_KEYS: tuple[str, ...] = ("trn_nodes", "capacity", "capacity_reservation_id")
# Capacity Blocks hold at most 256 instances across blocks (botocore's EC2 model,
# DescribeCapacityBlockOfferings InstanceCount).
MAX_INSTANCES_ACROSS_BLOCKS = 256
GPU_KEYS: tuple[str, ...] = (
    "gpu_instance_type",
    "gpu_nodes",
    "gpu_capacity",
    "gpu_capacity_reservation_id",
)

# Context keys CDK itself writes or reads that have no ':' and no '@aws-cdk/' prefix, as
# aws-cdk-lib 2.275 and the pinned CLI (aws-cdk 2.1148.1, package.json) have them: the CLI's
# `cdk acknowledge` (acknowledged-issue-numbers) and `cdk cli-telemetry` (cli-telemetry) save
# theirs to the project's context, `cdk migrate` writes cdk-migrate into cdk.json, and the legacy
# stack synthesizer reads assets-ecr-repository-name. Every other key of CDK's has a ':' (feature
# flags such as @aws-cdk/core:checkSecretUsage, aws:cdk:* settings the CLI passes to the app,
# aws-cdk:enableDiffNoFail, and the lookups cached in cdk.context.json) or starts with
# '@aws-cdk/' (@aws-cdk/core.slowSynthThreshold, @aws-cdk/aws-iam.arnSizeEstimate, ...).
CDK_PLAIN_CONTEXT_KEYS = frozenset(
    {"acknowledged-issue-numbers", "cli-telemetry", "cdk-migrate", "assets-ecr-repository-name"}
)
CDK_KEY_PREFIX = "@aws-cdk/"

# Offline defaults: a placeholder account (AWS's documentation example) in us-east-2, which
# offers Trn2 today. A real deploy passes -c account=... -c region=... -c availability_zone=...
DEFAULT_ACCOUNT = "123456789012"
DEFAULT_REGION = "us-east-2"
DEFAULT_AVAILABILITY_ZONE = "us-east-2a"
DEFAULT_INSTANCE_TYPE = trn_catalog.DEFAULT_INSTANCE_TYPE
DEFAULT_TTL_HOURS = 48
MAX_BUDGET_USD = 1_000_000
MAX_TRN_NODES = formats.MAX_BLOCK_INSTANCES
MAX_GPU_NODES = formats.MAX_BLOCK_INSTANCES
DEFAULT_GPU_NODES = 1
MAX_TTL_HOURS = MAX_PREVIEW_TTL_HOURS
FSX_MAX_GIB = 2_400_000

_ACCOUNT = re.compile(r"^\d{12}$")
_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$")
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}

T = TypeVar("T")


class ConfigError(ValueError):
    """Raised when the CDK context holds invalid values; ``problems`` lists each one."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(
            "invalid platform configuration:\n" + "\n".join(f"  - {p}" for p in problems)
        )


class _Reader:
    """Reads typed values from raw context and collects problems instead of stopping at one."""

    def __init__(self, context: Mapping[str, Any]) -> None:
        self.context = context
        self.problems: list[str] = []

    def fail(self, key: str, value: Any, allowed: str) -> None:
        shown = "missing" if value is None else f"{value!r} is not allowed"
        self.problems.append(f"{key}: {shown}; {allowed}")

    def raw(self, key: str) -> Any:
        value = self.context.get(key)
        return None if value == "" else value

    def text(self, key: str, default: str | None = None) -> str | None:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, str):
            self.fail(key, value, "expected a string")
            return default
        return value.strip()

    def integer(self, key: str, default: int | None, low: int, high: int) -> int | None:
        value = self.raw(key)
        if value is None:
            return default
        allowed = f"expected a whole number from {low} to {high}"
        if isinstance(value, bool) or not isinstance(value, int | str):
            self.fail(key, value, allowed)
            return default
        if isinstance(value, str) and not re.fullmatch(r"-?\d+", value.strip()):
            self.fail(key, value, allowed)
            return default
        number = int(value)
        if not low <= number <= high:
            self.fail(key, value, allowed)
            return default
        return number

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        self.fail(key, value, "expected true or false")
        return default

    def choice(self, key: str, default: T, options: tuple[T, ...]) -> T:
        value = self.raw(key)
        if value is None:
            return default
        if value not in options:
            self.fail(key, value, f"expected one of: {', '.join(map(str, options))}")
            return default
        return cast(T, value)

    def matching(self, key: str, pattern: re.Pattern[str], allowed: str) -> str | None:
        value = self.text(key)
        if value is not None and not pattern.fullmatch(value):
            self.fail(key, value, allowed)
            return None
        return value

    def check(self, ok: bool, key: str, value: Any, allowed: str) -> None:
        if not ok:
            self.fail(key, value, allowed)


def _unknown_keys(context: Mapping[str, Any]) -> list[str]:
    """Keys that are neither the app's nor CDK's own, each named with the closest key of ours:
    a setting the app does not read must not pass silently (``instance_typ=trn2.48xlarge``
    would otherwise synthesize the default type)."""
    return [
        f"{key}: unknown context key; {_closest(key)}"
        for key in context
        if key not in CONTEXT_KEYS and not is_cdk_context_key(key)
    ]


def is_cdk_context_key(key: str) -> bool:
    """Whether CDK itself sets or reads ``key``: its feature flags and settings (``@aws-cdk/...``,
    ``aws:cdk:...``, ``aws-cdk:enableDiffNoFail``), the lookups the CLI caches in
    cdk.context.json (``availability-zones:account=...:region=...`` and the other providers' keys,
    all with a ':'), and the few plain keys of :data:`CDK_PLAIN_CONTEXT_KEYS`."""
    return ":" in key or key.startswith(CDK_KEY_PREFIX) or key in CDK_PLAIN_CONTEXT_KEYS


def _closest(key: str) -> str:
    folded = {_fold(known): known for known in CONTEXT_KEYS}
    same = folded.get(_fold(key))
    near = same or next(iter(difflib.get_close_matches(key.lower(), CONTEXT_KEYS, n=1)), None)
    if near is not None:
        return f"did you mean {near!r}?"
    return f"the app reads {', '.join(CONTEXT_KEYS)}"


def _fold(key: str) -> str:
    return key.replace("-", "").replace("_", "").lower()


def _profile(reader: _Reader) -> tuple[Profile, str | None]:
    env: EnvName = reader.choice("env", "dev", ("dev", "prod"))
    preview = reader.text("preview")
    if preview is None:
        return PROFILES[env], None
    reader.check(
        bool(formats.PREVIEW_NAME.fullmatch(preview)),
        "preview",
        preview,
        f"expected {formats.PREVIEW_NAME_RULE}",
    )
    reader.check(
        env == "dev", "env", env, "a preview is its own environment; leave env unset or 'dev'"
    )
    return PROFILES["preview"], preview


def _location(reader: _Reader) -> tuple[str, str, str]:
    account = reader.matching("account", _ACCOUNT, "expected a 12-digit AWS account id")
    region = reader.matching("region", _REGION, "expected a region name such as us-east-2")
    region_given = reader.raw("region") is not None
    default_az = None if region_given else DEFAULT_AVAILABILITY_ZONE
    az = reader.text("availability_zone", default_az)
    if region or not region_given:
        region = region or DEFAULT_REGION
        reader.check(
            az is not None and re.fullmatch(re.escape(region) + r"[a-z]", az) is not None,
            "availability_zone",
            az,
            f"expected an availability zone name of region {region!r}, such as {region}a",
        )
    return account or DEFAULT_ACCOUNT, region or "", az or ""


def _trn(reader: _Reader, profile: Profile) -> TrnCapacity:
    instance_type = reader.text("instance_type", DEFAULT_INSTANCE_TYPE) or DEFAULT_INSTANCE_TYPE
    reader.check(
        instance_type in trn_catalog.CATALOG,
        "instance_type",
        instance_type,
        f"expected a type from the instance catalog: {', '.join(trn_catalog.CATALOG)}",
    )
    nodes = reader.integer("trn_nodes", profile.default_trn_nodes, 0, MAX_TRN_NODES)
    capacity, reservation = _capacity(reader, "capacity", "capacity_reservation_id")
    return TrnCapacity(
        instance_type=instance_type,
        nodes=profile.default_trn_nodes if nodes is None else nodes,
        capacity=capacity,
        capacity_reservation_id=reservation,
    )


def _ultraserver_blocks(reader: _Reader, trn: TrnCapacity) -> TrnCapacity:
    """The trn capacity as UltraServer Capacity Blocks, when ultraserver_reservation_ids lists
    them: one node group per block, each the UltraServer's servers, launched into the block."""
    raw = reader.raw("ultraserver_reservation_ids")
    if raw is None:
        return trn
    key = "ultraserver_reservation_ids"
    ids = _id_list(raw)
    if ids is None:
        reader.fail(key, raw, "expected reservation ids separated by commas, or a JSON list")
        return trn
    spec = ultraservers.for_instance_type(trn.instance_type)
    confirmed = ", ".join(
        f"{u.instance_type} ({u.name})" for u in ultraservers.ULTRASERVERS.values()
    )
    reader.check(
        spec is not None,
        "instance_type",
        trn.instance_type,
        f"UltraServer blocks ({key}) need the member type of a confirmed UltraServer: {confirmed}",
    )
    bad = [i for i in ids if not formats.RESERVATION_ID.fullmatch(i)]
    reader.check(
        not bad, key, bad, "each must be a capacity reservation id: 'cr-' and 17 hexadecimal digits"
    )
    twice = sorted({i for i in ids if ids.count(i) > 1})
    reader.check(not twice, key, twice, "each UltraServer block is listed once")
    most = MAX_INSTANCES_ACROSS_BLOCKS // (spec.servers if spec else 1)
    reader.check(
        1 <= len(ids) <= most,
        key,
        raw,
        f"expected 1 to {most} UltraServer blocks (Capacity Blocks hold at most "
        f"{MAX_INSTANCES_ACROSS_BLOCKS} instances in all)",
    )
    for other in PLAIN_TRN_CAPACITY_KEYS:
        reader.check(
            reader.raw(other) is None,
            other,
            reader.raw(other),
            f"not used with {key}: each UltraServer block is its own node group, launched into "
            "the block (capacity-block) with the UltraServer's servers",
        )
    if spec is None or bad or twice:
        return trn
    return replace(
        trn,
        nodes=spec.servers * len(ids),
        capacity="capacity-block",
        capacity_reservation_id=None,
        ultraserver_reservation_ids=tuple(ids),
    )


def _id_list(raw: Any) -> list[str] | None:
    """Ids from ``a,b`` (the command line) or ``["a", "b"]`` (cdk.json); None when neither."""
    if isinstance(raw, str):
        return [part.strip() for part in raw.split(",") if part.strip()]
    if isinstance(raw, list) and all(isinstance(item, str) for item in raw):
        return [item.strip() for item in raw]
    return None


def _devices(
    reader: _Reader, instance_type: str, kubernetes_version: str
) -> device_modes.DeviceMode:
    """The device-management mode; ``dra`` needs a Kubernetes version with DRA and a type the
    Neuron DRA driver serves. The platform's node groups are EKS managed node groups, which
    DRA supports (Karpenter and EKS Auto Mode, which it does not, are not used here)."""
    mode: device_modes.DeviceMode = reader.choice(
        "devices", device_modes.DEFAULT_DEVICE_MODE, device_modes.DEVICE_MODES
    )
    if mode != "dra":
        return mode
    problem = device_modes.kubernetes_problem(kubernetes_version)
    reader.check(problem is None, "devices", mode, str(problem))
    spec = trn_catalog.CATALOG.get(instance_type)
    reader.check(
        spec is None or device_modes.supports_dra(spec),
        "devices",
        mode,
        f"the Neuron DRA driver serves trn2 and trn3 types; instance_type is {instance_type}",
    )
    return mode


def _lnc(reader: _Reader, instance_type: str, mode: device_modes.DeviceMode) -> int | None:
    """The node group's LNC on the device-plugin path, validated for the instance type."""
    if reader.raw("lnc") is None:
        return None
    lnc = reader.integer("lnc", None, 1, 2)
    if lnc is None:
        return None
    if mode == "dra":
        reader.fail(
            "lnc",
            reader.raw("lnc"),
            "only used with devices 'plugin' (a node setting); with devices 'dra' each job "
            "picks its LNC (trnctl job submit --lnc)",
        )
        return None
    spec = trn_catalog.CATALOG.get(instance_type)
    problem = None if spec is None else device_modes.lnc_problem(spec, lnc)
    reader.check(problem is None, "lnc", reader.raw("lnc"), str(problem))
    return lnc if problem is None else None


def _capacity(
    reader: _Reader, capacity_key: str, reservation_key: str
) -> tuple[CapacityMode, str | None]:
    """How EC2 supplies a node group (``capacity_key``) and the reservation it launches into."""
    capacity: CapacityMode = reader.choice(capacity_key, "on-demand", CAPACITY_MODES)
    reservation = reader.matching(
        reservation_key,
        formats.RESERVATION_ID,
        "expected a capacity reservation id: 'cr-' and 17 hexadecimal digits",
    )
    raw_reservation = reader.raw(reservation_key)
    if capacity in RESERVATION_MODES:
        reader.check(
            raw_reservation is not None,
            reservation_key,
            raw_reservation,
            f"{capacity_key} {capacity!r} needs the id of the reservation to launch into",
        )
    else:
        reader.check(
            raw_reservation is None,
            reservation_key,
            raw_reservation,
            f"only used with {capacity_key} 'capacity-block' or 'odcr'; {capacity_key} is "
            "'on-demand'",
        )
    return capacity, reservation


def _gpu(reader: _Reader) -> GpuCapacity | None:
    """The GPU node group, when gpu_instance_type names one; its other keys need it."""
    instance_type = reader.text("gpu_instance_type")
    if instance_type is None:
        for key in GPU_KEYS[1:]:
            reader.check(
                reader.raw(key) is None,
                key,
                reader.raw(key),
                "only used with gpu_instance_type, which is not set (no GPU node group)",
            )
        return None
    reader.check(
        instance_type in trn_catalog.GPU_CATALOG,
        "gpu_instance_type",
        instance_type,
        f"expected a type from the GPU instance catalog: {', '.join(trn_catalog.GPU_CATALOG)}",
    )
    nodes = reader.integer("gpu_nodes", DEFAULT_GPU_NODES, 0, MAX_GPU_NODES)
    capacity, reservation = _capacity(reader, "gpu_capacity", "gpu_capacity_reservation_id")
    return GpuCapacity(
        instance_type=instance_type,
        nodes=DEFAULT_GPU_NODES if nodes is None else nodes,
        capacity=capacity,
        capacity_reservation_id=reservation,
    )


def _fsx(reader: _Reader, profile: Profile, instance_type: str) -> FsxSettings:
    storage = reader.integer("fsx_storage_gib", profile.default_fsx_storage_gib, 1, FSX_MAX_GIB)
    storage_ok = storage is None or fsx_limits.storage_allowed(storage)
    reader.check(
        storage_ok,
        "fsx_storage_gib",
        storage,
        fsx_limits.STORAGE_RULE,
    )
    throughput = reader.integer(
        "fsx_throughput_per_tib",
        profile.default_fsx_throughput_per_tib,
        0,
        max(fsx_limits.FSX_THROUGHPUTS_PER_TIB),
    )
    reader.check(
        throughput is None or fsx_limits.throughput_allowed(throughput),
        "fsx_throughput_per_tib",
        throughput,
        fsx_limits.THROUGHPUT_RULE,
    )
    settings = FsxSettings(
        storage_gib=storage or profile.default_fsx_storage_gib,
        throughput_per_tib=throughput or profile.default_fsx_throughput_per_tib,
        efa=reader.boolean("efa_fsx", False),
    )
    base_rules_hold = storage is not None and throughput is not None and storage_ok
    if settings.efa and base_rules_hold:
        reader.check(
            fsx_limits.efa_storage_allowed(settings.storage_gib, settings.throughput_per_tib),
            "fsx_storage_gib",
            settings.storage_gib,
            f"with efa_fsx, {fsx_limits.efa_storage_rule(settings.throughput_per_tib)}",
        )
    reader.check(
        not settings.efa or fsx_limits.efa_client_allowed(instance_type),
        "efa_fsx",
        True,
        f"FSx for Lustre serves no EFA to the trn2 family; instance_type is {instance_type}",
    )
    return settings


def _preview_integer(
    reader: _Reader, preview: str | None, key: str, default: int, high: int, purpose: str
) -> int | None:
    """A whole number from 1 to ``high`` that only a preview takes (``default`` there)."""
    value = reader.integer(key, None, 1, high)
    if preview is None:
        reader.check(
            reader.raw(key) is None,
            key,
            reader.raw(key),
            f"only used with preview=<project>; {purpose}",
        )
        return None
    return default if value is None else value


def _preview_ttl(reader: _Reader, preview: str | None) -> int | None:
    return _preview_integer(
        reader,
        preview,
        "ttl_hours",
        DEFAULT_TTL_HOURS,
        MAX_TTL_HOURS,
        "dev and prod environments do not expire",
    )


def _budget_usd(reader: _Reader, profile: Profile) -> int:
    """The environment's monthly cost budget: ``budget_usd``, else the profile's default."""
    value = reader.integer("budget_usd", None, 1, MAX_BUDGET_USD)
    return profile.default_budget_usd if value is None else value


def _project(reader: _Reader) -> str | None:
    """The project the environment's resources are tagged with (a preview's resources also carry
    its name as ``trn-platform:preview``)."""
    return reader.matching("project", formats.PREVIEW_NAME, f"expected {formats.PREVIEW_NAME_RULE}")


def _budget_email(reader: _Reader) -> str | None:
    """An address that gets the environment's budget and alarm alerts."""
    return reader.matching("budget_email", formats.EMAIL, "expected an email address")


def parse_config(
    context: Mapping[str, Any],
    *,
    now: datetime | None = None,
    kubernetes_version: str = versions.KUBERNETES_VERSION,
) -> PlatformConfig:
    """Build a validated :class:`PlatformConfig` from CDK context.

    Args:
        context: the app's context, e.g. ``app.node.get_all_context()``; a key neither in
            :data:`CONTEXT_KEYS` nor CDK's own (:func:`is_cdk_context_key`) is a problem.
        now: the time a preview's ``ttl_hours`` count from (timezone-aware); without it a
            preview gets no ``expires_at``.
        kubernetes_version: the cluster's Kubernetes version (default: the pinned one), which
            ``devices=dra`` needs to be 1.34 or later.

    Raises:
        ConfigError: one or more values are invalid; its message lists every problem with the
            key, the value and what is allowed.
    """
    reader = _Reader(context)
    reader.problems.extend(_unknown_keys(context))
    profile, preview = _profile(reader)
    account, region, az = _location(reader)
    reader.check(
        preview is None or not region or region in PREVIEW_REGIONS,
        "region",
        region,
        "a preview's budget needs CloudFormation's AWS::Budgets::Budget, which this region does "
        f"not offer; previews deploy to {', '.join(sorted(PREVIEW_REGIONS))}",
    )
    reader.check(
        not region or region in registries.EKS_REGISTRY_ACCOUNTS,
        "region",
        region,
        "the EFA device plugin and aws-dranet images come from the region's EKS registry, and "
        f"the catalog lists none for it (from {registries.GUIDE}); known: "
        f"{', '.join(registries.EKS_REGISTRY_ACCOUNTS)}",
    )
    ttl_hours = _preview_ttl(reader, preview)
    trn = _ultraserver_blocks(reader, _trn(reader, profile))
    devices = _devices(reader, trn.instance_type, kubernetes_version)
    trn = replace(trn, lnc=_lnc(reader, trn.instance_type, devices))
    config = PlatformConfig(
        account=account,
        region=region,
        availability_zone=az,
        profile=profile,
        trn=trn,
        fsx=_fsx(reader, profile, trn.instance_type),
        preview=preview,
        ttl_hours=ttl_hours,
        expires_at=(now + timedelta(hours=ttl_hours)) if now and ttl_hours else None,
        budget_email=_budget_email(reader),
        project=_project(reader),
        budget_usd=_budget_usd(reader, profile),
        admin_role_arn=reader.matching(
            "admin_role_arn",
            _ROLE_ARN,
            "expected an IAM role ARN such as arn:aws:iam::123456789012:role/Admin",
        ),
        gpu=_gpu(reader),
        devices=devices,
        model_registry=reader.choice("model_registry", "s3", MODEL_REGISTRIES),
    )
    if reader.problems:
        raise ConfigError(reader.problems)
    return config
