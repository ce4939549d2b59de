"""`trnctl pipeline create|list|show|run-now|pause|resume|delete|history|tick`: scheduled
fine-tuning with an evaluation gate (see :mod:`trnctl.pipelines` and :mod:`trnctl.pipeline_run`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table

from trn_catalog.outputs import EnvironmentOutputs
from trnctl import aws, kube, pipeline_run, pipelines
from trnctl.commands import common
from trnctl.commands.common import EnvOption, ImageOption, RegionOption
from trnctl.errors import ExitCode, TrnctlError

app = typer.Typer(
    help="Scheduled fine-tuning: train on the newest data, evaluate, promote only if better.",
    no_args_is_help=True,
)

NameArgument = Annotated[str, typer.Argument(help="The pipeline's name.")]


def _cronjobs(outputs: EnvironmentOutputs) -> kube.CronJobs:
    if kube.in_cluster():
        return kube.CronJobs(kube.connect_in_cluster(), outputs.namespace)
    return kube.CronJobs(kube.connect(outputs.cluster_name, outputs.region), outputs.namespace)


@app.command("create")
def pipeline_create(
    name: NameArgument,
    env: EnvOption,
    schedule: Annotated[
        str,
        typer.Option(
            "--schedule",
            help="Cron schedule (minute hour day-of-month month day-of-week, or @weekly...), "
            "e.g. '0 3 * * 1': Mondays at 03:00 in --time-zone.",
        ),
    ],
    model: Annotated[
        str, typer.Option("--model", help="The base model: models/NAME (in service) or @vN.")
    ],
    data: Annotated[
        str, typer.Option("--data", help="datasets/NAME: each run trains on its newest version.")
    ],
    eval_data: Annotated[
        str,
        typer.Option(
            "--eval-data", help="datasets/NAME[@vN]: both models are evaluated on all of it."
        ),
    ],
    gate: Annotated[
        str,
        typer.Option(
            "--gate",
            help="When the candidate is promoted, e.g. 'eval_loss <= current - 0.01' (current: "
            "the model in service, or before one the base model).",
        ),
    ],
    register_as: Annotated[
        str | None,
        typer.Option(
            "--register-as",
            help="Register candidates as models/NAME; default: the pipeline's name.",
        ),
    ] = None,
    time_zone: Annotated[
        str, typer.Option("--time-zone", help="IANA time zone of the schedule.")
    ] = "Etc/UTC",
    nodes: Annotated[int, typer.Option("--nodes", help="trn nodes per training run.")] = 1,
    capacity_wait_minutes: Annotated[
        int,
        typer.Option(
            "--capacity-wait-minutes",
            help="A run whose training finds no free trn node this long is skipped.",
        ),
    ] = pipelines.DEFAULT_CAPACITY_WAIT_MINUTES,
    max_steps: Annotated[int | None, typer.Option("--max-steps", min=1)] = None,
    epochs: Annotated[int | None, typer.Option("--epochs", min=1)] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", min=1)] = None,
    seed: Annotated[int | None, typer.Option("--seed")] = None,
    lora_rank: Annotated[int | None, typer.Option("--lora-rank")] = None,
    lora_alpha: Annotated[float | None, typer.Option("--lora-alpha")] = None,
    eval_every: Annotated[int | None, typer.Option("--eval-every", min=0)] = None,
    image: ImageOption = None,
    paused: Annotated[bool, typer.Option("--paused", help="Create it paused.")] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the CronJob as YAML: read the environment's outputs (SSM), apply nothing.",
        ),
    ] = False,
    region: RegionOption = None,
) -> None:
    """Create (or replace) a pipeline: a CronJob in the training namespace whose runs train on
    the newest data, evaluate the candidate against the model in service and promote it only
    when the gate holds."""
    training = {
        key: value
        for key, value in {
            "max_steps": max_steps,
            "epochs": epochs,
            "seq_len": seq_len,
            "seed": seed,
            "lora_rank": lora_rank,
            "lora_alpha": lora_alpha,
            "eval_every": eval_every,
        }.items()
        if value is not None
    }
    pipeline = pipelines.Pipeline(
        name=name,
        environment=env,
        schedule=schedule,
        model=model,
        data=data,
        eval_data=eval_data,
        gate=gate,
        register_as=register_as or "",
        time_zone=time_zone,
        nodes=nodes,
        capacity_wait_minutes=capacity_wait_minutes,
        image=image or "",
        training=training,
    )
    outputs = common.outputs_of(env, region)
    cronjob = pipelines.render_cronjob(pipeline, outputs, suspend=paused)
    if dry_run:
        typer.echo(yaml.safe_dump(cronjob, sort_keys=False), nl=False)
        return
    pipelines.check_data_exists(aws.client("s3", outputs.region), outputs.datasets_bucket, pipeline)
    done = _cronjobs(outputs).apply(cronjob)
    common.console().print(
        f"{done} pipeline {name} (CronJob {name} in {outputs.namespace}): {pipeline.schedule} "
        f"{pipeline.time_zone}, {pipeline.data} -> models/{pipeline.register_as} gated on "
        f"{pipeline.gate_of()}; run it now with: trnctl pipeline run-now {name} --env {env}",
        soft_wrap=True,
    )


@app.command("list")
def pipeline_list(env: EnvOption, region: RegionOption = None) -> None:
    """The environment's pipelines: schedule, paused or not, last run, what they train."""
    outputs = common.outputs_of(env, region)
    found = _cronjobs(outputs).list(f"{pipelines.PIPELINE_LABEL}")
    table = Table(title=f"pipelines in {env}")
    for column in ("name", "schedule", "paused", "last scheduled", "model", "data", "gate"):
        table.add_column(column, overflow="fold")
    for cronjob in sorted(found, key=lambda c: c["metadata"]["name"]):
        pipeline = pipelines.pipeline_of(cronjob)
        spec, status = cronjob["spec"], cronjob.get("status") or {}
        table.add_row(
            pipeline.name,
            f"{spec['schedule']} {spec.get('timeZone', '')}".strip(),
            "yes" if spec.get("suspend") else "no",
            str(status.get("lastScheduleTime") or "-"),
            pipeline.model,
            pipeline.data,
            pipeline.gate,
        )
    common.console().print(table)


@app.command("show")
def pipeline_show(name: NameArgument, env: EnvOption, region: RegionOption = None) -> None:
    """The pipeline's definition, whether it is paused, and its last run (JSON)."""
    outputs = common.outputs_of(env, region)
    cronjob = _cronjobs(outputs).get(name)
    pipeline = pipelines.pipeline_of(cronjob)
    runs = pipeline_run.history(aws.client("s3", outputs.region), outputs.datasets_bucket, name)
    shown = {
        "pipeline": json.loads(pipeline.to_json()),
        "paused": bool(cronjob["spec"].get("suspend")),
        "last_schedule_time": (cronjob.get("status") or {}).get("lastScheduleTime"),
        "last_run": runs[-1] if runs else None,
    }
    typer.echo(json.dumps(shown, indent=2, sort_keys=True))


@app.command("run-now")
def pipeline_run_now(name: NameArgument, env: EnvOption, region: RegionOption = None) -> None:
    """Start a run now, outside the schedule (a Job from the CronJob's template)."""
    outputs = common.outputs_of(env, region)
    cronjobs = _cronjobs(outputs)
    cronjob = cronjobs.get(name)
    job_name = f"{name}-now-{datetime.now(UTC):%m%d%H%M%S}"
    cronjobs.create_job(pipelines.manual_job(cronjob, job_name))
    common.console().print(
        f"started run {pipeline_run.run_id(job_name)} of pipeline {name} (Job {job_name}); "
        f"follow it with: trnctl pipeline history {name} --env {env}",
        soft_wrap=True,
    )


@app.command("pause")
def pipeline_pause(name: NameArgument, env: EnvOption, region: RegionOption = None) -> None:
    """Stop scheduling runs (a run in progress goes on)."""
    _cronjobs(common.outputs_of(env, region)).suspend(name, True)
    common.console().print(f"paused pipeline {name}")


@app.command("resume")
def pipeline_resume(name: NameArgument, env: EnvOption, region: RegionOption = None) -> None:
    """Schedule runs again."""
    _cronjobs(common.outputs_of(env, region)).suspend(name, False)
    common.console().print(f"resumed pipeline {name}")


@app.command("delete")
def pipeline_delete(name: NameArgument, env: EnvOption, region: RegionOption = None) -> None:
    """Delete the pipeline's CronJob; its run records and the models it registered stay."""
    _cronjobs(common.outputs_of(env, region)).delete(name)
    common.console().print(
        f"deleted pipeline {name}; its run records stay under pipelines/{name}/ in the datasets "
        "bucket"
    )


_HISTORY_COLUMNS = ("run", "started", "status", "data", "candidate", "loss", "current", "reason")


@app.command("history")
def pipeline_history(name: NameArgument, env: EnvOption, region: RegionOption = None) -> None:
    """Every run of the pipeline: when, its outcome, the data, the candidate and both losses."""
    pipelines.check_name(name)
    outputs = common.outputs_of(env, region)
    runs = pipeline_run.history(aws.client("s3", outputs.region), outputs.datasets_bucket, name)
    if not runs:
        raise TrnctlError(
            f"pipeline {name} has no runs in s3://{outputs.datasets_bucket}/"
            f"{pipeline_run.runs_prefix(name)}",
            ExitCode.NOT_FOUND,
        )
    table = Table(title=f"runs of pipeline {name}")
    for column in _HISTORY_COLUMNS:
        table.add_column(column, overflow="fold")
    for run in reversed(runs):
        table.add_row(*_history_row(run))
    common.console().print(table)


def _history_row(run: dict[str, Any]) -> list[str]:
    evaluation = run.get("evaluation") or {}
    candidate = (evaluation.get("candidate") or {}).get("loss")
    current = evaluation.get("current") or {}
    return [
        str(run.get("run")),
        str(run.get("started_at", "-")),
        str(run.get("status", "-")),
        str(run.get("data", "-")),
        str(run.get("candidate", "-")),
        "-" if candidate is None else f"{float(candidate):.4f}",
        "-" if "loss" not in current else f"{current.get('model')} {float(current['loss']):.4f}",
        str(run.get("reason", "-")),
    ]


@app.command("tick", hidden=True)
def pipeline_tick(
    name: NameArgument,
    env: EnvOption,
    job: Annotated[
        str | None,
        typer.Option(
            "--job",
            envvar=pipelines.JOB_ENV,
            help="The run's Job (the CronJob's pod: its batch.kubernetes.io/job-name label).",
        ),
    ] = None,
    spec: Annotated[
        str | None,
        typer.Option("--spec", envvar=pipelines.SPEC_ENV, help="The pipeline (JSON)."),
    ] = None,
    region: RegionOption = None,
) -> None:
    """Run (or resume) one run of the pipeline: what the pipeline's CronJob runs."""
    if not job or not spec:
        raise TrnctlError(
            f"pipeline tick runs in the pipeline's pod: {pipelines.JOB_ENV} and "
            f"{pipelines.SPEC_ENV} are not set"
        )
    pipeline = pipelines.Pipeline.from_json(spec)
    if pipeline.name != name:
        raise TrnctlError(f"the pipeline in {pipelines.SPEC_ENV} is {pipeline.name}, not {name}")
    outputs = common.outputs_of(env, region)
    record = pipeline_run.Run(pipeline, outputs, job, _services(outputs)).execute()
    common.console().print(
        f"run {record['run']} of pipeline {name}: {record['status']}: {record.get('reason', '')}",
        soft_wrap=True,
    )
    if record["status"] == pipeline_run.FAILED:
        raise typer.Exit(int(ExitCode.FAILED))


def _services(outputs: EnvironmentOutputs) -> pipeline_run.Services:
    api = (
        kube.connect_in_cluster()
        if kube.in_cluster()
        else kube.connect(outputs.cluster_name, outputs.region)
    )
    sagemaker = (
        aws.client("sagemaker", outputs.region) if outputs.model_registry == "sagemaker" else None
    )
    return pipeline_run.Services(
        s3=aws.client("s3", outputs.region),
        cluster=kube.Cluster(api, outputs.namespace),
        events=kube.CronJobs(api, outputs.namespace),
        sns=aws.client("sns", outputs.region),
        sagemaker=sagemaker,
    )
