"""`trnctl model stage|register|list|show|promote|rollback`: versioned Hugging Face models in the
datasets bucket and their registry (manifests with lineage and status)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from trn_catalog.outputs import EnvironmentOutputs
from trnctl import (
    aws,
    jobs,
    models,
    registry,
    sagemaker_registry,
    transfer,
    versioning,
)
from trnctl.commands import common
from trnctl.commands.common import (
    EnvOption,
    RegionOption,
)
from trnctl.errors import ExitCode, TrnctlError

app = typer.Typer(
    help="Versioned Hugging Face models in the environment's datasets bucket, and their registry.",
    no_args_is_help=True,
)

ReasonOption = Annotated[
    str, typer.Option("--reason", help="Why: recorded in the manifest's history with who.")
]


def _sagemaker(outputs: EnvironmentOutputs) -> Any | None:
    """A SageMaker client where the environment mirrors its registry there, else None."""
    return (
        aws.client("sagemaker", outputs.region) if outputs.model_registry == "sagemaker" else None
    )


def _mirror(
    outputs: EnvironmentOutputs, s3: Any, ref: versioning.Ref, record: dict[str, Any]
) -> None:
    sagemaker_registry.mirror(
        _sagemaker(outputs), s3, outputs.environment, outputs.datasets_bucket, ref, record
    )


@app.command("stage")
def model_stage(
    source: Annotated[
        Path,
        typer.Argument(
            help="A Hugging Face model directory: config.json, safetensors weights, tokenizer."
        ),
    ],
    name: Annotated[
        str,
        typer.Argument(help="The model's name: jobs take it as --model models/NAME[@vN]."),
    ],
    env: EnvOption,
    part_size_mib: Annotated[
        int, typer.Option("--part-size-mib", min=5, help="Multipart part size in MiB.")
    ] = 8,
    region: RegionOption = None,
) -> None:
    """Check a model directory and stage it as the next version models/NAME/vN/ in the datasets
    bucket (mounted at /datasets in jobs), promoted by you; the same files as an existing
    version are that version, and a rerun skips files already uploaded intact."""
    models.validate_name(name)
    ref = registry.model_ref(name, "NAME")
    model = models.inspect(source)
    outputs = common.outputs_of(env, region)
    s3 = aws.client("s3", outputs.region)

    def upload(
        items: list[transfer.Upload], where: transfer.S3Prefix, marker: str
    ) -> list[transfer.Upload]:
        return common.upload(s3, items, where, part_size_mib, marker=marker)

    staged = registry.stage_dir(
        s3, outputs.datasets_bucket, ref, model, by=aws.caller_arn(outputs.region), upload=upload
    )
    _mirror(outputs, s3, staged.version, staged.record)
    skipped = f"; left out {', '.join(model.skipped)}" if model.skipped else ""
    version = staged.version
    done = (
        f"already staged as {version} ({staged.record.get('status')}); no new version"
        if staged.reused
        else f"staged {model.architecture} {name} as {version} ({len(staged.items)} files, "
        f"{sum(item.size for item in staged.items):,} bytes) at "
        f"{version.prefix(outputs.datasets_bucket)}: uploaded {len(staged.uploaded)}, skipped "
        f"{len(staged.items) - len(staged.uploaded)} already intact; promoted"
    )
    common.console().print(
        f"{done}{skipped}; submit with: trnctl job submit --env {env} --model models/{name} "
        "--data ...",
        soft_wrap=True,
    )


@app.command("register")
def model_register(
    name: Annotated[str, typer.Argument(help="The model's name: the version is models/NAME@vN.")],
    job: Annotated[str, typer.Option("--job", help="The --model TrainJob that was exported.")],
    env: EnvOption,
    export: Annotated[
        str | None,
        typer.Option("--export", help="The export (its TrainJob name); default: the newest."),
    ] = None,
    reason: Annotated[
        str, typer.Option("--reason", help="Recorded in the manifest's history.")
    ] = "registered with trnctl model register",
    region: RegionOption = None,
) -> None:
    """Register a job's export (`trnctl job export`, as FSx exported it to the checkpoints
    bucket) as the next version of models/NAME, a candidate, with its lineage from the TrainJob:
    base model version, dataset version and manifest SHA-256, the run's configuration."""
    ref = registry.model_ref(name, "NAME")
    jobs.validate_name(job)
    outputs = common.outputs_of(env, region)
    s3 = aws.client("s3", outputs.region)
    where = _export_prefix(s3, outputs.checkpoints_bucket, job, export)
    source = common.cluster_of(outputs).get(job)
    staged = registry.register_export(
        s3,
        outputs.datasets_bucket,
        ref,
        where,
        by=aws.caller_arn(outputs.region),
        lineage=jobs.lineage(source),
        reason=reason,
    )
    _mirror(outputs, s3, staged.version, staged.record)
    what = "already registered as" if staged.reused else "registered"
    common.console().print(
        f"{what} {staged.version} ({staged.record.get('status')}) from {where}; promote it with: "
        f"trnctl model promote {staged.version} --env {env} --reason ...",
        soft_wrap=True,
    )


def _export_prefix(s3: Any, bucket: str, job: str, export: str | None) -> transfer.S3Prefix:
    """Where the export ``export`` of ``job`` is in the checkpoints bucket (default: the newest
    export there).

    Raises:
        TrnctlError: NOT_FOUND when the job has no export there.
    """
    top = f"{job}/export/"
    if export is None:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=top, Delimiter="/")
        names = sorted(
            p["Prefix"][len(top) :].rstrip("/") for p in listed.get("CommonPrefixes", [])
        )
        if not names:
            raise TrnctlError(
                f"job {job} has no export in s3://{bucket}/{top} (FSx exports /fsx/checkpoints "
                f"there); export it first with: trnctl job export {job} --env ...",
                ExitCode.NOT_FOUND,
            )
        export = names[-1]
    jobs.validate_name(export)
    return transfer.S3Prefix(bucket, f"{top}{export}/")


def _versions(s3: Any, bucket: str, name: str) -> tuple[versioning.Ref, dict[int, dict[str, Any]]]:
    ref = registry.model_ref(name, "NAME")
    found = versioning.records(s3, bucket, ref)
    if not found:
        raise TrnctlError(
            f"{ref.root} has no versions; stage one with: trnctl model stage DIR {ref.name} "
            "--env ...",
            ExitCode.NOT_FOUND,
        )
    return ref, found


_LIST_COLUMNS = ("version", "status", "created", "by", "from", "base model", "dataset", "eval loss")


@app.command("list")
def model_list(
    name: Annotated[str, typer.Argument(help="The model: NAME or models/NAME.")],
    env: EnvOption,
    region: RegionOption = None,
) -> None:
    """Show a model's versions: status (and which one is in service), when and by whom made,
    where from, base model, dataset and evaluation."""
    outputs = common.outputs_of(env, region)
    s3 = aws.client("s3", outputs.region)
    ref, found = _versions(s3, outputs.datasets_bucket, name)
    serving = registry.in_service(found)
    table = Table(title=f"{ref.root} (in service: {_label(serving)})")
    for column in _LIST_COLUMNS:
        table.add_column(column, overflow="fold")
    for number, record in sorted(found.items(), reverse=True):
        lineage = record.get("lineage") or {}
        candidate = ((record.get("evaluation") or {}).get("candidate") or {}).get("loss")
        status = str(record.get("status", record.get("state", "-")))
        table.add_row(
            versioning.version_label(number) + (" (in service)" if number == serving else ""),
            status if record.get("state") == versioning.COMPLETE else "staging",
            str(record.get("created_at", "-")),
            str(record.get("created_by", "-")),
            registry.describe_source(record),
            str(lineage.get("base_model", "-")),
            str(lineage.get("dataset", "-")),
            "-" if candidate is None else f"{float(candidate):.4f}",
        )
    common.console().print(table)


def _label(number: int | None) -> str:
    return "none" if number is None else versioning.version_label(number)


@app.command("show")
def model_show(
    version: Annotated[str, typer.Argument(help="models/NAME@vN (or NAME@vN).")],
    env: EnvOption,
    region: RegionOption = None,
) -> None:
    """Print a version's manifest (JSON): lineage, evaluation, status and its history."""
    ref = registry.model_ref(version, "VERSION")
    outputs = common.outputs_of(env, region)
    s3 = aws.client("s3", outputs.region)
    record = registry.complete_record(s3, outputs.datasets_bucket, ref)
    serving = registry.in_service(versioning.records(s3, outputs.datasets_bucket, ref))
    shown = {**record, "in_service": serving == ref.version, "path": f"/datasets/{ref.path}"}
    typer.echo(json.dumps(shown, indent=2, sort_keys=True))


@app.command("promote")
def model_promote(
    version: Annotated[str, typer.Argument(help="models/NAME@vN (or NAME@vN).")],
    env: EnvOption,
    reason: ReasonOption,
    region: RegionOption = None,
) -> None:
    """Promote a version: it goes into service (models/NAME names it in jobs), recorded with
    who and why; SageMaker's package is Approved where the environment mirrors its registry."""
    ref = registry.model_ref(version, "VERSION")
    if ref.version is None:
        raise TrnctlError(f"VERSION {version!r}: name the version to promote, e.g. {ref}@v3")
    outputs = common.outputs_of(env, region)
    s3 = aws.client("s3", outputs.region)
    record, before = registry.promote(
        s3, outputs.datasets_bucket, ref, aws.caller_arn(outputs.region), reason
    )
    _mirror(outputs, s3, ref, record)
    common.console().print(
        f"promoted {ref}: in service now (before: {_label(before)})", soft_wrap=True
    )


@app.command("rollback")
def model_rollback(
    name: Annotated[str, typer.Argument(help="The model: NAME or models/NAME.")],
    env: EnvOption,
    reason: ReasonOption,
    region: RegionOption = None,
) -> None:
    """Reject the version in service; the promoted version below it goes back into service
    (SageMaker's packages follow: Rejected, and the older one still Approved)."""
    ref = registry.model_ref(name, "NAME")
    if ref.version is not None:
        raise TrnctlError(f"NAME {name!r}: rollback takes the model, not a version ({ref.root})")
    outputs = common.outputs_of(env, region)
    s3 = aws.client("s3", outputs.region)
    bucket = outputs.datasets_bucket
    rolled, now = registry.rollback(s3, bucket, ref, aws.caller_arn(outputs.region), reason)
    _mirror(outputs, s3, rolled, registry.complete_record(s3, bucket, rolled))
    common.console().print(
        f"rolled back {rolled} (rejected); in service now: {_label(now)}", soft_wrap=True
    )
