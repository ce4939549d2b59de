"""The platform's configuration model: typed, frozen, validated once from CDK context."""

from platform_config.model import (
    CAPACITY_MODES,
    PROFILES,
    CapacityMode,
    EnvName,
    FsxSettings,
    GpuCapacity,
    NodeCapacity,
    PlatformConfig,
    Profile,
    TrnCapacity,
)
from platform_config.parse import CONTEXT_KEYS, ConfigError, parse_config

__all__ = [
    "CAPACITY_MODES",
    "CONTEXT_KEYS",
    "PROFILES",
    "CapacityMode",
    "ConfigError",
    "EnvName",
    "FsxSettings",
    "GpuCapacity",
    "NodeCapacity",
    "PlatformConfig",
    "Profile",
    "TrnCapacity",
    "parse_config",
]
