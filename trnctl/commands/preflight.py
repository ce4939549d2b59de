"""`trnctl preflight`: can this account run N instances of a type in an AZ?"""

from __future__ import annotations

from typing import Annotated

import typer
from botocore.exceptions import ClientError

from trn_catalog import workspace as ws
from trn_catalog.outputs import EnvironmentOutputs
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
            help="A deployed environment (trn-dev, ...): also check that --az is its trn zone "
            "(which cannot move) and report how its trn nodes get their devices (plugin or "
            "dra) and their logical NeuronCore setting, from its outputs and read back from "
            "the nodes' labels, and its UltraServers.",
        ),
    ] = None,
) -> None:
    """Check type offering, EFA layout, On-Demand quota, reservations and the EKS images the
    platform pulls in the region (and, with --env, the zone, the environment's device
    management and LNC, what its nodes' labels say of both, and its UltraServers); exit 1 on a
    failure."""
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
    checks.append(preflight.check_eks_images(aws.client("ecr", resolved), resolved))
    if env is not None:
        outputs = common.outputs_of(env, resolved)
        checks.append(preflight.check_zone(outputs, request))
        checks += preflight.check_devices(outputs)
        checks += node_checks(outputs)
    common.print_checks(f"preflight: {count} x {instance_type} in {az}", "check", checks)


def node_checks(outputs: EnvironmentOutputs) -> list[preflight.Check]:
    """The trn nodes' labels against the outputs; a cluster that cannot be read (not yet
    created, no access) is a warning, since the account checks above stand without it."""
    selector = f"{ws.NODE_TYPE_LABEL}={ws.TRAINIUM_NODE_TYPE}"
    try:
        nodes = common.cluster_of(outputs).node_labels(selector)
    except (TrnctlError, ClientError) as error:
        return [
            preflight.Check(
                "node labels",
                preflight.Status.WARN,
                f"could not read the nodes of {outputs.cluster_name}: {error}",
                "deploy the cluster, or grant this identity access to it (EKS access entry)",
            )
        ]
    return preflight.check_nodes(outputs, nodes)
