"""The typed configuration of one platform environment.

Everything below ``app.py`` receives a :class:`PlatformConfig`; nothing else reads CDK context.
The values here are already validated (see :mod:`platform_config.parse`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import trn_catalog
from trn_catalog import ultraservers
from trn_catalog.devices import DeviceMode

EnvName = Literal["dev", "prod", "preview"]
CapacityMode = Literal["on-demand", "capacity-block", "odcr"]

CAPACITY_MODES: tuple[CapacityMode, ...] = ("on-demand", "capacity-block", "odcr")
RESERVATION_MODES: tuple[CapacityMode, ...] = ("capacity-block", "odcr")


@dataclass(frozen=True)
class Profile:
    """What differs between dev, prod and preview environments, stated once.

    ``retain_data`` decides RETAIN (prod) or DESTROY for the stateful resources;
    ``nat_gateways`` is one in dev and preview (cheap, one AZ's egress) and one per AZ in prod (no
    cross-AZ dependency for egress); ``default_budget_usd`` is the monthly cost budget an
    environment of the profile gets without ``budget_usd`` (an order of magnitude: two trn
    nodes for a working month in dev, more in prod, a few days of one node in a preview).
    """

    name: EnvName
    max_azs: int
    nat_gateways: int
    retain_data: bool
    termination_protection: bool
    log_retention_days: int
    default_trn_nodes: int
    default_fsx_storage_gib: int
    default_fsx_throughput_per_tib: int
    default_budget_usd: int


PROFILES: dict[EnvName, Profile] = {
    "dev": Profile(
        name="dev",
        max_azs=2,
        nat_gateways=1,
        retain_data=False,
        termination_protection=False,
        log_retention_days=30,
        default_trn_nodes=2,
        default_fsx_storage_gib=1200,
        default_fsx_throughput_per_tib=125,
        default_budget_usd=10_000,
    ),
    "prod": Profile(
        name="prod",
        max_azs=3,
        nat_gateways=3,
        retain_data=True,
        termination_protection=True,
        log_retention_days=365,
        default_trn_nodes=2,
        default_fsx_storage_gib=4800,
        default_fsx_throughput_per_tib=250,
        default_budget_usd=50_000,
    ),
    "preview": Profile(
        name="preview",
        max_azs=2,
        nat_gateways=1,
        retain_data=False,
        termination_protection=False,
        log_retention_days=7,
        default_trn_nodes=1,
        default_fsx_storage_gib=1200,
        default_fsx_throughput_per_tib=125,
        default_budget_usd=500,
    ),
}


@dataclass(frozen=True)
class NodeCapacity:
    """A node group's capacity: which instance type, how many nodes, and how EC2 supplies them."""

    instance_type: str
    nodes: int
    capacity: CapacityMode
    capacity_reservation_id: str | None


@dataclass(frozen=True)
class TrnCapacity(NodeCapacity):
    """The Trainium node capacity; ``lnc`` is the node group's logical NeuronCore setting on the
    device-plugin path (None: the type's default, and always None under DRA, where each job
    picks its own)."""

    lnc: int | None = None
    # UltraServer Capacity Blocks (context key ultraserver_reservation_ids): one reservation id
    # per UltraServer, each launched by its own node group; empty for plain trn capacity.
    ultraserver_reservation_ids: tuple[str, ...] = ()

    @property
    def spec(self) -> trn_catalog.InstanceSpec:
        return trn_catalog.get(self.instance_type)

    @property
    def ultraserver(self) -> ultraservers.UltraServerSpec | None:
        """The UltraServer type of the blocks, or None without UltraServer blocks."""
        if not self.ultraserver_reservation_ids:
            return None
        return ultraservers.for_instance_type(self.instance_type)


@dataclass(frozen=True)
class GpuCapacity(NodeCapacity):
    """The optional GPU node group for side-by-side runs (an NVIDIA type). It shares the trn AZ
    (and a Capacity Block must be in that AZ)."""

    @property
    def spec(self) -> trn_catalog.GpuInstanceSpec:
        return trn_catalog.get_gpu(self.instance_type)


@dataclass(frozen=True)
class FsxSettings:
    """FSx for Lustre PERSISTENT_2 sizing: storage in GiB and throughput in MB/s per TiB."""

    storage_gib: int
    throughput_per_tib: int
    efa: bool


@dataclass(frozen=True)
class PlatformConfig:
    """One environment of the platform (dev, prod or a per-project preview)."""

    account: str
    region: str
    availability_zone: str
    profile: Profile
    trn: TrnCapacity
    fsx: FsxSettings
    preview: str | None = None
    ttl_hours: int | None = None
    expires_at: datetime | None = None
    budget_email: str | None = None
    admin_role_arn: str | None = None
    # The environment's monthly cost budget in USD (None: the profile's default_budget_usd).
    budget_usd: int | None = None
    # The project every resource is tagged with for cost allocation (context key project).
    project: str | None = None
    # The GPU node group (None unless gpu_instance_type is set).
    gpu: GpuCapacity | None = None
    # How Neuron and EFA devices reach pods: device plugins, or Dynamic Resource Allocation.
    devices: DeviceMode = "plugin"
    # Where the model registry lives: the S3 manifests alone ("s3"), or mirrored into SageMaker
    # Model Registry too ("sagemaker"; trn_catalog.outputs.MODEL_REGISTRIES).
    model_registry: str = "s3"

    @property
    def env(self) -> EnvName:
        return self.profile.name

    @property
    def name(self) -> str:
        """The prefix of every stack name: ``trn-dev``, ``trn-prod`` or ``trn-pv-<project>``."""
        if self.preview:
            return f"trn-pv-{self.preview}"
        return f"trn-{self.env}"
