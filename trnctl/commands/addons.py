"""`trnctl addons`: are the pinned EKS add-on versions offered for the cluster's Kubernetes?"""

from __future__ import annotations

from typing import Annotated

import typer

from trn_catalog import versions
from trnctl import (
    addons,
    aws,
)
from trnctl.commands import common
from trnctl.commands.common import (
    RegionOption,
)


def addons_command(
    kubernetes_version: Annotated[
        str, typer.Option("--kubernetes-version", help="The cluster's Kubernetes version.")
    ] = versions.KUBERNETES_VERSION,
    region: RegionOption = None,
) -> None:
    """Check the pinned EKS add-on versions against EKS; exit 1 if a pin is not offered."""
    checks = addons.run(aws.client("eks", common.region_of(region)), kubernetes_version)
    common.print_checks(f"EKS add-ons for Kubernetes {kubernetes_version}", "add-on", checks)
