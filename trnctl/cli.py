"""Entry point of the trnctl console script: the command tree and its error handling.

Commands stay thin: they parse options, call the module that owns the work and print. Every
failure leaves through :class:`TrnctlError` or a botocore exception, which
:class:`_ErrorHandlingGroup` turns into one line on stderr and an exit code (see
:mod:`trnctl.errors`).
"""

from __future__ import annotations

from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from trnctl import aws, preflight
from trnctl.errors import ExitCode, TrnctlError, from_aws


class _ErrorHandlingGroup(TyperGroup):
    """The root group: wraps every subcommand so no failure prints a traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except TrnctlError as error:
            _exit(str(error), error.exit_code)
        except Exception as error:
            translated = from_aws(error)
            if translated is None:
                raise
            _exit(str(translated), translated.exit_code)


def _exit(message: str, code: ExitCode) -> NoReturn:
    typer.echo(f"trnctl: {message}", err=True)
    raise typer.Exit(int(code))


app = typer.Typer(
    cls=_ErrorHandlingGroup,
    help="Operate a Trainium training platform: preflight, capacity, data, previews, cost.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Operate a Trainium training platform: preflight, capacity, data, previews, cost.

    AWS credentials, region and endpoints come from the standard AWS environment (AWS_PROFILE,
    AWS_REGION, AWS_ENDPOINT_URL, ...).
    """


def _console() -> Console:
    # Created per command so that COLUMNS and the terminal are read when the command runs.
    return Console()


def _region(region: str | None) -> str:
    resolved = region or aws.session_region()
    if not resolved:
        raise TrnctlError("no AWS region: pass --region or set AWS_REGION", ExitCode.USAGE)
    return resolved


RegionOption = Annotated[
    str | None, typer.Option("--region", help="AWS region; default: the AWS environment's.")
]
InstanceTypeOption = Annotated[
    str, typer.Option("--instance-type", help="Instance type, e.g. trn2.48xlarge.")
]


@app.command("preflight")
def preflight_command(
    az: Annotated[str, typer.Option("--az", help="Availability zone name, e.g. us-east-2a.")],
    instance_type: InstanceTypeOption,
    count: Annotated[int, typer.Option("--count", min=1, help="Instances wanted.")],
    region: RegionOption = None,
) -> None:
    """Check type offering, EFA layout, On-Demand quota and reservations; exit 1 on a failure."""
    resolved = _region(region)
    if not az.startswith(resolved):
        raise TrnctlError(
            f"--az {az!r} is not an availability zone of region {resolved!r} "
            f"(expected a name such as {resolved}a)"
        )
    request = preflight.Request(resolved, az, instance_type, count)
    checks = preflight.run(
        aws.client("ec2", resolved), aws.client("service-quotas", resolved), request
    )
    table = Table(title=f"preflight: {count} x {instance_type} in {az}")
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    styles = {preflight.Status.PASS: "green", preflight.Status.WARN: "yellow"}
    for check in checks:
        style = styles.get(check.status, "red")
        table.add_row(check.name, f"[{style}]{check.status}[/]", check.detail, check.fix)
    _console().print(table)
    if preflight.failed(checks):
        raise typer.Exit(int(ExitCode.FAILED))


def main() -> None:
    app()
