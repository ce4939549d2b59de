"""TrainJobs on the workspace's runtimes: names, rendering, schema checks and reading their
status back. Pure functions: no AWS or Kubernetes calls here (see :mod:`trnctl.kube`).

A job has a target: ``trn`` (the ``neuron-torch`` runtime on the trn node group) or ``gpu``
(the ``cuda-torch`` runtime on the optional GPU node group, for side-by-side runs). The runtime
already carries everything per node that the catalog decides (all Neuron devices or GPUs, EFA
interfaces, huge pages, FSx and S3 mounts, node selection and tolerations, the service account),
so a TrainJob names the runtime and sets only the image, the arguments, the node count and the
ranks per node (one per logical NeuronCore, or per GPU: Trainer 2.3.0 otherwise hands torchrun
the pod's CPU request, or ``auto``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jsonschema
import yaml

import trn_catalog
from trn_catalog import crds, pipelines
from trn_catalog import devices as device_modes
from trn_catalog import workspace as ws
from trn_catalog.gpu_instances import GpuInstanceSpec
from trn_catalog.instances import InstanceSpec
from trn_catalog.outputs import EnvironmentOutputs
from trnctl import models, placement
from trnctl.errors import ExitCode, TrnctlError, settings_as_usage

KIND = "TrainJob"
PLURAL = "trainjobs"
RUNTIME_PLURAL = "trainingruntimes"
# Labels JobSet puts on every pod of a TrainJob (JobSet is named after the TrainJob) and the
# index label of the Indexed Job behind the "node" replicated job (Kubernetes batch/v1). The
# Kubeflow SDK selects a TrainJob's pods by the same three labels.
JOBSET_NAME_LABEL = placement.JOBSET_NAME_LABEL
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
MANAGED_BY_LABEL = ws.MANAGED_BY_LABEL
PRESET_LABEL = "trn-platform/preset"
MODEL_LABEL = "trn-platform/model"
TASK_LABEL = "trn-platform/task"  # a job that trains its own model (--task recommend)
# The trainer's task whose model comes from its data, not from a preset or a staged model.
RECOMMEND = "recommend"
# What a job reads, resolved when it was submitted: the data's path under the datasets mount
# (datasets/NAME/vN for a versioned dataset) and that version's manifest SHA-256, and the model
# version (models/NAME/vN). Annotations: the values hold '/', which label values may not.
DATA_ANNOTATION = "trn-platform/data"
DATA_SHA256_ANNOTATION = "trn-platform/data-manifest-sha256"
MODEL_VERSION_ANNOTATION = "trn-platform/model-version"
# The image's entrypoint runs `trn-train compile` (the job's flags, a few steps, into the shared
# compile cache) before the run when this is "1" (trainer.launch).
PRECOMPILE_ENV = "TRN_PRECOMPILE"
PURPOSE_LABEL = "trn-platform/purpose"
# Which node group a job runs on: trn (neuron-torch) or gpu (cuda-torch); `job status` and
# `compare` show it.
TARGET_LABEL = "trn-platform/target"
TRN, GPU = "trn", "gpu"
TARGETS = (TRN, GPU)

# DNS-1035 label (TrainJob and JobSet names), of at most ws.TRAINJOB_MAX_NAME characters.
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = ws.TRAINJOB_MAX_NAME


def validate_name(name: str) -> str:
    """``name`` if it can name a TrainJob.

    Raises:
        TrnctlError: USAGE, naming the rule that ``name`` breaks.
    """
    if not _DNS_1035.match(name):
        raise TrnctlError(
            f"job name {name!r} is not a DNS-1035 label: lowercase letters, digits and '-', "
            "starting with a letter and ending with a letter or digit"
        )
    if len(name) > MAX_NAME:
        raise TrnctlError(
            f"job name {name!r} has {len(name)} characters; at most {MAX_NAME} fit in the pod "
            "hostnames JobSet derives from it"
        )
    return name


def generated_name(prefix: str, start: str, now: datetime) -> str:
    """``<prefix>-<start>-<UTC yyyymmdd-hhmmss>``, e.g. ``train-125m-20261201-120000``, where
    ``start`` (a preset or model name) is slugged and shortened so that the timestamp always fits;
    the prefix keeps presets that start with a digit valid."""
    stamp = f"{now:%Y%m%d-%H%M%S}"
    room = MAX_NAME - len(stamp) - (len(prefix) + 1 if prefix else 0) - 1
    slug = re.sub(r"[^a-z0-9]+", "-", start.lower()).strip("-")[:room].strip("-")
    parts = [p for p in (prefix, slug, stamp) if p]
    return validate_name("-".join(parts))


@dataclass(frozen=True)
class TrainingArgs:
    """What ``trn-train run`` gets inside the job (see ``trainer.cli``): a ``preset`` or a staged
    ``model`` (its NAME; exactly one, and neither for ``task`` recommend, whose two-tower model
    the data's tables shape), LoRA only with a model, ``max_steps`` or ``epochs``.

    Raises:
        TrnctlError: USAGE, on construction, for a combination ``trn-train run`` would refuse
            (``max_steps`` with ``epochs`` among them) or a value below what it takes
            (:func:`trn_catalog.pipelines.check_training`: a LoRA rank below 1, alpha not above
            0).
    """

    preset: str | None
    data: str
    max_steps: int | None = None
    checkpoint_every: int | None = None
    log_every: int | None = None
    seed: int | None = None
    model: str | None = None
    lora_rank: int | None = None
    lora_alpha: float | None = None
    seq_len: int | None = None
    eval_every: int | None = None
    eval_batches: int | None = None
    epochs: int | None = None
    task: str | None = None
    class_weights: str | None = None
    best_metric: str | None = None

    def __post_init__(self) -> None:
        if self.task == RECOMMEND:
            if self.preset is not None or self.model is not None:
                raise TrnctlError(
                    "--task recommend trains a two-tower model shaped by its data: leave out "
                    "--preset and --model"
                )
        elif (self.preset is None) == (self.model is None):
            raise TrnctlError("pass exactly one of --preset and --model")
        self._check_task()
        if self.lora_rank is not None and self.model is None:
            raise TrnctlError("--lora-rank needs --model (LoRA fine-tunes a staged model)")
        with settings_as_usage():
            pipelines.check_training({key: getattr(self, key) for key in pipelines.TRAINING_FIELDS})

    def _check_task(self) -> None:
        from trainer.config import CLASS_WEIGHTS, TASKS

        if self.task is not None and self.task not in TASKS:
            raise TrnctlError(f"--task {self.task!r} is unknown; allowed: {', '.join(TASKS)}")
        if self.task == "classify" and self.model is None:
            raise TrnctlError("--task classify needs --model (a score head on a staged model)")
        if self.class_weights is not None:
            if self.class_weights not in CLASS_WEIGHTS:
                raise TrnctlError(
                    f"--class-weights {self.class_weights!r} is unknown; allowed: "
                    f"{', '.join(CLASS_WEIGHTS)}"
                )
            if self.task != "classify":
                raise TrnctlError("--class-weights needs --task classify")
        if self.best_metric is not None and not (
            self.best_metric.startswith("eval_") and self.eval_every
        ):
            raise TrnctlError(
                f"--best-metric {self.best_metric!r} names an eval figure (eval_loss; with "
                "--task classify eval_accuracy or, multi-label, eval_exact_match, eval_macro_f1, "
                "eval_micro_f1) and needs "
                "--eval-every N above 0"
            )

    def argv(self, job_name: str) -> list[str]:
        """The entrypoint's arguments: data under the datasets mount unless ``data`` is an
        absolute path, a model under the datasets mount too (:func:`trnctl.models.pod_path`),
        checkpoints and metrics on FSx under the job's name, so that a resubmitted job with the
        same name resumes from its newest checkpoint."""
        data = self.data if self.data.startswith("/") else f"{ws.DATASETS_MOUNT}/{self.data}"
        start: list[str] = []
        if self.preset is not None:
            start = ["--preset", self.preset]
        elif self.model is not None:
            start = ["--model", models.pod_path(str(self.model))]
        argv = [
            *start,
            "--data",
            data.rstrip("/") or "/",
            "--checkpoint-dir",
            checkpoint_dir(job_name),
            "--metrics",
            metrics_path(job_name),
        ]
        for flag, value in (
            ("--max-steps", self.max_steps),
            ("--checkpoint-every", self.checkpoint_every),
            ("--log-every", self.log_every),
            ("--seed", self.seed),
            ("--lora-rank", self.lora_rank),
            ("--seq-len", self.seq_len),
            ("--eval-every", self.eval_every),
            ("--eval-batches", self.eval_batches),
            ("--epochs", self.epochs),
            ("--task", self.task),
            ("--class-weights", self.class_weights),
            (BEST_METRIC_FLAG, self.best_metric),
        ):
            if value is not None:
                argv += [flag, str(value)]
        if self.lora_alpha is not None:
            alpha = self.lora_alpha
            argv += ["--lora-alpha", str(int(alpha)) if alpha.is_integer() else repr(alpha)]
        return argv


# The image's ENTRYPOINT (training_image/Dockerfile). A job that runs its own command names it
# again, with --exec, so that the command gets the environment and the SIGTERM handling the
# platform's trainer gets, even from an image whose own ENTRYPOINT differs.
IMAGE_ENTRYPOINT = ("python3", "/opt/training_image/entrypoint.py")
EXEC_FLAG = "--exec"
WORKDIR_FLAG = "--workdir"
# Where a command job's checkpoints go: the directory trn-train uses (:func:`checkpoint_dir`).
CHECKPOINT_DIR_ENV = "TRN_CHECKPOINT_DIR"
# Where a command job's metrics go, for `trnctl compare`: the file trn-train writes for a job of
# the same name (:func:`metrics_path`). trainer.runlog writes there when the variable is set.
METRICS_FILE_ENV = "TRN_METRICS_FILE"
CODE_LABEL = "trn-platform/code"
# Kubeflow Trainer v2.3.0's TrainJob CRD: spec.trainer.args holds at most 128 items.
MAX_ARGS = 128


@dataclass(frozen=True)
class CommandArgs:
    """A job that runs ``command`` (typically ``torchrun ... train.py``) in place of ``trn-train
    run``, in ``workdir`` when given (an absolute path in the pod, such as staged code under the
    datasets mount; default: the image's working directory).

    Raises:
        TrnctlError: USAGE, on construction, for an empty command, one with more words than a
            TrainJob's ``spec.trainer.args`` holds, or a relative ``workdir``.
    """

    command: tuple[str, ...]
    workdir: str | None = None

    def __post_init__(self) -> None:
        if not self.command or not self.command[0]:
            raise TrnctlError("the command after -- is empty; give the program to run")
        if len(self.command) > MAX_ARGS:
            raise TrnctlError(
                f"the command after -- has {len(self.command)} words; a TrainJob's "
                f"spec.trainer.args holds at most {MAX_ARGS} (Kubeflow Trainer "
                f"{crds.release_tag()}): put them in a script and run that"
            )
        if self.workdir is not None and not self.workdir.startswith("/"):
            raise TrnctlError(f"working directory {self.workdir!r} is not an absolute path")

    def entrypoint(self) -> list[str]:
        """The container's command: the image's entrypoint in its ``--exec`` mode."""
        workdir = [WORKDIR_FLAG, self.workdir] if self.workdir is not None else []
        return [*IMAGE_ENTRYPOINT, EXEC_FLAG, *workdir, "--"]

    def env(self, job_name: str) -> dict[str, str]:
        """What the job adds to the runtime's environment: the checkpoint directory and the
        metrics file in it."""
        return {
            CHECKPOINT_DIR_ENV: checkpoint_dir(job_name),
            METRICS_FILE_ENV: metrics_path(job_name),
        }


def render_command(
    *,
    name: str,
    outputs: EnvironmentOutputs,
    nodes: int,
    command: CommandArgs,
    image: str | None = None,
    labels: Mapping[str, str] | None = None,
    target: str = TRN,
    lnc: int | None = None,
    ultraserver: bool = False,
) -> dict[str, Any]:
    """A TrainJob on the runtime of ``target`` (see :func:`render`) that runs ``command``
    through the image's entrypoint (``entrypoint.py --exec [--workdir DIR] -- COMMAND...``): the
    runtime's devices, EFA, mounts, compile cache and grace period, the rendezvous Kubeflow
    hands every node (``PET_*``), one rank per logical NeuronCore or GPU (``numProcPerNode``,
    which torchrun reads as ``PET_NPROC_PER_NODE``), ``TRN_CHECKPOINT_DIR`` at the job's
    checkpoint directory and ``TRN_METRICS_FILE`` at its metrics file there.

    Raises:
        TrnctlError: as :func:`render`.
    """
    return render(
        name=name,
        outputs=outputs,
        nodes=nodes,
        args=command.command,
        image=image,
        command=command.entrypoint(),
        labels={PURPOSE_LABEL: "command", **(labels or {})},
        env=command.env(name),
        target=target,
        lnc=lnc,
        ultraserver=ultraserver,
    )


def checkpoint_dir(job_name: str) -> str:
    """Where the TrainJob ``job_name`` keeps its checkpoints, on FSx (exported to the
    checkpoints bucket under ``<job_name>/``)."""
    return f"{ws.FSX_MOUNT}/checkpoints/{job_name}"


# The metrics file's name in the job's checkpoint directory: there FSx exports it to the
# checkpoints bucket with the checkpoints, where `trnctl compare` reads it.
METRICS_FILE = "metrics.jsonl"


def metrics_path(job_name: str) -> str:
    """Where the TrainJob ``job_name`` writes its metrics: beside its checkpoints, so that FSx
    exports them to ``s3://<checkpoints bucket>/<job_name>/metrics.jsonl``."""
    return f"{checkpoint_dir(job_name)}/{METRICS_FILE}"


def metrics_key(job_name: str) -> str:
    """The key of the job's exported metrics file in the checkpoints bucket."""
    return f"{job_name}/{METRICS_FILE}"


# The export runs the trainer's CLI itself (``trn-train`` is ``python3 -m trainer`` in the image)
# in one pod, instead of the image's entrypoint, which would start torchrun for a training run.
EXPORT_COMMAND = ("python3", "-m", "trainer", "export")
SOURCE_JOB_LABEL = "trn-platform/source-job"
MERGE_LORA_FLAG = "--merge-lora"
BASE_MODEL_ID_FLAG = "--base-model-id"
# `trn-train export --best`: the run's best checkpoint by the --best-metric it trained with.
BEST_FLAG = "--best"
BEST_METRIC_FLAG = "--best-metric"
# The flag of `trn-train run` that makes a run a LoRA fine-tune (see TrainingArgs.argv).
LORA_RANK_FLAG = "--lora-rank"
_EXPORT_SUFFIX = "-export-mmddhhmmss"


def export_name(job_name: str, now: datetime) -> str:
    """``<job name>-export-<UTC mmddhhmmss>``, the job name shortened to fit :data:`MAX_NAME`:
    each export gets its own TrainJob and its own output directory."""
    head = job_name[: MAX_NAME - len(_EXPORT_SUFFIX)].rstrip("-")
    return validate_name(f"{head}-export-{now:%m%d%H%M%S}")


def is_lora(job: Mapping[str, Any]) -> bool:
    """Whether the TrainJob ``job`` (as the API server returns it) runs a LoRA fine-tune: its
    trainer's arguments, which :meth:`TrainingArgs.argv` wrote, pass :data:`LORA_RANK_FLAG`."""
    args = job.get("spec", {}).get("trainer", {}).get("args") or []
    return any(a == LORA_RANK_FLAG or str(a).startswith(f"{LORA_RANK_FLAG}=") for a in args)


def best_metric_of(job: Mapping[str, Any]) -> str | None:
    """The ``--best-metric`` the TrainJob ``job`` trains with (see :meth:`TrainingArgs.argv`),
    or None."""
    args = [str(a) for a in job.get("spec", {}).get("trainer", {}).get("args") or []]
    for i, arg in enumerate(args):
        if arg == BEST_METRIC_FLAG and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(f"{BEST_METRIC_FLAG}="):
            return arg.partition("=")[2]
    return None


def export_dir(job_name: str, export: str) -> str:
    """Where the export ``export`` of ``job_name`` writes: beside the job's checkpoints (the
    trainer's checkpoints are its ``step_*`` directories, so this one is not taken for one)."""
    return f"{checkpoint_dir(job_name)}/export/{export}"


def render_export(
    *,
    job_name: str,
    export: str,
    outputs: EnvironmentOutputs,
    image: str | None = None,
    merge_lora: bool = False,
    base_model_id: str = "",
    target: str = TRN,
    best: bool = False,
) -> dict[str, Any]:
    """The TrainJob that writes the newest valid checkpoint of ``job_name`` (with ``best``,
    default False, its best by its ``--best-metric``: ``trn-train export --best``) as a Hugging
    Face model directory at :func:`export_dir`: one node of ``target``'s runtime (default
    ``trn``; the source job's own, so that the export runs where its image does), whose pod
    already mounts FSx, running ``trn-train export``. Of a LoRA run that directory is a PEFT
    adapter, or with ``merge_lora`` (default False) the full model with the adapters merged
    (``trn-train export --merge-lora``). ``base_model_id`` (default none: the trainer's default,
    the model config's ``_name_or_path``) is the hub id an adapter names as its base.

    Raises:
        TrnctlError: as :func:`render`.
    """
    args = ["--checkpoint-dir", checkpoint_dir(job_name), "--out", export_dir(job_name, export)]
    if merge_lora:
        args.append(MERGE_LORA_FLAG)
    if base_model_id:
        args += [BASE_MODEL_ID_FLAG, base_model_id]
    if best:
        args.append(BEST_FLAG)
    return render(
        name=export,
        outputs=outputs,
        nodes=1,
        args=args,
        image=image,
        command=EXPORT_COMMAND,
        labels={PURPOSE_LABEL: "export", SOURCE_JOB_LABEL: validate_name(job_name)},
        target=target,
    )


def render(
    *,
    name: str,
    outputs: EnvironmentOutputs,
    nodes: int,
    args: Sequence[str],
    image: str | None = None,
    command: Sequence[str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    target: str = TRN,
    lnc: int | None = None,
    ultraserver: bool = False,
    across_ultraservers: bool = False,
) -> dict[str, Any]:
    """A TrainJob on the environment's runtime for ``target``, checked against the schema: on
    ``trn`` the ``neuron-torch`` runtime with one rank per logical NeuronCore of the
    environment's instance type at ``lnc`` (see :func:`job_lnc`: under DRA the runtime of that
    LNC, ``neuron-torch-lnc1`` for 1 on trn2/trn3); on ``gpu`` the GPU group's runtime
    (``cuda-torch``) with the CUDA image, one rank per GPU of the GPU instance type and
    ``TRN_GPU_INSTANCE_TYPE`` naming it (the runtime already sets it: the same value; the job
    names it for its reader).

    Args:
        name: the job's name (checked with :func:`validate_name`).
        outputs: the environment (namespace, default images, GPU group).
        nodes: nodes of the target's group, one pod each.
        args: the container's arguments (the image's entrypoint passes them to ``trn-train
            run``, or to ``command`` when given).
        image: the training image; default: the environment's.
        command: replaces the image's entrypoint (``trnctl validate`` runs its program so).
        labels: extra labels on the TrainJob.
        annotations: annotations on the TrainJob (the exact data and model versions it
            reads, :data:`DATA_ANNOTATION` and :data:`MODEL_VERSION_ANNOTATION`). Default none.
        env: environment variables for the training container (Kubeflow Trainer merges them
            with the runtime's).
        target: ``trn`` (default) or ``gpu``.
        lnc: the logical NeuronCore setting of a ``trn`` job (``--lnc``); default: the
            environment's (the nodes' on the device-plugin path, the type's default under DRA).
        ultraserver: place every pod inside one UltraServer (``--ultraserver``, see
            :mod:`trnctl.placement`). Default False.
        across_ultraservers: place the pods on the environment's first two UltraServers
            (``trnctl validate --across-ultraservers``). Default False.

    Raises:
        TrnctlError: USAGE for a bad name, node count or target, ``gpu`` in an environment
            without a GPU group, an ``lnc`` the environment cannot run (:func:`job_lnc`), or an
            ``ultraserver`` or ``across_ultraservers`` job the environment cannot place
            (:func:`placement.check`, :func:`placement.check_across`);
            FAILED for an instance type outside the catalog, or if the result breaks the
            TrainJob schema (a bug here, or a schema the cluster's chart no longer matches).
    """
    validate_name(name)
    if nodes < 1:
        raise TrnctlError(f"--nodes {nodes} is not allowed; use 1 or more")
    require_target(outputs, target)
    patches = _placement(outputs, name, nodes, target, ultraserver, across_ultraservers)
    job_env = dict(env or {})
    runtime = runtime_name(outputs, target)
    if target == GPU:
        if lnc is not None:
            raise TrnctlError(
                f"--lnc {lnc}: LNC is a Trainium setting; leave it out for --target gpu"
            )
        default_image, ranks = outputs.gpu_image_uri, gpu_ranks_per_node(outputs)
        job_env[ws.GPU_INSTANCE_TYPE_ENV] = outputs.gpu_instance_type
    else:
        chosen = job_lnc(outputs, lnc)
        default_image, ranks = outputs.image_uri, ranks_per_node(outputs, chosen)
        if outputs.devices == "dra":
            runtime = device_modes.runtime_name(trn_spec_of(outputs), chosen)
    trainer: dict[str, Any] = {
        "image": image or default_image,
        "numNodes": nodes,
        "numProcPerNode": ranks,
    }
    if command is not None:
        trainer["command"] = list(command)
    trainer["args"] = list(args)
    if job_env:
        trainer["env"] = [{"name": k, "value": v} for k, v in job_env.items()]
    spec: dict[str, Any] = {
        "runtimeRef": {
            "name": runtime,
            "apiGroup": ws.TRAINER_API_GROUP,
            "kind": "TrainingRuntime",
        },
        "trainer": trainer,
    }
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": outputs.namespace,
        "labels": {MANAGED_BY_LABEL: "trnctl", TARGET_LABEL: target, **(labels or {})},
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    job = {
        "apiVersion": f"{ws.TRAINER_API_GROUP}/{ws.TRAINER_API_VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": spec,
    }
    if patches:
        spec["runtimePatches"] = patches
    check_schema(job)
    return job


def _placement(
    outputs: EnvironmentOutputs, name: str, nodes: int, target: str, one: bool, across: bool
) -> list[dict[str, Any]]:
    """The runtime patches that place the job's pods on UltraServers (none by default)."""
    if one and across:
        raise TrnctlError("--ultraserver and --across-ultraservers exclude each other")
    if one:
        placement.check(outputs, nodes, target)
        return [placement.runtime_patch(name, outputs.namespace)]
    if across:
        spec, ids = placement.check_across(outputs)
        if nodes > 2 * spec.servers:
            raise TrnctlError(
                f"--across-ultraservers: {nodes} nodes are more than two {spec.name} "
                f"UltraServers have ({2 * spec.servers})"
            )
        return [placement.across_patch(name, outputs.namespace, ids)]
    return []


def check_target(target: str) -> str:
    """``target`` if it is one of :data:`TARGETS`.

    Raises:
        TrnctlError: USAGE naming ``--target``, the value and the allowed values.
    """
    if target not in TARGETS:
        raise TrnctlError(f"--target {target!r} is not allowed; use {' or '.join(TARGETS)}")
    return target


def require_target(outputs: EnvironmentOutputs, target: str) -> None:
    """Checks ``target`` (:func:`check_target`) and that the environment has its node group.

    Raises:
        TrnctlError: USAGE naming ``--target`` and the allowed values, or, for ``gpu`` in an
            environment without a GPU group, how to add one; FAILED for outputs that name a GPU
            type but no CUDA image.
    """
    if check_target(target) != GPU:
        return
    if not outputs.has_gpu:
        known = ", ".join(trn_catalog.GPU_CATALOG)
        raise TrnctlError(
            f"--target gpu: environment {outputs.environment!r} has no GPU node group; add one "
            f"by deploying it with -c gpu_instance_type=TYPE (one of: {known}), e.g. "
            "-c gpu_instance_type=p5.48xlarge, or submit with --target trn"
        )
    if not outputs.gpu_image_uri:
        raise TrnctlError(
            f"environment {outputs.environment!r} names GPU type {outputs.gpu_instance_type} "
            "but no gpu_image_uri in its outputs; redeploy the workloads stack",
            ExitCode.FAILED,
        )


def runtime_name(outputs: EnvironmentOutputs, target: str) -> str:
    """The TrainingRuntime a ``target`` job references: ``neuron-torch``, or the GPU group's
    (the outputs' ``gpu_runtime``, ``cuda-torch``)."""
    if target == GPU:
        return outputs.gpu_runtime or ws.GPU_RUNTIME_NAME
    return ws.RUNTIME_NAME


def target_of(job: Mapping[str, Any]) -> str:
    """The target a TrainJob runs on: its :data:`TARGET_LABEL`, else (a job submitted before
    the label) ``gpu`` when it references the GPU runtime, else ``trn``."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    if labels.get(TARGET_LABEL) in TARGETS:
        return str(labels[TARGET_LABEL])
    runtime = ((job.get("spec") or {}).get("runtimeRef") or {}).get("name")
    return GPU if runtime == ws.GPU_RUNTIME_NAME else TRN


def gpu_spec_of(outputs: EnvironmentOutputs) -> GpuInstanceSpec:
    """The GPU catalog's entry for the environment's GPU type.

    Raises:
        TrnctlError: FAILED, the type is not in the GPU catalog.
    """
    try:
        return trn_catalog.get_gpu(outputs.gpu_instance_type)
    except trn_catalog.UnknownGpuInstanceTypeError as error:
        raise TrnctlError(
            f"environment {outputs.environment!r}: {error}", ExitCode.FAILED
        ) from None


def gpu_ranks_per_node(outputs: EnvironmentOutputs) -> int:
    """A ``gpu`` job's ``numProcPerNode``: the GPU catalog's GPUs of the environment's GPU type
    (Trainer 2.3.0 would hand torchrun ``auto`` otherwise).

    Raises:
        TrnctlError: FAILED, the type is not in the GPU catalog.
    """
    return gpu_spec_of(outputs).gpus


def ranks_per_node(outputs: EnvironmentOutputs, lnc: int) -> int:
    """The TrainJob's ``numProcPerNode``: the catalog's logical NeuronCores of the environment's
    instance type at ``lnc`` (the job's, :func:`job_lnc`).

    Raises:
        TrnctlError: FAILED, the instance type is not in the catalog.
    """
    return device_modes.logical_cores(trn_spec_of(outputs), lnc)


def trn_spec_of(outputs: EnvironmentOutputs) -> InstanceSpec:
    """The catalog entry of the environment's trn instance type.

    Raises:
        TrnctlError: FAILED, the type is not in the catalog.
    """
    try:
        return trn_catalog.get(outputs.instance_type)
    except trn_catalog.UnknownInstanceTypeError as error:
        raise TrnctlError(
            f"environment {outputs.environment!r}: {error}", ExitCode.FAILED
        ) from None


def node_lnc(outputs: EnvironmentOutputs) -> int:
    """The trn nodes' LNC on the device-plugin path: the outputs' ``lnc``, else (0, and under
    DRA) the type's default."""
    return outputs.lnc or trn_spec_of(outputs).default_lnc


def job_lnc(outputs: EnvironmentOutputs, lnc: int | None) -> int:
    """The LNC a trn job runs at: ``lnc`` (``--lnc``) when given, else the environment's.

    Under DRA each job picks it (the runtime's claim sets it on the devices); on the
    device-plugin path it is the nodes' setting, so ``--lnc`` must name that one.

    Raises:
        TrnctlError: USAGE, naming ``--lnc``: a type without the setting (trn1), a value other
            than 1 or 2, or another LNC than the nodes' on the device-plugin path; FAILED for a
            type outside the catalog.
    """
    spec = trn_spec_of(outputs)
    if lnc is None:
        return node_lnc(outputs)
    problem = device_modes.lnc_problem(spec, lnc)
    if problem:
        raise TrnctlError(f"--lnc {lnc}: {problem}")
    if outputs.devices != "dra" and lnc != node_lnc(outputs):
        raise TrnctlError(
            f"--lnc {lnc}: the trn nodes of {outputs.environment} run LNC {node_lnc(outputs)} "
            "(devices 'plugin': LNC is the node group's setting); redeploy with -c lnc="
            f"{lnc}, or with -c devices=dra to choose it per job"
        )
    return lnc


def check_schema(job: Mapping[str, Any]) -> None:
    """Validates ``job`` against the TrainJob schema kept in the catalog.

    Raises:
        TrnctlError: FAILED, naming the path of the first error.
    """
    schema = crds.schema(KIND)
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(job), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        path = ".".join(str(p) for p in first.absolute_path) or "(root)"
        raise TrnctlError(
            f"rendered TrainJob breaks the {crds.TRAINER_API} schema at {path}: {first.message}",
            ExitCode.FAILED,
        )


def runtime_drift(runtime: Mapping[str, Any], spec: InstanceSpec | GpuInstanceSpec) -> list[str]:
    """How the cluster's runtime differs from what jobs on ``spec`` need under the pinned
    Trainer release: its torch policy, the trainer job's ancestor label, and the instance type,
    devices (Neuron devices on a trn type, ``nvidia.com/gpu`` on a GPU type), EFA interfaces
    and huge pages its node container asks for; for a GPU type also the node selection and the
    toleration of the GPU group's taint. (Ranks per node are the TrainJob's own since Trainer
    2.2.0.) Empty when they agree."""
    try:
        (replicated,) = [
            r
            for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]
            if r.get("name") == ws.TRAINER_CONTAINER
        ]
        pod = replicated["template"]["spec"]["template"]["spec"]
        (container,) = [c for c in pod["containers"] if c.get("name") == ws.TRAINER_CONTAINER]
    except (KeyError, TypeError, ValueError):
        node = ws.TRAINER_CONTAINER
        return [f"it has no {node!r} replicated job with a {node!r} container"]
    problems: list[str] = []
    if (runtime["spec"].get("mlPolicy") or {}).get("torch") is None:
        problems.append("no mlPolicy.torch (Kubeflow would not hand torchrun its rendezvous)")
    labels = (replicated["template"].get("metadata") or {}).get("labels") or {}
    if labels.get(ws.TRAINER_ANCESTOR_LABEL) != ws.TRAINER_ANCESTOR:
        problems.append(
            f"its {ws.TRAINER_CONTAINER!r} job lacks the label "
            f"{ws.TRAINER_ANCESTOR_LABEL}={ws.TRAINER_ANCESTOR} (a TrainJob's image, nodes "
            "and ranks would not reach it)"
        )
    env = {e.get("name"): e.get("value") for e in container.get("env") or []}
    if isinstance(spec, GpuInstanceSpec):
        variable, devices = ws.GPU_INSTANCE_TYPE_ENV, {ws.GPU_RESOURCE: spec.gpus}
        problems += _gpu_placement_drift(pod, spec)
    else:
        variable, devices = "TRN_INSTANCE_TYPE", {"aws.amazon.com/neuron": spec.chips}
    if env.get(variable) != spec.name:
        problems.append(f"{variable} {env.get(variable)} (catalog: {spec.name})")
    limits = (container.get("resources") or {}).get("limits") or {}
    if pod.get("resourceClaims"):
        # DRA: the devices and EFA interfaces come from the claim, not from extended resources.
        return problems + _claim_drift(pod, container, limits)
    for resource, count in {**devices, "vpc.amazonaws.com/efa": spec.efa_interfaces}.items():
        if str(limits.get(resource)) != str(count):
            problems.append(f"{resource} {limits.get(resource)} (catalog: {count})")
    if "hugepages-2Mi" not in limits:
        problems.append("no hugepages-2Mi (EFA needs them)")
    return problems


def _claim_drift(
    pod: Mapping[str, Any], container: Mapping[str, Any], limits: Mapping[str, Any]
) -> list[str]:
    """Whether a DRA runtime's trainer container uses the pod's device claim and asks for the
    EFA huge pages."""
    problems = []
    pod_claims = {c.get("name") for c in pod.get("resourceClaims") or []}
    used = {c.get("name") for c in (container.get("resources") or {}).get("claims") or []}
    if not pod_claims & used:
        problems.append(
            f"its {ws.TRAINER_CONTAINER!r} container uses none of the pod's resource claims"
        )
    if "hugepages-2Mi" not in limits:
        problems.append("no hugepages-2Mi (EFA needs them)")
    return problems


# The node label EKS sets to the instance type (Kubernetes well-known labels).
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


def _gpu_placement_drift(pod: Mapping[str, Any], spec: GpuInstanceSpec) -> list[str]:
    """Whether a GPU runtime's pod selects the GPU group's nodes of ``spec`` and tolerates the
    group's taint."""
    problems = []
    selector = pod.get("nodeSelector") or {}
    wanted = {ws.NODE_TYPE_LABEL: ws.GPU_NODE_TYPE, INSTANCE_TYPE_LABEL: spec.name}
    for label, value in wanted.items():
        if selector.get(label) != value:
            problems.append(f"nodeSelector {label}={selector.get(label)} (wanted: {value})")
    if not any(t.get("key") == ws.GPU_TAINT_KEY for t in pod.get("tolerations") or []):
        problems.append(f"no toleration of the {ws.GPU_TAINT_KEY} taint of the GPU nodes")
    return problems


# The parts of a TrainJob's trainer that say how the run was configured.
_RUN_CONFIG = ("image", "numNodes", "numProcPerNode", "args")


def lineage(job: Mapping[str, Any]) -> dict[str, Any]:
    """What a model exported from the TrainJob ``job`` (as the API server returns it) comes from:
    the job, its base model and dataset as resolved at submit (:data:`MODEL_VERSION_ANNOTATION`,
    :data:`DATA_ANNOTATION`, :data:`DATA_SHA256_ANNOTATION`; for a job submitted before those,
    the model label), and the run's configuration (image, nodes, ranks, trainer arguments)."""
    metadata = job.get("metadata") or {}
    notes = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    trainer = (job.get("spec") or {}).get("trainer") or {}
    base = notes.get(MODEL_VERSION_ANNOTATION) or (
        f"{models.AREA.top}/{labels[MODEL_LABEL]}" if MODEL_LABEL in labels else None
    )
    found = {
        "job": metadata.get("name"),
        "base_model": base,
        "dataset": notes.get(DATA_ANNOTATION),
        "dataset_manifest_sha256": notes.get(DATA_SHA256_ANNOTATION),
        "config": {key: trainer[key] for key in _RUN_CONFIG if key in trainer},
    }
    return {key: value for key, value in found.items() if value not in (None, {})}


def to_yaml(job: Mapping[str, Any]) -> str:
    text: str = yaml.safe_dump(dict(job), sort_keys=False, default_flow_style=False)
    return text


def node_selector(name: str, *, index: int | None = None) -> str:
    """Label selector of a TrainJob's node pods (only the pod of node ``index`` when given)."""
    selector = f"{JOBSET_NAME_LABEL}={name},{REPLICATED_JOB_LABEL}={ws.TRAINER_CONTAINER}"
    return selector if index is None else f"{selector},{JOB_INDEX_LABEL}={index}"


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    since: str


def conditions(job: Mapping[str, Any]) -> list[Condition]:
    """The TrainJob's status conditions, in the order the controller wrote them."""
    found = (job.get("status") or {}).get("conditions") or []
    return [
        Condition(
            type=str(c.get("type", "")),
            status=str(c.get("status", "")),
            reason=str(c.get("reason", "")),
            message=" ".join(str(c.get("message", "")).split()),
            since=str(c.get("lastTransitionTime", "")),
        )
        for c in found
    ]


def outcome(job: Mapping[str, Any]) -> str | None:
    """``Complete`` or ``Failed`` once the TrainJob has finished, else None."""
    for condition in conditions(job):
        if condition.type in ("Complete", "Failed") and condition.status == "True":
            return condition.type
    return None


@dataclass(frozen=True)
class NodePod:
    """One node's pod of a TrainJob, as ``job status`` shows it."""

    index: int
    name: str
    phase: str
    node: str
    restarts: int
    detail: str


def node_pods(pods: Sequence[Any]) -> list[NodePod]:
    """Pods (``V1Pod``) of the node replicated job, by node index; a node's attempts (the pods
    a retry left) oldest first, by creation time, since their names end in a random suffix."""
    rows = []
    for pod in sorted(pods, key=_created):
        labels = pod.metadata.labels or {}
        try:
            index = int(labels.get(JOB_INDEX_LABEL, ""))
        except ValueError:
            index = -1
        statuses = (pod.status.container_statuses or []) if pod.status else []
        restarts = sum(s.restart_count or 0 for s in statuses)
        detail = ""
        for status in statuses:
            state = status.state
            if state is not None and state.waiting is not None:
                detail = state.waiting.reason or ""
            elif state is not None and state.terminated is not None:
                detail = f"{state.terminated.reason or 'exited'} ({state.terminated.exit_code})"
        rows.append(
            NodePod(
                index=index,
                name=pod.metadata.name,
                phase=(pod.status.phase if pod.status else None) or "Unknown",
                node=(pod.spec.node_name if pod.spec else None) or "-",
                restarts=restarts,
                detail=detail,
            )
        )
    return sorted(rows, key=lambda r: r.index)  # stable: attempts stay in creation order


def _created(pod: Any) -> datetime:
    created: datetime | None = pod.metadata.creation_timestamp
    return created or datetime.min.replace(tzinfo=UTC)
