"""Entry point of the trnctl console script: the command tree and its error handling.

Each command or command group lives in :mod:`trnctl.commands` under its own name (``trnctl job
submit`` in ``trnctl/commands/job.py``). Commands stay thin: they parse options, call the module
that owns the work and print. Every failure leaves through :class:`TrnctlError` or a botocore
exception, which :class:`_ErrorHandlingGroup` turns into one line on stderr and an exit code (see
:mod:`trnctl.errors`).
"""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from trnctl.commands import (
    addons,
    capacity,
    code,
    compare,
    cost,
    data,
    job,
    model,
    pipeline,
    preflight,
    preview,
    validate,
)
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
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Operate a Trainium training platform: preflight, capacity, data, jobs, validation,
    previews, cost, comparisons of runs.

    AWS credentials, region and endpoints come from the standard AWS environment (AWS_PROFILE,
    AWS_REGION, AWS_ENDPOINT_URL, ...).
    """


app.command("preflight")(preflight.preflight_command)
app.command("addons")(addons.addons_command)
app.add_typer(capacity.app, name="capacity")
app.add_typer(data.app, name="data")
app.add_typer(preview.app, name="preview")
app.add_typer(model.app, name="model")
app.add_typer(code.app, name="code")
app.add_typer(job.app, name="job")
app.add_typer(pipeline.app, name="pipeline")
app.command("validate")(validate.validate_command)
app.command("cost")(cost.cost_command)
app.command("compare")(compare.compare_command)


def main() -> None:
    app()
