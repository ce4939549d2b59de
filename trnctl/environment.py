"""Find a deployed environment (``trn-dev``, ``trn-pv-<project>``) by its SSM outputs parameter."""

from __future__ import annotations

from typing import Any

from trn_catalog.outputs import EnvironmentOutputs, parameter_name
from trnctl.errors import ExitCode, TrnctlError


def lookup(environment: str, ssm: Any) -> EnvironmentOutputs:
    """The outputs that the cluster stack published for ``environment``.

    Args:
        environment: the environment name, e.g. ``trn-dev``.
        ssm: a boto3 SSM client in the environment's region.

    Raises:
        TrnctlError: exit code NOT_FOUND when the parameter does not exist (the environment is
            not deployed in this region); FAILED when its value is not valid outputs JSON.
        botocore.exceptions.ClientError: any other SSM error (access denied, throttling).
    """
    name = parameter_name(environment)
    try:
        value = ssm.get_parameter(Name=name)["Parameter"]["Value"]
    except ssm.exceptions.ParameterNotFound:
        raise TrnctlError(
            f"unknown environment {environment!r}: SSM parameter {name} does not exist in "
            f"{ssm.meta.region_name}; deploy it, or check --env and the region",
            ExitCode.NOT_FOUND,
        ) from None
    try:
        return EnvironmentOutputs.from_json(value)
    except ValueError as error:
        raise TrnctlError(
            f"environment {environment!r}: SSM parameter {name} is malformed: {error}",
            ExitCode.FAILED,
        ) from None
