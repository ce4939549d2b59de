"""Entry point of the trnctl console script: the command tree and its error handling.

Commands stay thin: they parse options, call the module that owns the work and print. Every
failure leaves through :class:`TrnctlError` or a botocore exception, which
:class:`_ErrorHandlingGroup` turns into one line on stderr and an exit code (see
:mod:`trnctl.errors`).
"""

from __future__ import annotations

import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

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
from typer.core import TyperGroup

import trn_catalog
from trn_catalog import versions
from trn_catalog.outputs import TAG_EXPIRES_AT, TAG_PREVIEW, EnvironmentOutputs
from trnctl import (
    addons,
    aws,
    capacity,
    cost,
    environment,
    jobs,
    kube,
    models,
    preflight,
    previews,
    transfer,
    validation,
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
    previews, cost.

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
    _print_checks(f"preflight: {count} x {instance_type} in {az}", "check", checks)


def _print_checks(title: str, first_column: str, checks: list[preflight.Check]) -> None:
    """A pass/warn/fail table with a fix per row; exit 1 when any check failed."""
    table = Table(title=title)
    for column in (first_column, "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    styles = {preflight.Status.PASS: "green", preflight.Status.WARN: "yellow"}
    for check in checks:
        style = styles.get(check.status, "red")
        table.add_row(check.name, f"[{style}]{check.status}[/]", check.detail, check.fix)
    _console().print(table)
    if preflight.failed(checks):
        raise typer.Exit(int(ExitCode.FAILED))


@app.command("addons")
def addons_command(
    kubernetes_version: Annotated[
        str, typer.Option("--kubernetes-version", help="The cluster's Kubernetes version.")
    ] = versions.KUBERNETES_VERSION,
    region: RegionOption = None,
) -> None:
    """Check the pinned EKS add-on versions against EKS; exit 1 if a pin is not offered."""
    checks = addons.run(aws.client("eks", _region(region)), kubernetes_version)
    _print_checks(f"EKS add-ons for Kubernetes {kubernetes_version}", "add-on", checks)


capacity_app = typer.Typer(help="Find and buy EC2 Capacity Blocks for ML.", no_args_is_help=True)
app.add_typer(capacity_app, name="capacity")


@capacity_app.command("find")
def capacity_find(
    instance_type: InstanceTypeOption,
    count: Annotated[int, typer.Option("--count", help="Instances in the block (1-64).")],
    days: Annotated[int, typer.Option("--days", help="Duration: 1-14, then multiples of 7.")],
    start_after: Annotated[
        datetime | None,
        typer.Option(
            "--start-after",
            formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M"],
            help="Earliest start (UTC), e.g. 2026-12-01.",
        ),
    ] = None,
    region: RegionOption = None,
) -> None:
    """List Capacity Block offerings, cheapest per instance-hour first; exit 4 if there are none."""
    resolved = _region(region)
    offerings = capacity.find(
        aws.client("ec2", resolved),
        instance_type=instance_type,
        count=count,
        days=days,
        start_after=start_after,
    )
    if not offerings:
        raise TrnctlError(
            f"no Capacity Block offerings for {count} x {instance_type} over {days} days in "
            f"{resolved}; try other dates, fewer instances or another region",
            ExitCode.NOT_FOUND,
        )
    table = Table(title=f"Capacity Blocks: {count} x {instance_type}, {days} days, {resolved}")
    for column in ("offering", "AZ", "start (UTC)", "end (UTC)", "hours", "upfront", "per inst-h"):
        table.add_column(column, overflow="fold")
    for o in offerings:
        table.add_row(
            o.offering_id,
            o.availability_zone,
            f"{o.start:%Y-%m-%d %H:%M}",
            f"{o.end:%Y-%m-%d %H:%M}",
            f"{o.hours}:{o.minutes:02d}" if o.minutes else str(o.hours),
            f"{o.upfront_fee:,.2f} {o.currency}",
            f"{o.per_instance_hour:,.2f} {o.currency}",
        )
    console = _console()
    console.print(table)
    best = offerings[0]
    console.print(f"cheapest: trnctl capacity buy {best.offering_id} --region {resolved} --yes")
    flags = capacity.deploy_flags(
        availability_zone=best.availability_zone,
        instance_type=best.instance_type,
        count=best.instance_count,
        reservation_id=capacity.RESERVATION_PLACEHOLDER,
    )
    console.print(f"then deploy with: {flags}", soft_wrap=True)


@capacity_app.command("buy")
def capacity_buy(
    offering_id: Annotated[str, typer.Argument(help="Offering id from capacity find (cb-...).")],
    yes: Annotated[bool, typer.Option("--yes", help="Buy; without it, a dry run.")] = False,
    platform: Annotated[str, typer.Option("--platform")] = capacity.PLATFORM,
    region: RegionOption = None,
) -> None:
    """Buy a Capacity Block (charged up front, not refundable); a dry run unless --yes."""
    ec2 = aws.client("ec2", _region(region))
    console = _console()
    if not yes:
        capacity.dry_run_purchase(ec2, offering_id, platform)
        console.print(
            f"dry run: EC2 would sell {offering_id}; nothing was bought. Rerun with --yes to buy "
            "(charged up front, not refundable). After buying, deploy with: "
            "-c capacity=capacity-block -c capacity_reservation_id=<the id it prints>",
            soft_wrap=True,
        )
        return
    # A segmented offering yields one reservation per segment; a node group uses one of them.
    for reservation in capacity.purchase(ec2, offering_id, platform):
        flags = capacity.deploy_flags(
            availability_zone=reservation["AvailabilityZone"],
            instance_type=reservation["InstanceType"],
            count=int(reservation["TotalInstanceCount"]),
            reservation_id=reservation["CapacityReservationId"],
        )
        console.print(
            f"bought {offering_id}: reservation {reservation['CapacityReservationId']}, "
            f"{reservation['TotalInstanceCount']} x {reservation['InstanceType']} in "
            f"{reservation['AvailabilityZone']}, {reservation.get('StartDate')} to "
            f"{reservation.get('EndDate')} (EKS drains the nodes 40 minutes before the end)",
            soft_wrap=True,
        )
        console.print(f"deploy with: {flags}", soft_wrap=True)


data_app = typer.Typer(help="Stage training data in S3.", no_args_is_help=True)
app.add_typer(data_app, name="data")


@data_app.command("stage")
def data_stage(
    source: Annotated[
        Path,
        typer.Argument(
            help="A text file, a directory of *.txt files (byte tokenizer), or a directory "
            "written by `trn-train prepare-data` (staged as it is)."
        ),
    ],
    dest: Annotated[
        str, typer.Argument(help="s3://BUCKET/PREFIX, or with --env a prefix in its bucket.")
    ],
    env: Annotated[
        str | None, typer.Option("--env", help="Environment whose datasets bucket to use.")
    ] = None,
    shard_tokens: Annotated[
        int, typer.Option("--shard-tokens", min=1, help="Tokens per shard.")
    ] = 1 << 24,
    part_size_mib: Annotated[
        int, typer.Option("--part-size-mib", min=5, help="Multipart part size in MiB.")
    ] = 8,
    work_dir: Annotated[
        Path | None,
        typer.Option("--work-dir", help="Keep the shards here; default: a temporary directory."),
    ] = None,
    region: RegionOption = None,
) -> None:
    """Tokenize and shard text in the trainer's format (or take a directory `trn-train
    prepare-data` wrote, after checking every file's SHA-256) and upload it; a rerun skips files
    that are already uploaded intact."""
    # trnctl.data imports the trainer and with it torch, which only this command needs.
    from trnctl import data

    if env is not None:
        outputs = environment.lookup(env, aws.client("ssm", _region(region)))
        location = transfer.S3Prefix.parse(f"s3://{outputs.datasets_bucket}/{dest.lstrip('/')}")
        region = outputs.region
    else:
        location = transfer.S3Prefix.parse(dest)
    prepared = data.is_prepared(source)
    origin = "prepared" if prepared else f"{len(data.source_files(source))} files"
    s3 = aws.client("s3", _region(region))
    with tempfile.TemporaryDirectory(prefix="trnctl-stage-") as scratch:
        workdir = source if prepared else (work_dir or Path(scratch))
        manifest = (
            data.check_prepared(source)
            if prepared
            else data.build_shards(source, workdir, shard_tokens=shard_tokens)
        )
        items = data.uploads(workdir, manifest, location)
        digest = data.manifest_sha256(workdir)
        todo = _upload(s3, items, location, part_size_mib)
    tokens = sum(int(s["tokens"]) for s in manifest["shards"])
    _console().print(
        f"staged {len(manifest['shards'])} shards ({tokens:,} tokens, {origin}) at "
        f"{location}: uploaded {len(todo)}, skipped {len(items) - len(todo)} "
        f"already intact; manifest sha256 {digest}",
        soft_wrap=True,
    )


def _upload(
    s3: Any, items: list[transfer.Upload], location: transfer.S3Prefix, part_mib: int
) -> list[transfer.Upload]:
    """Uploads the items ``location`` does not hold intact, with a progress bar on a terminal;
    returns those it uploaded."""
    todo = transfer.pending(s3, items, location)
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


preview_app = typer.Typer(
    help="Preview environments: stacks tagged trn-platform:preview and trn-platform:expires-at.",
    no_args_is_help=True,
)
app.add_typer(preview_app, name="preview")
ProjectOption = Annotated[
    str | None, typer.Option("--project", help="Only this project; default: every project.")
]


def _preview_table(title: str, stacks: list[previews.PreviewStack], now: datetime) -> Table:
    table = Table(title=title)
    for column in ("stack", "project", "expires-at", "state", "status"):
        table.add_column(column, overflow="fold")
    for stack in stacks:
        table.add_row(
            stack.name,
            stack.project or "-",
            stack.expires_raw or "-",
            str(stack.state(now)),
            stack.status,
        )
    return table


@preview_app.command("list")
def preview_list(project: ProjectOption = None, region: RegionOption = None) -> None:
    """List preview stacks with their project, expiry and state."""
    now = datetime.now(UTC)
    stacks = previews.preview_stacks(aws.client("cloudformation", _region(region)))
    shown = [s for s in stacks if project is None or s.project == project]
    _console().print(_preview_table(f"preview stacks at {previews.format_expiry(now)}", shown, now))


@preview_app.command("extend")
def preview_extend(
    project: Annotated[str, typer.Argument(help="The preview's project name.")],
    hours: Annotated[int, typer.Option("--hours", help="Hours to add (1-336).")],
    region: RegionOption = None,
) -> None:
    """Move the expiry of a project's stacks by --hours (from now if already expired)."""
    cfn = aws.client("cloudformation", _region(region))
    changed = previews.extend(cfn, project, hours, datetime.now(UTC))
    console = _console()
    for stack, expiry in changed:
        console.print(
            f"{stack.name}: expires-at {previews.format_expiry(expiry)} (stack update started)",
            soft_wrap=True,
        )


@preview_app.command("reap")
def preview_reap(
    project: ProjectOption = None,
    yes: Annotated[bool, typer.Option("--yes", help="Delete; without it, a dry run.")] = False,
    region: RegionOption = None,
) -> None:
    """Delete expired preview stacks (both tags, expiry passed); a dry run unless --yes.

    Stacks with one tag or a malformed expiry are reported, never deleted, and make the exit
    code 1 so that a scheduled reaper gets noticed.
    """
    now = datetime.now(UTC)
    cfn = aws.client("cloudformation", _region(region))
    plan = previews.plan_reap(previews.preview_stacks(cfn), now, project)
    console = _console()
    for stack in plan.malformed:
        console.print(
            f"left alone: {stack.name} has a malformed {TAG_EXPIRES_AT} "
            f"{stack.expires_raw!r} (expected ISO-8601 UTC, e.g. 2026-12-01T12:00:00Z)",
            soft_wrap=True,
        )
    for stack in plan.incomplete:
        missing = TAG_EXPIRES_AT if stack.project else TAG_PREVIEW
        console.print(f"left alone: {stack.name} lacks the tag {missing}", soft_wrap=True)
    if not plan.delete:
        console.print(f"nothing to reap ({len(plan.active)} preview stacks not yet expired)")
    elif not yes:
        for stack in plan.delete:
            console.print(f"would delete: {stack.name} (expired {stack.expires_raw})")
        console.print("dry run: nothing was deleted; rerun with --yes to delete")
    else:
        previews.reap(cfn, plan, on_deleted=lambda stack: console.print(f"deleted: {stack.name}"))
    if plan.malformed or plan.incomplete:
        raise typer.Exit(int(ExitCode.FAILED))


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


def _outputs(env: str, region: str | None) -> EnvironmentOutputs:
    return environment.lookup(env, aws.client("ssm", _region(region)))


def _cluster(outputs: EnvironmentOutputs) -> kube.Cluster:
    api = kube.connect(outputs.cluster_name, outputs.region)
    return kube.Cluster(api, outputs.namespace)


def _spec(outputs: EnvironmentOutputs) -> trn_catalog.InstanceSpec:
    try:
        return trn_catalog.get(outputs.instance_type)
    except trn_catalog.UnknownInstanceTypeError as error:
        raise TrnctlError(
            f"environment {outputs.environment!r}: {error}", ExitCode.FAILED
        ) from None


model_app = typer.Typer(
    help="Stage Hugging Face models in the environment's datasets bucket.", no_args_is_help=True
)
app.add_typer(model_app, name="model")


@model_app.command("stage")
def model_stage(
    source: Annotated[
        Path,
        typer.Argument(
            help="A Hugging Face model directory: config.json, safetensors weights, tokenizer."
        ),
    ],
    name: Annotated[
        str, typer.Argument(help="The model's name: jobs take it as --model models/NAME.")
    ],
    env: EnvOption,
    part_size_mib: Annotated[
        int, typer.Option("--part-size-mib", min=5, help="Multipart part size in MiB.")
    ] = 8,
    region: RegionOption = None,
) -> None:
    """Check a model directory and upload it to models/NAME/ in the datasets bucket (mounted at
    /datasets in jobs); a rerun skips files already uploaded intact."""
    models.validate_name(name)
    model = models.inspect(source)
    outputs = _outputs(env, region)
    location = models.prefix(outputs.datasets_bucket, name)
    items = models.uploads(model, location)
    todo = _upload(aws.client("s3", outputs.region), items, location, part_size_mib)
    skipped = f"; left out {', '.join(model.skipped)}" if model.skipped else ""
    _console().print(
        f"staged {model.architecture} {name} ({len(items)} files, "
        f"{sum(item.size for item in items):,} bytes) at {location}: uploaded {len(todo)}, "
        f"skipped {len(items) - len(todo)} already intact{skipped}; submit with: trnctl job "
        f"submit --env {env} --model models/{name} --data ...",
        soft_wrap=True,
    )


job_app = typer.Typer(
    help="Training jobs (Kubeflow Trainer TrainJobs on the neuron-torch runtime).",
    no_args_is_help=True,
)
app.add_typer(job_app, name="job")


@job_app.command("submit")
def job_submit(
    env: EnvOption,
    data: Annotated[
        str,
        typer.Option(
            "--data",
            help="Dataset prefix in the environment's datasets bucket (as `data stage --env` "
            "takes it; mounted at /datasets), or an absolute path in the pod.",
        ),
    ],
    preset: Annotated[
        str | None, typer.Option("--preset", help="Model preset of trn-train run.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="models/NAME: a Hugging Face model staged with `trnctl model stage` "
            "(instead of --preset); read at /datasets/models/NAME.",
        ),
    ] = None,
    lora_rank: Annotated[
        int | None, typer.Option("--lora-rank", help="LoRA adapters of this rank (>= 1).")
    ] = None,
    lora_alpha: Annotated[
        float | None, typer.Option("--lora-alpha", help="LoRA scaling alpha (> 0).")
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option("--nodes", min=1, help="trn nodes; default: the environment's node count."),
    ] = None,
    image: ImageOption = None,
    max_steps: Annotated[int | None, typer.Option("--max-steps", min=1)] = None,
    checkpoint_every: Annotated[int | None, typer.Option("--checkpoint-every", min=0)] = None,
    log_every: Annotated[int | None, typer.Option("--log-every", min=1)] = None,
    seed: Annotated[int | None, typer.Option("--seed")] = None,
    seq_len: Annotated[
        int | None,
        typer.Option(
            "--seq-len",
            min=1,
            help="Tokens per sequence; default: the preset's, or 2048 capped at the model's "
            "max_position_embeddings.",
        ),
    ] = None,
    eval_every: Annotated[
        int | None,
        typer.Option(
            "--eval-every",
            min=0,
            help="Held-out loss every N steps (data prepared with --eval-fraction); 0: off.",
        ),
    ] = None,
    eval_batches: Annotated[
        int | None, typer.Option("--eval-batches", min=1, help="Held-out batches per eval.")
    ] = None,
    precompile: Annotated[
        bool,
        typer.Option(
            "--precompile",
            help="First run `trn-train compile` on the nodes (a few steps, nothing saved) to "
            "fill the shared compile cache, after checking host memory; then train.",
        ),
    ] = False,
    name: NameOption = None,
    dry_run: DryRunOption = False,
    region: RegionOption = None,
) -> None:
    """Submit a training job from a preset or a staged model: one pod per trn node with all its
    Neuron devices and EFA interfaces; checkpoints and metrics go to /fsx under the job's name."""
    # trainer.config imports only the standard library: the presets without torch.
    from trainer.config import PRESETS

    if preset is not None and preset not in PRESETS:
        raise TrnctlError(f"--preset {preset!r} is unknown; known: {', '.join(PRESETS)}")
    model_name = models.name_of(model) if model is not None else None
    args = jobs.TrainingArgs(
        preset,
        data,
        max_steps,
        checkpoint_every,
        log_every,
        seed,
        model=model_name,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        seq_len=seq_len,
        eval_every=eval_every,
        eval_batches=eval_batches,
    )
    outputs = _outputs(env, region)
    spec = _spec(outputs)
    count = outputs.trn_nodes if nodes is None else nodes
    if count > outputs.trn_nodes:
        raise TrnctlError(
            f"--nodes {count} is more than the {outputs.trn_nodes} trn nodes of {env}; the pods "
            "would wait for capacity forever (scale the node group first)"
        )
    if model_name is not None:
        s3 = aws.client("s3", outputs.region)
        models.require_staged(s3, outputs.datasets_bucket, model_name, env)
    start = preset or model_name or ""
    job_name = name or jobs.generated_name("train", start, datetime.now(UTC))
    label = jobs.PRESET_LABEL if preset is not None else jobs.MODEL_LABEL
    job = jobs.render(
        name=jobs.validate_name(job_name),
        outputs=outputs,
        nodes=count,
        args=args.argv(job_name),
        image=image,
        labels={label: start},
        env={jobs.PRECOMPILE_ENV: "1"} if precompile else None,
    )
    if dry_run:
        typer.echo(jobs.to_yaml(job), nl=False)
        return
    cluster = _cluster(outputs)
    drift = jobs.runtime_drift(cluster.runtime(), spec)
    if drift:
        raise TrnctlError(
            f"TrainingRuntime neuron-torch in {outputs.namespace} does not match the catalog for "
            f"{spec.name}: {'; '.join(drift)}; redeploy the workloads stack",
            ExitCode.FAILED,
        )
    cluster.create(job)
    what = f"preset {preset}" if preset is not None else f"model models/{model_name}"
    _console().print(
        f"submitted TrainJob {job_name}: {count} x {spec.name}, {what}, in "
        f"{outputs.namespace} on {outputs.cluster_name}; follow it with: trnctl job logs "
        f"{job_name} --env {env} --follow",
        soft_wrap=True,
    )


def _wait(
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


@job_app.command("export")
def job_export(
    name: Annotated[str, typer.Argument(help="The TrainJob (a --model run) to export.")],
    env: EnvOption,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="Wait for the export to finish.")
    ] = True,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the export.")
    ] = 1800,
    poll: Annotated[float, typer.Option("--poll", min=0.01, help="Seconds between polls.")] = 10,
    image: Annotated[
        str | None,
        typer.Option("--image", help="Training image URI; default: the training job's."),
    ] = None,
    dry_run: DryRunOption = False,
    region: RegionOption = None,
) -> None:
    """Write the newest valid checkpoint of a --model job as a Hugging Face model directory
    beside its checkpoints (a one-node TrainJob running trn-train export); print where it is."""
    jobs.validate_name(name)
    outputs = _outputs(env, region)
    export = jobs.export_name(name, datetime.now(UTC))
    if dry_run:
        job = jobs.render_export(job_name=name, export=export, outputs=outputs, image=image)
        typer.echo(jobs.to_yaml(job), nl=False)
        return
    cluster = _cluster(outputs)
    source = cluster.get(name)
    labels = source.get("metadata", {}).get("labels") or {}
    if jobs.MODEL_LABEL not in labels:
        raise TrnctlError(
            f"TrainJob {name!r} was not submitted with --model (it has no {jobs.MODEL_LABEL} "
            "label): only runs from a Hugging Face model have a Hugging Face directory to export"
        )
    image = image or source.get("spec", {}).get("trainer", {}).get("image")
    cluster.create(jobs.render_export(job_name=name, export=export, outputs=outputs, image=image))
    where = jobs.export_dir(name, export)
    bucket = f"s3://{outputs.checkpoints_bucket}/{name}/export/{export}/"
    if not wait:
        _console().print(
            f"submitted export TrainJob {export}: it writes {where} (in pods; FSx exports it to "
            f"{bucket}); follow it with: trnctl job logs {export} --env {env} --follow",
            soft_wrap=True,
        )
        return
    typer.echo(f"submitted export TrainJob {export}", err=True)
    state = _wait(cluster, export, "export job", env, timeout, poll)
    if state != "Complete":
        raise TrnctlError(
            f"export job {export} ended {state}; see trnctl job logs {export} --env {env}",
            ExitCode.FAILED,
        )
    _console().print(
        f"exported the newest checkpoint of {name} as a Hugging Face model: {where} (in pods), "
        f"{bucket} (FSx exports it to the checkpoints bucket)",
        soft_wrap=True,
    )


def _status_tables(job: dict[str, Any], pods: list[jobs.NodePod]) -> tuple[Table, Table]:
    name = job["metadata"]["name"]
    conditions = Table(title=f"TrainJob {name}")
    for column in ("condition", "status", "reason", "since", "message"):
        conditions.add_column(column, overflow="fold")
    for c in jobs.conditions(job):
        conditions.add_row(c.type, c.status, c.reason, c.since, c.message)
    nodes = Table(title=f"pods of {name}")
    for column in ("node", "pod", "phase", "instance", "restarts", "detail"):
        nodes.add_column(column, overflow="fold")
    for p in pods:
        nodes.add_row(str(p.index), p.name, p.phase, p.node, str(p.restarts), p.detail)
    return conditions, nodes


@job_app.command("status")
def job_status(
    name: Annotated[str, typer.Argument(help="TrainJob name.")],
    env: EnvOption,
    region: RegionOption = None,
) -> None:
    """Show a job's conditions and its pod per node; exit 1 if the job failed."""
    jobs.validate_name(name)
    cluster = _cluster(_outputs(env, region))
    job = cluster.get(name)
    pods = jobs.node_pods(cluster.pods(name))
    console = _console()
    for table in _status_tables(job, pods):
        console.print(table)
    if jobs.outcome(job) == "Failed":
        raise typer.Exit(int(ExitCode.FAILED))


@job_app.command("logs")
def job_logs(
    name: Annotated[str, typer.Argument(help="TrainJob name.")],
    env: EnvOption,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until it ends.")] = False,
    node: Annotated[int, typer.Option("--node", min=0, help="Node index; 0 is rank 0.")] = 0,
    region: RegionOption = None,
) -> None:
    """Print the log of a job's node pod (rank 0 by default)."""
    jobs.validate_name(name)
    cluster = _cluster(_outputs(env, region))
    cluster.get(name)  # a clear "not found" for a wrong name
    pods = jobs.node_pods(cluster.pods(name, index=node))
    if not pods:
        raise TrnctlError(
            f"TrainJob {name!r} has no pod for node {node} yet; see trnctl job status {name} "
            f"--env {env}",
            ExitCode.NOT_FOUND,
        )
    pod = pods[-1].name  # the newest attempt when a restart left several
    if follow:
        for line in cluster.follow(pod):
            typer.echo(line)
    else:
        typer.echo(cluster.log(pod), nl=False)


@app.command("validate")
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
    dry_run: DryRunOption = False,
    region: RegionOption = None,
) -> None:
    """Run a validation job on every trn node (Neuron devices and cores, EFA interfaces, an
    all-reduce across all ranks) and check it against the catalog; exit 1 if a node fails."""
    outputs = _outputs(env, region)
    spec = _spec(outputs)
    job = validation.render(
        outputs, now=datetime.now(UTC), name=name, image=image, size_mib=size_mib
    )
    job_name = job["metadata"]["name"]
    if dry_run:
        typer.echo(jobs.to_yaml(job), nl=False)
        return
    cluster = _cluster(outputs)
    cluster.create(job)
    typer.echo(f"submitted validation job {job_name} on {outputs.trn_nodes} nodes", err=True)
    state = _wait(cluster, job_name, "validation job", env, timeout, poll)
    results = [
        validation.judge(p.index, p.name, cluster.log(p.name), spec)
        for p in jobs.node_pods(cluster.pods(job_name))
    ]
    table = Table(title=f"validate {env}: {outputs.trn_nodes} x {spec.name} ({job_name}: {state})")
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
    _console().print(table)
    failures = [f"node {r.index}: {'; '.join(r.problems)}" for r in results if not r.passed]
    failures += [f"node {i}: no pod" for i in validation.missing_nodes(results, outputs.trn_nodes)]
    if failures:
        raise TrnctlError(
            f"validation failed on {len(failures)} of {outputs.trn_nodes} nodes: "
            + " | ".join(failures),
            ExitCode.FAILED,
        )
    if state != "Complete":
        raise TrnctlError(f"validation job {job_name} ended {state}", ExitCode.FAILED)


@app.command("cost")
def cost_command(
    instance_type: InstanceTypeOption,
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="Instances in the job.")],
    hours: Annotated[float | None, typer.Option("--hours", help="Wall-clock hours.")] = None,
    tokens: Annotated[
        float | None, typer.Option("--tokens", help="Tokens to train on (with --tokens-per-s).")
    ] = None,
    tokens_per_s: Annotated[
        float | None, typer.Option("--tokens-per-s", help="Throughput of the whole job.")
    ] = None,
    live: Annotated[
        bool, typer.Option("--live", help="Also ask the AWS Pricing API for On-Demand.")
    ] = False,
    region: RegionOption = None,
) -> None:
    """Cost of an experiment at On-Demand and Capacity Block rates; exit 1 if nothing prices it."""
    resolved = _region(region)
    duration = cost.run_hours(hours, tokens, tokens_per_s)
    lines = cost.from_table(instance_type, resolved, nodes, duration)
    if live:
        rate = cost.live_on_demand(
            aws.client("pricing", cost.PRICING_REGION), instance_type, resolved
        )
        note = "AWS Pricing API, now" if rate is not None else "the Pricing API lists no rate"
        lines.append(cost.Line("on-demand (live)", rate, nodes * duration, note))
    table = Table(title=f"{nodes} x {instance_type} in {resolved} for {duration:,.2f} h")
    for column in ("market", "$/instance-h", "instance-h", "total $", "source"):
        table.add_column(column, overflow="fold")
    for line in lines:
        rate_text = "-" if line.usd_per_hour is None else f"{line.usd_per_hour:,.2f}"
        total = line.total
        table.add_row(
            line.market,
            rate_text,
            f"{line.instance_hours:,.2f}",
            "-" if total is None else f"{total:,.2f}",
            line.note,
        )
    _console().print(table)
    if all(line.total is None for line in lines):
        hint = "" if live else "; try --live"
        raise TrnctlError(
            f"no price for {instance_type} in {resolved} in the catalog{hint}", ExitCode.FAILED
        )


def main() -> None:
    app()
