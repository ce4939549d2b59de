"""`trnctl job submit|export|status|logs|top|cost`: training jobs as Kubeflow Trainer TrainJobs."""

from __future__ import annotations

import dataclasses
import shlex
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Annotated, Any

import typer
from rich.table import Table

import trn_catalog
from trn_catalog import ultraservers
from trn_catalog.outputs import EnvironmentOutputs
from trnctl import (
    aws,
    datasets,
    jobs,
    registry,
    versioning,
)
from trnctl import code as codes
from trnctl.commands import common, job_watch
from trnctl.commands.common import (
    DryRunOption,
    EnvOption,
    ImageOption,
    NameOption,
    RegionOption,
)
from trnctl.errors import ExitCode, TrnctlError

app = typer.Typer(
    help="Training jobs (Kubeflow Trainer TrainJobs on the neuron-torch runtime, or with "
    "--target gpu on the GPU group's cuda-torch runtime).",
    no_args_is_help=True,
)
app.command("top")(job_watch.job_top)
app.command("cost")(job_watch.job_cost)


@app.command("submit")
def job_submit(
    env: EnvOption,
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="After --: a command to run instead of trn-train run (e.g. torchrun train.py), "
            "through the image's entrypoint: same environment, rendezvous, mounts and SIGTERM "
            "handling; TRN_CHECKPOINT_DIR names the job's checkpoint directory.",
            show_default=False,
        ),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            help="Dataset prefix in the environment's datasets bucket (as `data stage --env` "
            "takes it; mounted at /datasets), or an absolute path in the pod. Required "
            "without a command.",
        ),
    ] = None,
    code: Annotated[
        str | None,
        typer.Option(
            "--code",
            help="code/NAME: code staged with `trnctl code stage`; the command runs in "
            "/datasets/code/NAME.",
        ),
    ] = None,
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
        typer.Option(
            "--nodes",
            min=1,
            help="Nodes of the target's group; default: all of them (the environment's count).",
        ),
    ] = None,
    image: ImageOption = None,
    max_steps: Annotated[int | None, typer.Option("--max-steps", min=1)] = None,
    epochs: Annotated[
        int | None,
        typer.Option(
            "--epochs",
            min=1,
            help="Whole epochs of data of examples (prepared with --format jsonl or chat), each "
            "example once per epoch; the steps come from the data. Excludes --max-steps.",
        ),
    ] = None,
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
    task: Annotated[
        str | None,
        typer.Option(
            "--task",
            help="causal-lm (default); classify: a classifier on --model (a decoder with a "
            "score head, or a BERT encoder), data prepared with `trn-train prepare-data "
            "--format classify` (docs/classification.md); recommend: a two-tower model (no "
            "--preset or --model), data prepared with `trn-train prepare-data --format "
            "interactions` (docs/recommendation.md).",
        ),
    ] = None,
    class_weights: Annotated[
        str | None,
        typer.Option(
            "--class-weights",
            help="With --task classify: auto weighs each class by inverse frequency; none.",
        ),
    ] = None,
    best_metric: Annotated[
        str | None,
        typer.Option(
            "--best-metric",
            help="An eval figure (eval_loss; with --task classify eval_accuracy or, multi-label, "
            "eval_exact_match, eval_macro_f1, eval_micro_f1): each eval that improves it "
            "writes a checkpoint kept beside the newest, which `trnctl job export --best` "
            "exports. Needs --eval-every.",
        ),
    ] = None,
    precompile: Annotated[
        bool,
        typer.Option(
            "--precompile",
            help="First run `trn-train compile` on the nodes (a few steps, nothing saved) to "
            "fill the shared compile cache, after checking host memory; then train.",
        ),
    ] = False,
    target: Annotated[
        str,
        typer.Option(
            "--target",
            help="trn: the trn node group (neuron-torch runtime); gpu: the environment's GPU "
            "node group (cuda-torch runtime, the CUDA image, one rank per GPU), for "
            "side-by-side runs.",
        ),
    ] = jobs.TRN,
    lnc: Annotated[
        int | None,
        typer.Option(
            "--lnc",
            help="Logical NeuronCore setting, 1 or 2 (trn2/trn3): one rank per logical core. "
            "With devices=dra the job picks its runtime by it (neuron-torch-lnc1 for 1); on "
            "the device-plugin path it must be the nodes' setting. Default: the environment's.",
        ),
    ] = None,
    ultraserver: Annotated[
        bool,
        typer.Option(
            "--ultraserver",
            help="Place every pod inside one UltraServer (environments with UltraServer "
            "blocks, devices=plugin); --nodes defaults to one UltraServer's servers.",
        ),
    ] = False,
    name: NameOption = None,
    dry_run: DryRunOption = False,
    region: RegionOption = None,
) -> None:
    """Submit a training job from a preset or a staged model, or one that runs your own command
    (after --): one pod per node of the target's group (trn by default) with all its Neuron
    devices or GPUs and EFA interfaces; checkpoints and metrics go to /fsx under the job's
    name."""
    jobs.check_target(target)
    if target == jobs.GPU:
        _refuse_on_gpu(
            {"--precompile": precompile, "--lnc": lnc is not None, "--ultraserver": ultraserver}
        )
    if command:
        trainer_only = {
            "--preset": preset is not None,
            "--model": model is not None,
            "--data": data is not None,
            "--lora-rank": lora_rank is not None,
            "--lora-alpha": lora_alpha is not None,
            "--max-steps": max_steps is not None,
            "--epochs": epochs is not None,
            "--checkpoint-every": checkpoint_every is not None,
            "--log-every": log_every is not None,
            "--seed": seed is not None,
            "--seq-len": seq_len is not None,
            "--eval-every": eval_every is not None,
            "--eval-batches": eval_batches is not None,
            "--task": task is not None,
            "--class-weights": class_weights is not None,
            "--best-metric": best_metric is not None,
            "--precompile": precompile,
        }
        _submit_command(
            env=env,
            command=command,
            code=code,
            refused=[flag for flag, given in trainer_only.items() if given],
            nodes=nodes,
            image=image,
            name=name,
            dry_run=dry_run,
            region=region,
            target=target,
            lnc=lnc,
            ultraserver=ultraserver,
        )
        return
    if code is not None:
        raise TrnctlError(
            "--code needs a command after -- (the staged code's program, e.g. -- torchrun "
            "train.py); trn-train run takes --preset or --model"
        )
    if data is None:
        raise TrnctlError("--data is required to run trn-train (or give your own command after --)")
    # trainer.config imports only the standard library: the presets without torch.
    from trainer.config import PRESETS

    if preset is not None and preset not in PRESETS:
        raise TrnctlError(f"--preset {preset!r} is unknown; known: {', '.join(PRESETS)}")
    model_ref = registry.model_ref(model, "--model", bare=False) if model is not None else None
    model_name = model_ref.name if model_ref is not None else None
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
        epochs=epochs,
        task=task,
        class_weights=class_weights,
        best_metric=best_metric,
    )
    outputs = common.outputs_of(env, region)
    spec = _spec_of(outputs, target)
    count = _node_count(outputs, nodes, target, ultraserver)
    args, notes, what = _resolve(args, outputs, model, env)
    start = preset or model_name or task or ""
    job_name = name or jobs.generated_name("train", start, datetime.now(UTC))
    label = jobs.PRESET_LABEL if preset is not None else jobs.MODEL_LABEL
    if task == jobs.RECOMMEND:
        label = jobs.TASK_LABEL
    job = jobs.render(
        name=jobs.validate_name(job_name),
        outputs=outputs,
        nodes=count,
        args=args.argv(job_name),
        image=image,
        labels={label: start},
        annotations=notes,
        env={jobs.PRECOMPILE_ENV: "1"} if precompile else None,
        target=target,
        lnc=lnc,
        ultraserver=ultraserver,
    )
    _create(job, outputs, spec, what, env, dry_run)


def _resolve(
    args: jobs.TrainingArgs, outputs: EnvironmentOutputs, model: str | None, env: str
) -> tuple[jobs.TrainingArgs, dict[str, str], str]:
    """``args`` with the exact data and model versions they name (resolved now: a later stage
    does not change what this job reads), the annotations that record them, and the job's
    description.

    Raises:
        TrnctlError: NOT_FOUND for data or a model that is not staged (see
            :func:`trnctl.datasets.resolve`, :func:`trnctl.registry.resolve`).
    """
    s3 = aws.client("s3", outputs.region)
    data = datasets.resolve(s3, outputs.datasets_bucket, args.data, env)
    notes = {jobs.DATA_ANNOTATION: data.path}
    if data.manifest_sha256:
        notes[jobs.DATA_SHA256_ANNOTATION] = data.manifest_sha256
    read = f", data {data.version}" if data.version else ""
    if model is None:
        what = "two-tower model" if args.task == jobs.RECOMMEND else f"preset {args.preset}"
        return dataclasses.replace(args, data=data.path), notes, f"{what}{read}"
    found = registry.resolve(s3, outputs.datasets_bucket, model, env)
    notes[jobs.MODEL_VERSION_ANNOTATION] = found.path
    under = found.path.removeprefix(f"{versioning.MODELS}/")
    resolved = dataclasses.replace(args, data=data.path, model=under)
    return resolved, notes, f"model {found.version or found.path}{read}"


# The flags of `job submit` that only mean something on Trainium, and why.
TRN_ONLY = {
    "--precompile": "it fills the Neuron compile cache; CUDA compiles as it runs",
    "--lnc": "it groups NeuronCores; a GPU job runs one rank per GPU",
    "--ultraserver": "it places Trainium pods inside one UltraServer",
}


def _refuse_on_gpu(given: dict[str, bool]) -> None:
    """Refuses the Trainium-only flags among ``given`` (flag -> whether it was given) for a
    ``--target gpu`` job, each named with the reason.

    Raises:
        TrnctlError: USAGE.
    """
    refused = [flag for flag, on in given.items() if on]
    if refused:
        reasons = "; ".join(f"{flag}: {TRN_ONLY[flag]}" for flag in refused)
        raise TrnctlError(
            f"{', '.join(refused)} only {'applies' if len(refused) == 1 else 'apply'} to "
            f"Trainium and cannot go with --target gpu ({reasons}); leave "
            f"{'it' if len(refused) == 1 else 'them'} out"
        )


def _spec_of(
    outputs: EnvironmentOutputs, target: str
) -> trn_catalog.InstanceSpec | trn_catalog.GpuInstanceSpec:
    """The catalog entry of the target's node group (after :func:`jobs.require_target`)."""
    jobs.require_target(outputs, target)
    return jobs.gpu_spec_of(outputs) if target == jobs.GPU else jobs.trn_spec_of(outputs)


def _node_count(
    outputs: EnvironmentOutputs, nodes: int | None, target: str, ultraserver: bool = False
) -> int:
    """``nodes``, or by default every node of the target's group (one UltraServer's servers for
    an ``--ultraserver`` job in an environment with UltraServer blocks)."""
    group, size = ("GPU", outputs.gpu_nodes) if target == jobs.GPU else ("trn", outputs.trn_nodes)
    count = size if nodes is None else nodes
    if nodes is None and ultraserver and outputs.ultraserver_type and target == jobs.TRN:
        count = ultraservers.get(outputs.ultraserver_type).servers
    if size == 0:
        key = "gpu_nodes" if target == jobs.GPU else "trn_nodes"
        raise TrnctlError(
            f"the {group} node group of {outputs.environment} has 0 nodes: a job would wait "
            f"for capacity forever; redeploy with -c {key}=N (N >= 1) first"
        )
    if count > size:
        raise TrnctlError(
            f"--nodes {count} is more than the {size} {group} nodes of {outputs.environment}; "
            "the pods would wait for capacity forever (scale the node group first)"
        )
    return count


def _create(
    job: dict[str, Any],
    outputs: EnvironmentOutputs,
    spec: trn_catalog.InstanceSpec | trn_catalog.GpuInstanceSpec,
    what: str,
    env: str,
    dry_run: bool,
) -> None:
    """Prints ``job`` (a dry run), or creates it once the cluster's runtime for the job's
    target matches the catalog."""
    if dry_run:
        typer.echo(jobs.to_yaml(job), nl=False)
        return
    cluster = common.cluster_of(outputs)
    runtime = job["spec"]["runtimeRef"]["name"]
    drift = jobs.runtime_drift(cluster.runtime(runtime), spec)
    if drift:
        raise TrnctlError(
            f"TrainingRuntime {runtime} in {outputs.namespace} does not match the catalog for "
            f"{spec.name}: {'; '.join(drift)}; redeploy the workloads stack",
            ExitCode.FAILED,
        )
    cluster.create(job)
    job_name = job["metadata"]["name"]
    count = job["spec"]["trainer"]["numNodes"]
    common.console().print(
        f"submitted TrainJob {job_name}: {count} x {spec.name}, {what}, in "
        f"{outputs.namespace} on {outputs.cluster_name}; follow it with: trnctl job logs "
        f"{job_name} --env {env} --follow",
        soft_wrap=True,
    )


def _submit_command(
    *,
    env: str,
    command: list[str],
    code: str | None,
    refused: list[str],
    nodes: int | None,
    image: str | None,
    name: str | None,
    dry_run: bool,
    region: str | None,
    target: str,
    lnc: int | None = None,
    ultraserver: bool = False,
) -> None:
    """``job submit -- COMMAND``: refuses the flags only trn-train takes, checks staged code
    and runs the command through the image's entrypoint on the ``target``'s group."""
    if refused:
        raise TrnctlError(
            f"{', '.join(refused)} {'is' if len(refused) == 1 else 'are'} for trn-train run "
            "and cannot go with a command after --: pass your script's own flags after -- "
            "instead"
        )
    code_name = codes.name_of(code) if code is not None else None
    args = jobs.CommandArgs(
        tuple(command), codes.pod_path(code_name) if code_name is not None else None
    )
    outputs = common.outputs_of(env, region)
    spec = _spec_of(outputs, target)
    count = _node_count(outputs, nodes, target, ultraserver)
    if code_name is not None:
        s3 = aws.client("s3", outputs.region)
        codes.require_staged(s3, outputs.datasets_bucket, code_name, env)
    program = PurePosixPath(command[0]).name
    job_name = name or jobs.generated_name("run", program, datetime.now(UTC))
    labels = {jobs.CODE_LABEL: code_name} if code_name is not None else {}
    job = jobs.render_command(
        name=jobs.validate_name(job_name),
        outputs=outputs,
        nodes=count,
        command=args,
        image=image,
        labels=labels,
        target=target,
        lnc=lnc,
        ultraserver=ultraserver,
    )
    what = f"command {shlex.join(command)}" + (f" in code/{code_name}" if code_name else "")
    _create(job, outputs, spec, what, env, dry_run)


def _check_base_model_id(base_model_id: str, merge_lora: bool) -> None:
    """Refuse a ``--base-model-id`` that no adapter would carry or that is not one word."""
    if not base_model_id:
        return
    if merge_lora:
        raise TrnctlError(
            "--base-model-id: a merged model names no base model (only a PEFT adapter does); "
            "leave out --base-model-id or --merge-lora"
        )
    if any(c.isspace() or not c.isprintable() for c in base_model_id):
        raise TrnctlError(
            f"--base-model-id {base_model_id!r}: a model id has no spaces or control "
            "characters; give the hub id, e.g. meta-llama/Llama-3.2-1B"
        )


@app.command("export")
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
    merge_lora: Annotated[
        bool,
        typer.Option(
            "--merge-lora",
            help="Of a LoRA job: the full model with the adapters merged (default: the PEFT "
            "adapter). Refused for a job without LoRA.",
        ),
    ] = False,
    base_model_id: Annotated[
        str,
        typer.Option(
            "--base-model-id",
            help="Of a LoRA job's adapter: the base model's hub id, written as the adapter's "
            "base_model_name_or_path (default: the model's config.json _name_or_path, else its "
            "directory). Refused with --merge-lora and for a job without LoRA.",
        ),
    ] = "",
    best: Annotated[
        bool,
        typer.Option(
            "--best",
            help="The job's best checkpoint by the --best-metric it was submitted with, instead "
            "of the newest. Refused for a job without --best-metric.",
        ),
    ] = False,
    dry_run: DryRunOption = False,
    region: RegionOption = None,
) -> None:
    """Write the newest valid checkpoint of a --model job (with --best, its best by its
    --best-metric) as a Hugging Face model directory beside its checkpoints (a one-node
    TrainJob running trn-train export, on the job's own node group: trn, or gpu for a --target
    gpu job); print where it is. A LoRA job's export is its PEFT adapter, or with --merge-lora
    the merged full model. --dry-run prints the trn form."""
    jobs.validate_name(name)
    _check_base_model_id(base_model_id, merge_lora)
    outputs = common.outputs_of(env, region)
    export = jobs.export_name(name, datetime.now(UTC))
    if dry_run:
        job = jobs.render_export(
            job_name=name,
            export=export,
            outputs=outputs,
            image=image,
            merge_lora=merge_lora,
            base_model_id=base_model_id,
            best=best,
        )
        typer.echo(jobs.to_yaml(job), nl=False)
        return
    cluster = common.cluster_of(outputs)
    source = cluster.get(name)
    labels = source.get("metadata", {}).get("labels") or {}
    if jobs.MODEL_LABEL not in labels:
        raise TrnctlError(
            f"TrainJob {name!r} was not submitted with --model (it has no {jobs.MODEL_LABEL} "
            "label): only runs from a Hugging Face model have a Hugging Face directory to export"
        )
    lora = jobs.is_lora(source)
    if merge_lora and not lora:
        raise TrnctlError(
            f"--merge-lora: TrainJob {name!r} is not a LoRA fine-tune (its arguments have no "
            f"{jobs.LORA_RANK_FLAG}); its export is the full model already, so leave out "
            "--merge-lora"
        )
    if base_model_id and not lora:
        raise TrnctlError(
            f"--base-model-id: TrainJob {name!r} is not a LoRA fine-tune (its arguments have no "
            f"{jobs.LORA_RANK_FLAG}); only an adapter names a base model, so leave it out"
        )
    if best and jobs.best_metric_of(source) is None:
        raise TrnctlError(
            f"--best: TrainJob {name!r} was not submitted with --best-metric, so it kept no best "
            "checkpoint; export its newest without --best"
        )
    image = image or source.get("spec", {}).get("trainer", {}).get("image")
    # The export runs on the source job's group, where its image runs; not on an empty one.
    target = jobs.target_of(source)
    _node_count(outputs, 1, target)
    cluster.create(
        jobs.render_export(
            job_name=name,
            export=export,
            outputs=outputs,
            image=image,
            merge_lora=merge_lora,
            base_model_id=base_model_id,
            target=target,
            best=best,
        )
    )
    where = jobs.export_dir(name, export)
    bucket = f"s3://{outputs.checkpoints_bucket}/{name}/export/{export}/"
    if not wait:
        common.console().print(
            f"submitted export TrainJob {export}: it writes {where} (in pods; FSx exports it to "
            f"{bucket}); follow it with: trnctl job logs {export} --env {env} --follow",
            soft_wrap=True,
        )
        return
    typer.echo(f"submitted export TrainJob {export}", err=True)
    state = common.wait(cluster, export, "export job", env, timeout, poll)
    if state != "Complete":
        raise TrnctlError(
            f"export job {export} ended {state}; see trnctl job logs {export} --env {env}",
            ExitCode.FAILED,
        )
    what = (
        "a PEFT adapter"
        if lora and not merge_lora
        else "a Hugging Face model" + (" (LoRA adapters merged)" if merge_lora else "")
    )
    common.console().print(
        f"exported the {'best' if best else 'newest'} checkpoint of {name} as {what}: {where} "
        "(in pods), "
        f"{bucket} (FSx exports it to the checkpoints bucket)",
        soft_wrap=True,
    )


def _status_tables(job: dict[str, Any], pods: list[jobs.NodePod]) -> tuple[Table, Table]:
    name = job["metadata"]["name"]
    runtime = ((job.get("spec") or {}).get("runtimeRef") or {}).get("name", "-")
    conditions = Table(title=f"TrainJob {name} (target {jobs.target_of(job)}, runtime {runtime})")
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


@app.command("status")
def job_status(
    name: Annotated[str, typer.Argument(help="TrainJob name.")],
    env: EnvOption,
    region: RegionOption = None,
) -> None:
    """Show a job's conditions and its pod per node; exit 1 if the job failed."""
    jobs.validate_name(name)
    cluster = common.cluster_of(common.outputs_of(env, region))
    job = cluster.get(name)
    pods = jobs.node_pods(cluster.pods(name))
    console = common.console()
    for table in _status_tables(job, pods):
        console.print(table)
    if jobs.outcome(job) == "Failed":
        raise typer.Exit(int(ExitCode.FAILED))


@app.command("logs")
def job_logs(
    name: Annotated[str, typer.Argument(help="TrainJob name.")],
    env: EnvOption,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until it ends.")] = False,
    node: Annotated[int, typer.Option("--node", min=0, help="Node index; 0 is rank 0.")] = 0,
    region: RegionOption = None,
) -> None:
    """Print the log of a job's node pod (rank 0 by default)."""
    jobs.validate_name(name)
    cluster = common.cluster_of(common.outputs_of(env, region))
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
