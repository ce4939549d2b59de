"""`trnctl preflight`: can this account run N instances of a type in an AZ?"""

from __future__ import annotations

from typing import Annotated

import typer

from trnctl import (
    aws,
    preflight,
)
from trnctl.commands import common
from trnctl.commands.common import (
    InstanceTypeOption,
    RegionOption,
)
from trnctl.errors import TrnctlError


def preflight_command(
    az: Annotated[str, typer.Option("--az", help="Availability zone name, e.g. us-east-2a.")],
    instance_type: InstanceTypeOption,
    count: Annotated[int, typer.Option("--count", min=1, help="Instances wanted.")],
    region: RegionOption = None,
    env: Annotated[
        str | None,
        typer.Option(
            "--env",
            help="A deployed environment (trn-dev, ...): also report how its trn nodes get "
            "their devices (plugin or dra) and their logical NeuronCore setting.",
        ),
    ] = None,
) -> None:
    """Check type offering, EFA layout, On-Demand quota and reservations (and, with --env, the
    environment's device management and LNC); exit 1 on a failure."""
    resolved = common.region_of(region)
    if not az.startswith(resolved):
        raise TrnctlError(
            f"--az {az!r} is not an availability zone of region {resolved!r} "
            f"(expected a name such as {resolved}a)"
        )
    request = preflight.Request(resolved, az, instance_type, count)
    checks = preflight.run(
        aws.client("ec2", resolved), aws.client("service-quotas", resolved), request
    )
    if env is not None:
        checks += preflight.check_devices(common.outputs_of(env, resolved))
    common.print_checks(f"preflight: {count} x {instance_type} in {az}", "check", checks)
