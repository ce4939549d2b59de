"""The lifecycle stack of a preview environment: expiry, deletion and budget."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import Stack
from constructs import Construct

from constructs_lib import PreviewLifecycle
from platform_config import PlatformConfig


class LifecycleStack(Stack):
    """Composes :class:`PreviewLifecycle` over this preview's other stacks (itself deleted last).

    Raises:
        ValueError: the config is not a preview, or it has no expiry.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: PlatformConfig,
        stacks: Sequence[Stack],
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        if config.preview is None or config.expires_at is None:
            raise ValueError(f"{config.name} is not a preview with an expiry")
        self.lifecycle = PreviewLifecycle(
            self,
            "Lifecycle",
            project=config.preview,
            expires_at=config.expires_at,
            stacks=[self, *stacks],
            alert_email=config.budget_email,
            budget_usd=config.budget_usd or PreviewLifecycle.DEFAULT_BUDGET_USD,
        )
