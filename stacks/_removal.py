"""The removal policy of an environment's resources, from its profile."""

from aws_cdk import RemovalPolicy

from platform_config import PlatformConfig


def removal_policy(config: PlatformConfig) -> RemovalPolicy:
    """RETAIN where the profile keeps data (prod), DESTROY otherwise (dev, previews)."""
    return RemovalPolicy.RETAIN if config.profile.retain_data else RemovalPolicy.DESTROY
