"""What several commands share: options, the console, the region, the environment's outputs and
cluster, uploads with progress, waiting for a job and pass/fail tables."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from trn_catalog.outputs import EnvironmentOutputs
from trnctl import aws, environment, jobs, kube, preflight, transfer
from trnctl.errors import ExitCode, TrnctlError

RegionOption = Annotated[
    str | None, typer.Option("--region", help="AWS region; default: the AWS environment's.")
]
InstanceTypeOption = Annotated[
    str, typer.Option("--instance-type", help="Instance type, e.g. trn2.48xlarge.")
]
EnvOption = Annotated[str, typer.Option("--env", help="Environment name, e.g. trn-dev.")]
ImageOption = Annotated[
    str | None, typer.Option("--image", help="Training image URI; default: the environment's.")
]
NameOption = Annotated[
    str | None,
    typer.Option("--name", help="Job name (DNS-1035 label); default: generated with a timestamp."),
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Print the TrainJob as YAML; call no Kubernetes API.")
]


def console() -> Console:
    # Created per command so that COLUMNS and the terminal are read when the command runs.
    return Console()


def region_of(region: str | None) -> str:
    """``region``, else the AWS environment's.

    Raises:
        TrnctlError: USAGE when neither names a region.
    """
    resolved = region or aws.session_region()
    if not resolved:
        raise TrnctlError("no AWS region: pass --region or set AWS_REGION", ExitCode.USAGE)
    return resolved


def outputs_of(env: str, region: str | None) -> EnvironmentOutputs:
    return environment.lookup(env, aws.client("ssm", region_of(region)))


def cluster_of(outputs: EnvironmentOutputs) -> kube.Cluster:
    api = kube.connect(outputs.cluster_name, outputs.region)
    return kube.Cluster(api, outputs.namespace)


def print_checks(title: str, first_column: str, checks: list[preflight.Check]) -> None:
    """A pass/warn/fail table with a fix per row; exit 1 when any check failed."""
    table = Table(title=title)
    for column in (first_column, "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    styles = {preflight.Status.PASS: "green", preflight.Status.WARN: "yellow"}
    for check in checks:
        style = styles.get(check.status, "red")
        table.add_row(check.name, f"[{style}]{check.status}[/]", check.detail, check.fix)
    console().print(table)
    if preflight.failed(checks):
        raise typer.Exit(int(ExitCode.FAILED))


def upload(
    s3: Any,
    items: list[transfer.Upload],
    location: transfer.S3Prefix,
    part_mib: int,
    *,
    marker: str,
) -> list[transfer.Upload]:
    """Uploads the items ``location`` does not hold intact, in order, with a progress bar on a
    terminal; returns those it uploaded. ``marker`` is the key of the stage's completion marker,
    which the caller writes last (the last item, or after this returns): when anything is to be
    uploaded it is deleted first (:func:`transfer.retract`), and, when it is an item, uploaded
    again last even if it was intact."""
    pending = transfer.pending(s3, items, location)
    todo = [item for item in items if item in pending or (pending and item.key == marker)]
    if todo:
        transfer.retract(s3, location.bucket, marker)
    progress_console = Console(stderr=True)
    with Progress(
        TextColumn("uploading"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=progress_console,
        # Off when stderr is not a terminal: logs get the summary line, not bar frames.
        disable=not progress_console.is_terminal,
    ) as progress:
        task = progress.add_task("upload", total=sum(item.size for item in todo))
        transfer.upload_all(
            s3,
            todo,
            location,
            part_mib=part_mib,
            on_bytes=lambda sent: progress.advance(task, sent),
        )
    return todo


def wait(
    cluster: kube.Cluster, job_name: str, what: str, env: str, timeout: float, poll: float
) -> str:
    """Polls the TrainJob until it ends; its outcome (``Complete`` or ``Failed``).

    Raises:
        TrnctlError: FAILED when it has not ended within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    state = jobs.outcome(cluster.get(job_name))
    while state is None:
        if time.monotonic() >= deadline:
            phases = ", ".join(sorted({p.phase for p in jobs.node_pods(cluster.pods(job_name))}))
            raise TrnctlError(
                f"{what} {job_name} did not finish within {timeout:g} s (pods: "
                f"{phases or 'none'}); see trnctl job status {job_name} --env {env}",
                ExitCode.FAILED,
            )
        time.sleep(poll)
        state = jobs.outcome(cluster.get(job_name))
    return state
