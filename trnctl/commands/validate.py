"""`trnctl validate`: a validation job on every trn node, judged against the catalog."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from trn_catalog import workspace as ws
from trn_catalog.outputs import EnvironmentOutputs
from trnctl import (
    jobs,
    kube,
    preflight,
    validation,
)
from trnctl.commands import common
from trnctl.commands.common import (
    DryRunOption,
    EnvOption,
    ImageOption,
    NameOption,
    RegionOption,
)
from trnctl.errors import ExitCode, TrnctlError


def validate_command(
    env: EnvOption,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the job.")
    ] = 1800,
    size_mib: Annotated[
        int, typer.Option("--size-mib", min=1, help="All-reduce message size per rank.")
    ] = 64,
    image: ImageOption = None,
    name: NameOption = None,
    poll: Annotated[float, typer.Option("--poll", min=0.01, help="Seconds between polls.")] = 10,
    ultraserver: Annotated[
        bool,
        typer.Option(
            "--ultraserver", help="Run on the nodes of one UltraServer: the all-reduce inside it."
        ),
    ] = False,
    across_ultraservers: Annotated[
        bool,
        typer.Option(
            "--across-ultraservers",
            help="Run on the nodes of two UltraServers: the all-reduce across them.",
        ),
    ] = False,
    dry_run: DryRunOption = False,
    region: RegionOption = None,
) -> None:
    """Run a validation job on every trn node (Neuron devices and cores, EFA interfaces, an
    all-reduce across all ranks), or on one or two UltraServers, and check it against the
    catalog; exit 1 if a node fails."""
    outputs = common.outputs_of(env, region)
    spec = jobs.trn_spec_of(outputs)
    job = validation.render(
        outputs,
        now=datetime.now(UTC),
        name=name,
        image=image,
        size_mib=size_mib,
        ultraserver=ultraserver,
        across_ultraservers=across_ultraservers,
    )
    job_name = job["metadata"]["name"]
    expected = job["spec"]["trainer"]["numNodes"]
    if dry_run:
        typer.echo(jobs.to_yaml(job), nl=False)
        return
    cluster = common.cluster_of(outputs)
    if outputs.ultraserver_type:
        typer.echo(_ultraserver_line(outputs, cluster), err=True)
    cluster.create(job)
    typer.echo(
        f"submitted validation job {job_name} on {expected} nodes "
        f"({validation.device_note(outputs)})",
        err=True,
    )
    state = common.wait(cluster, job_name, "validation job", env, timeout, poll)
    results = [
        validation.judge(p.index, p.name, cluster.log(p.name), spec)
        for p in jobs.node_pods(cluster.pods(job_name))
    ]
    note = validation.device_note(outputs)
    table = Table(title=f"validate {env}: {expected} x {spec.name}, {note} ({job_name}: {state})")
    for column in ("node", "pod", "neuron devices", "cores", "EFA", "all-reduce", "GB/s", "result"):
        table.add_column(column, overflow="fold")
    for r in results:
        report = r.report or {}
        gbps = report.get("allreduce_gbps")
        table.add_row(
            str(r.index),
            r.pod,
            f"{report.get('neuron_devices', '-')}/{spec.chips}",
            f"{report.get('neuron_cores', '-')}/{spec.neuron_cores}",
            f"{report.get('efa_interfaces', '-')}/{spec.efa_interfaces}",
            {True: "ok", False: "failed"}.get(bool(report["allreduce_ok"]), "-")
            if "allreduce_ok" in report
            else "-",
            f"{gbps:,.1f}" if isinstance(gbps, int | float) else "-",
            "[green]pass[/]" if r.passed else f"[red]fail[/]: {'; '.join(r.problems)}",
        )
    common.console().print(table)
    failures = [f"node {r.index}: {'; '.join(r.problems)}" for r in results if not r.passed]
    failures += [f"node {i}: no pod" for i in validation.missing_nodes(results, expected)]
    if failures:
        raise TrnctlError(
            f"validation failed on {len(failures)} of {expected} nodes: " + " | ".join(failures),
            ExitCode.FAILED,
        )
    if state != "Complete":
        raise TrnctlError(f"validation job {job_name} ended {state}", ExitCode.FAILED)


def _ultraserver_line(outputs: EnvironmentOutputs, cluster: kube.Cluster) -> str:
    """The environment's UltraServers as the nodes' labels show them (ids, nodes per server)."""
    nodes = cluster.node_labels(f"{ws.NODE_TYPE_LABEL}={ws.TRAINIUM_NODE_TYPE}")
    check = preflight.check_ultraservers(outputs, nodes)
    return f"UltraServers ({check.status}): {check.detail}" + (
        f"; {check.fix}" if check.fix else ""
    )
