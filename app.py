#!/usr/bin/env python3
"""The CDK app: the only place that reads CDK context or the environment."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from platform_config import ConfigError, parse_config
from stacks import Platform, build_platform


def build_app(
    context: Mapping[str, Any] | None = None,
    outdir: str | None = None,
    now: datetime | None = None,
) -> tuple[cdk.App, Platform]:
    """The app with one environment, from CDK context (the CLI's, or ``context`` in tests).

    ``now`` (default: the clock) is when this synth happens; a preview expires from it.

    Raises:
        ConfigError: the context holds invalid values.
    """
    # CloudFormation schema checks run as cfn-lint in the test suite; the built-in plugin would
    # repeat them on every synth.
    app = cdk.App(
        context=dict(context) if context is not None else None,
        outdir=outdir,
        builtin_cloud_formation_validation=False,
    )
    # A preview expires ttl_hours after this synth, to the minute.
    synth_time = (now or datetime.now(UTC)).replace(second=0, microsecond=0)
    config = parse_config(app.node.get_all_context(), now=synth_time)
    platform = build_platform(app, config)
    # cdk-nag runs on every synth: an unacknowledged AwsSolutions finding fails it.
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, platform


def main() -> None:
    try:
        app, _ = build_app()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    app.synth()


if __name__ == "__main__":
    main()
