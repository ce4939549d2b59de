"""The training loop in three parts, as torchtitan's trainer separates them:

- set-up (:func:`set_up`): config -> backend -> data and task -> model -> optimizer ->
  the checkpoint to resume from -> metrics log, gathered in one :class:`Run`;
- one optimizer step (:func:`train_step`): the learning rate, ``grad_accum`` micro-batches
  through the task's loss and backward, gradient reduction and clipping, the optimizer;
- what follows a step (:func:`after_step`): the interval's metrics record, eval, and a
  checkpoint (every ``checkpoint_every`` steps, at the end, and on SIGTERM).

:func:`train` is set-up, then steps and what follows each until the last step or SIGTERM.
Device differences live in :mod:`trainer.device`, data parallelism in :mod:`trainer.parallel`;
the loop only calls them.

Extension point: the task (:class:`trainer.task.Task`). The step knows nothing of the
objective: it asks the task for each micro-batch (:meth:`~trainer.task.Task.batch`), for what a
step's micro-batches share (:meth:`~trainer.task.Task.step_weight`), and for each micro-batch's
loss given the model's forward (:meth:`~trainer.task.Task.loss`); eval asks it for its figures
(:meth:`~trainer.task.Task.evaluate`). The causal LM (:class:`trainer.causal_lm.CausalLM`) is
the task built in :func:`set_up` today; a new task (a classification head, a recommender)
implements the same four methods and is built there instead, with :func:`train_step` and
:func:`after_step` unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist

from trainer import causal_lm, device, emf, hf, lora, model_spec, optim, parallel, tokenizing
from trainer.checkpoint import Checkpointer, name_for, open_store, resume_newest, run_config
from trainer.classify import encoder
from trainer.classify import task as classify
from trainer.classify.evaluate import is_classification_data
from trainer.classify.model import ScoredForward
from trainer.config import ModelConfig, TrainConfig
from trainer.data import Dataset, ShardError, open_dataset
from trainer.metrics import MetricsLog, mfu, run_header, train_flops_per_token
from trainer.model import GPT
from trainer.model_spec import ModelSpec
from trainer.recommend import task as recommend
from trainer.recommend.data import is_interactions_data
from trainer.task import Batch, Forward, Task


@dataclass(frozen=True)
class TrainResult:
    steps_done: int
    last_loss: float | None
    preempted: bool
    checkpoint: str | None


class StopFlag:
    """Set by SIGTERM (preemption, node drain, the end of a Capacity Block); the loop checks it at
    each step boundary, writes a checkpoint and returns, so the process exits 0 in the grace
    period. In the image the entrypoint still exits non-zero, as the run is unfinished (see
    :func:`trainer.launch.exit_status`)."""

    def __init__(self) -> None:
        self.set = False
        self._previous: object = None

    def __enter__(self) -> StopFlag:
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.set = True

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGTERM, self._previous)  # type: ignore[arg-type]


def open_dataset_per_node(
    root: str, ranks: parallel.Ranks, control: dist.ProcessGroup | None, *, verify: bool
) -> Dataset:
    """The dataset, every rank checking the manifest and each shard's header and size (the
    shards' SHA-256s were checked when they were staged, and the manifest that pins them is
    recorded in each checkpoint). With ``verify``, also every shard's SHA-256, once per node:
    local rank 0 reads the whole dataset while the node's other ranks wait. Per node rather
    than on rank 0 alone because each node reads through its own mount (Mountpoint S3, the
    Lustre client), so that a node's mount serving wrong bytes is caught there. Either way the
    ranks then agree, so that a problem on one node stops every rank at once rather than
    leaving the others waiting in a collective.

    Raises:
        trainer.data.ShardError: a shard or the manifest is wrong, on this node or another.
    """
    problem: ShardError | None = None
    dataset = None
    if not verify or ranks.local_rank == 0:
        try:
            dataset = open_dataset(root, verify=verify)
        except ShardError as error:
            problem = error
    # Also the barrier: no rank opens the data before every node has verified it.
    failed = parallel.any_rank(problem is not None, ranks, control)
    if problem is not None:
        raise problem
    if failed:
        where = "a node's local rank 0" if verify else "another rank"
        raise ShardError(root, f"failed its checks on {where} (see that rank's log)")
    return dataset if dataset is not None else open_dataset(root, verify=False)


def _model_label(cfg: TrainConfig) -> str:
    if cfg.task == "recommend":
        return "the two-tower model"
    return f"model {cfg.model_dir!r}" if cfg.model_dir else f"preset {cfg.preset!r}"


def _num_params(model: ModelConfig) -> int:
    """The model's parameter count, from a model on the meta device (no memory, no init)."""
    with torch.device("meta"):
        return GPT(model).num_params()


def _new_model(config: ModelConfig, task: Task | None) -> torch.nn.Module:
    """The task's model of ``config``, its weights drawn (none on the meta device): the
    decoder, or a classifier (:class:`~trainer.classify.model.SequenceClassifier`, or
    :class:`~trainer.classify.encoder.BertClassifier` on a BERT encoder)."""
    if isinstance(task, classify.Classify):
        return task.new_model(config)
    return GPT(config)


def flops_per_token(spec: ModelSpec, task: Task | None = None) -> float:
    """Training FLOPs per token of ``spec``'s model (see
    :func:`trainer.metrics.train_flops_per_token`), counted on a model on the meta device with
    the run's LoRA adapters: the embedding lookups (learned positions, token types, and the
    input embedding unless it is the tied output head) are not matrix products; a LoRA run
    trains the adapters only. Of a two-tower model: per interaction (see
    :func:`trainer.recommend.task.flops_per_example`)."""
    if isinstance(task, recommend.Recommend):
        return recommend.flops_per_example(task.config, task.sampler.micro_batch)
    with torch.device("meta"):
        gpt = _new_model(spec.config, task)
        if spec.lora is not None:
            _adapters_on(gpt, spec)
    modules = list(gpt.modules())
    tables = {id(m.weight) for m in modules if isinstance(m, torch.nn.Embedding)}
    lookups = tables - {id(m.weight) for m in modules if isinstance(m, torch.nn.Linear)}
    products = [p for p in gpt.parameters() if id(p) not in lookups]
    return train_flops_per_token(
        matmul_params=sum(p.numel() for p in products),
        trained_params=sum(p.numel() for p in products if p.requires_grad),
        layers=spec.config.n_layer,
        width=spec.config.d_model,
        seq_len=spec.config.seq_len,
    )


def _fsdp_sharded(cfg: TrainConfig, ranks: parallel.Ranks, backend: device.Backend) -> bool:
    """Whether the model is sharded: FSDP2 on several ranks of a backend whose gradients it
    reduces (every one but XLA, see :func:`trainer.parallel.wrap`)."""
    return ranks.distributed and cfg.parallelism == "fsdp" and backend.reduces_in_backward


def _initial_model(
    cfg: TrainConfig, spec: ModelSpec, backend: device.Backend, task: Task | None
) -> torch.nn.Module:
    """The model as training starts: ``cfg.model_dir``'s weights or the preset's random ones
    (drawn with ``cfg.seed``), a classification task's head drawn after them, with LoRA
    adapters when ``spec.lora`` asks (drawn after) and its frozen weights in the backend's
    :meth:`~trainer.device.Backend.frozen_dtype`."""
    torch.manual_seed(cfg.seed)
    gpt: torch.nn.Module
    if isinstance(task, classify.Classify):
        gpt = task.pretrained(cfg.model_dir, spec.config)
    elif cfg.model_dir:
        gpt = hf.load_pretrained(cfg.model_dir, spec.config)
    else:
        gpt = GPT(spec.config)
    if spec.lora is not None:
        _with_adapters(gpt, spec, backend)
    return gpt


def _adapters_on(gpt: torch.nn.Module, spec: ModelSpec) -> None:
    """``spec.lora``'s adapters on ``gpt``, every other weight frozen but a classifier's head
    (see :meth:`~trainer.classify.model.ScoredForward.head_parameters`): it is new, so it is
    always trained."""
    assert spec.lora is not None
    on = encoder.lora_layout(gpt.cfg) if isinstance(gpt, encoder.BertClassifier) else spec.config
    lora.apply(gpt, on, spec.lora)
    if isinstance(gpt, ScoredForward):
        for p in gpt.head_parameters():
            p.requires_grad_(True)


def _with_adapters(gpt: torch.nn.Module, spec: ModelSpec, backend: device.Backend) -> None:
    """``spec.lora``'s adapters on ``gpt`` (:func:`_adapters_on`: the optimizer then sees them
    and a classifier's head only) and the frozen weights cast to the backend's
    :meth:`~trainer.device.Backend.frozen_dtype`."""
    _adapters_on(gpt, spec)
    dtype = backend.frozen_dtype()
    if dtype is not None:
        lora.cast_frozen(gpt, dtype)


def build_model(
    cfg: TrainConfig,
    spec: ModelSpec,
    ranks: parallel.Ranks,
    backend: device.Backend,
    task: Task | None = None,
    *,
    activation_checkpointing: bool = False,
) -> tuple[torch.nn.Module, Forward]:
    """``spec``'s model for ``task`` (default None: the causal LM's) wrapped for data
    parallelism and its forward (see :func:`trainer.parallel.wrap`).

    A ``--model`` run on several FSDP2 ranks never holds the full weights on a rank but rank 0:
    every rank builds the model on the meta device and shards it, rank 0 alone reads the
    safetensors files (:func:`trainer.hf.load_pretrained`, plus the LoRA adapters drawn as one
    rank would), and torch's ``set_model_state_dict`` with ``broadcast_from_rank0`` sends each
    tensor from rank 0 to every rank, which keeps its shard. The RoPE tables (buffers that are
    not in the state) and a classifier's class weights are set again on every rank after
    ``to_empty``. A two-tower model is drawn with ``cfg.seed`` and trained with DDP (see
    :func:`_two_tower`).
    """
    if isinstance(task, recommend.Recommend):
        return _two_tower(cfg, task, ranks, backend)
    if not (cfg.model_dir and _fsdp_sharded(cfg, ranks, backend)):
        gpt = _initial_model(cfg, spec, backend, task)
        model, forward = parallel.wrap(
            backend.prepare_model(gpt),
            ranks,
            cfg.parallelism,
            backend,
            activation_checkpointing=activation_checkpointing,
        )
        return model, forward
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full = _initial_model(cfg, spec, backend, task).state_dict() if ranks.is_main else {}
    with torch.device("meta"):
        gpt = _new_model(spec.config, task)
        if spec.lora is not None:
            _with_adapters(gpt, spec, backend)
    model, forward = parallel.wrap(
        gpt, ranks, cfg.parallelism, backend, activation_checkpointing=activation_checkpointing
    )
    model.to_empty(device=backend.device)
    set_model_state_dict(
        model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    del full
    with torch.device(backend.device):
        if isinstance(gpt, GPT):
            gpt.init_rope()
        if isinstance(task, classify.Classify):
            task.set_class_weights(gpt)
    return model, forward


def _two_tower(
    cfg: TrainConfig, task: recommend.Recommend, ranks: parallel.Ranks, backend: device.Backend
) -> tuple[torch.nn.Module, Forward]:
    """The task's two-tower model (:meth:`trainer.recommend.task.Recommend.build_model`: its
    tables split across the ranks or not), drawn with ``cfg.seed``, wrapped for data
    parallelism (``ddp``)."""
    torch.manual_seed(cfg.seed)
    return parallel.wrap(task.build_model(backend), ranks, "ddp", backend)


@dataclass(frozen=True)
class Throughput:
    """What a metrics record's speed figures come from: tokens per optimizer step (all ranks),
    training FLOPs per token, the peak FLOP/s of one rank (None: unknown, no MFU), and the
    precision it trains in; for a classifier also its rows (examples) per step, recorded as
    ``examples_per_s``."""

    tokens_per_step: int
    flops_per_token: float
    peak_flops: float | None
    precision: str
    examples_per_step: int | None = None


@dataclass
class Best:
    """The run's best value so far of ``metric``, a figure of its eval records (lower is better
    for a ``*loss``, higher for any other); None before the first."""

    metric: str
    value: float | None = None

    def improves(self, figures: dict[str, object]) -> bool:
        """Whether ``figures`` (an eval record's) beat the best so far (which they then become);
        False where the figure is there but not a number (an eval loss of no targets).

        Raises:
            ValueError: the eval has no figure named ``metric`` (a misspelt name, or
                ``eval_accuracy`` of a multi-label run, whose evals write ``eval_exact_match``):
                the run would otherwise train to its end keeping no best checkpoint.
        """
        if self.metric not in figures:
            numbers = sorted(
                k
                for k, v in figures.items()
                if isinstance(v, int | float | None) and not isinstance(v, bool)
            )
            raise ValueError(
                f"best_metric {self.metric!r} is not a figure of this run's evals; allowed: "
                f"{', '.join(numbers)}"
            )
        found = figures.get(self.metric)
        if not isinstance(found, int | float):
            return False
        lower = self.metric.endswith("loss")
        if self.value is not None and (found >= self.value if lower else found <= self.value):
            return False
        self.value = float(found)
        return True

    def record(self, step: int) -> dict[str, object]:
        """What the best checkpoint's ``meta.json`` records of it."""
        return {"metric": self.metric, "value": self.value, "step": step}


@dataclass(frozen=True)
class Run:
    """What set-up gives the steps: the config and the model it resolves to, the ranks and
    device, the task, the wrapped model and its forward, the optimizer, the checkpointer (None
    without ``checkpoint_dir``) and the run config it records, the steps (``start`` ..
    ``max_steps``, ``start`` from the checkpoint resumed), the metrics log and the device
    batches of the task."""

    cfg: TrainConfig
    spec: ModelSpec
    ranks: parallel.Ranks
    backend: device.Backend
    control: dist.ProcessGroup | None
    task: Task
    model: torch.nn.Module
    forward: Forward
    optimizer: torch.optim.Optimizer
    checkpointer: Checkpointer | None
    run_config: dict[str, object]
    sharded: bool
    start: int
    max_steps: int
    log: MetricsLog
    throughput: Throughput
    batches: Iterator[Batch]
    best: Best | None = None


def train(cfg: TrainConfig) -> TrainResult:
    """Trains ``cfg.preset``, or ``cfg.model_dir``'s model from its weights, for its steps
    (:func:`trainer.causal_lm.total_steps`) or until SIGTERM, resuming from the newest valid
    checkpoint in ``cfg.checkpoint_dir`` and appending to ``cfg.metrics``.

    Raises:
        ValueError: invalid config (see :func:`trainer.model_spec.resolve`), an unavailable
            device, a device that cannot run on ``cfg.instance_type`` (TorchNeuron on trn1), a
            plan it cannot train (see :meth:`trainer.device.Backend.check_plan`), or data it
            cannot make rows of (see :func:`trainer.causal_lm.training_sampler`,
            :func:`trainer.causal_lm.eval_sampler`).
        trainer.data.ShardError: a shard or the manifest is wrong; the message names it.
        trainer.checkpoint.RunConfigError: the newest checkpoint was saved with another preset,
            model, sequence length, seed, global batch, schedule, epochs or dataset.
        trainer.hf_config.HFConfigError, trainer.hf.HFWeightsError: ``cfg.model_dir`` holds a model
            this trainer does not implement, or weights that do not match its config.
    """
    return run_steps(set_up(cfg))


def set_up(cfg: TrainConfig) -> Run:
    """Everything the steps need, in order: the config checked, the device started and the
    process group joined, the data opened and the task built on it, the model and optimizer,
    the newest valid checkpoint resumed, the run settings printed and the metrics log opened.

    Raises:
        see :func:`train`.
    """
    started_at, started = datetime.now(UTC), time.perf_counter()  # the run header's clock
    spec = model_spec.resolve(cfg)
    ranks = parallel.ranks_from_env()
    backend, num_params = _start_backend(cfg, _planned_params(cfg, spec.config), ranks)
    control = parallel.control_group(ranks)
    dataset = _open_data(cfg, spec.config, ranks, control)
    task, max_steps, data = _task(cfg, spec.config, dataset, ranks, backend, control)
    model, forward = build_model(
        cfg, spec, ranks, backend, task, activation_checkpointing=cfg.checkpoints_blocks(num_params)
    )
    optimizer = optim.build(model, lr=cfg.peak_lr, weight_decay=cfg.decay, betas=cfg.betas)
    checkpointer = _checkpointer(cfg)
    run = _run_config(cfg, spec, ranks.world_size, dataset, max_steps, task)
    start = 0
    if checkpointer is not None:
        start = resume_newest(checkpointer, model, optimizer, run=run, ranks=ranks, group=control)
    best = _best_so_far(cfg, checkpointer)
    throughput, log = _metrics(
        cfg, spec, ranks, backend, task, max_steps, data, (started_at, started)
    )
    batches = backend.batches(_stream(task, start, max_steps, cfg.grad_accum))
    # FSDP2's state is sharded: each rank writes its shards rather than gathering on rank 0.
    sharded = _fsdp_sharded(cfg, ranks, backend) or (
        isinstance(task, recommend.Recommend) and task.sharded
    )
    return Run(
        cfg=cfg,
        spec=spec,
        ranks=ranks,
        backend=backend,
        control=control,
        task=task,
        model=model,
        forward=forward,
        optimizer=optimizer,
        checkpointer=checkpointer,
        run_config=run,
        sharded=sharded,
        start=start,
        max_steps=max_steps,
        log=log,
        throughput=throughput,
        batches=batches,
        best=best,
    )


def _best_so_far(cfg: TrainConfig, checkpointer: Checkpointer | None) -> Best | None:
    """With ``cfg.best_metric``, the run's :class:`Best` and, resumed, the best checkpoint so
    far (pinned, and its value the one to beat); None without."""
    if not cfg.best_metric:
        return None
    best = Best(cfg.best_metric)
    found = checkpointer.best_valid() if checkpointer is not None else None
    if checkpointer is not None and found is not None:
        checkpointer.pinned.add(found[0])
        best.value = float(found[1]["value"])
    return best


def _planned_params(cfg: TrainConfig, model: ModelConfig) -> int:
    """The parameter count of the run's model: the decoder's, or of a two-tower run the one
    its data's tables make (:func:`trainer.recommend.task.planned_params`)."""
    if cfg.task == "recommend":
        return recommend.planned_params(cfg, parallel.ranks_from_env())
    return _num_params(model)


def _start_backend(
    cfg: TrainConfig, num_params: int, ranks: parallel.Ranks
) -> tuple[device.Backend, int]:
    """The device backend, checked against the instance type and the plan (strategy and
    ``num_params``, the model's size), its compile fitted, the process group joined and the
    device started; and ``num_params`` back."""
    backend = device.resolve(cfg.device, compile_backend=cfg.compile, local_rank=ranks.local_rank)
    backend.check_instance(cfg.instance_type)
    backend.check_plan(
        strategy=cfg.parallelism,
        model=_model_label(cfg),
        num_params=num_params,
        instance_type=cfg.instance_type,
    )
    backend.fit_compile(sharded=_fsdp_sharded(cfg, ranks, backend))
    parallel.init(ranks, backend.dist_backend)
    backend.start()  # after the process group: see Backend.start
    return backend, num_params


def _open_data(
    cfg: TrainConfig, model: ModelConfig, ranks: parallel.Ranks, control: dist.ProcessGroup | None
) -> Dataset:
    """``cfg.data`` opened on every rank (see :func:`open_dataset_per_node`) and checked against
    the model: the ``--model`` run's tokenizer, or the preset's vocabulary.

    Raises:
        ValueError: the data's vocabulary exceeds the preset's; see
            :func:`trainer.tokenizing.check_data_for_model`.
    """
    dataset = open_dataset_per_node(cfg.data, ranks, control, verify=cfg.verify_data)
    if cfg.task == "recommend":
        return dataset  # ids, not tokens: the task checks them against its tables
    if cfg.model_dir:
        tokenizing.check_data_for_model(cfg.data, cfg.model_dir)
    elif dataset.vocab_size > model.vocab_size:
        raise ValueError(
            f"data vocabulary {dataset.vocab_size} ({dataset.tokenizer}) exceeds "
            f"{_model_label(cfg)} vocabulary {model.vocab_size}"
        )
    return dataset


def _run_config(
    cfg: TrainConfig,
    spec: ModelSpec,
    world_size: int,
    dataset: Dataset,
    max_steps: int,
    task: Task,
) -> dict[str, object]:
    """What the run's checkpoints record for resuming (see :func:`trainer.checkpoint.run_config`)
    and, of a classification run, its classes (for resuming and export)."""
    run = run_config(
        cfg,
        spec,
        world_size=world_size,
        manifest_sha256=dataset.manifest_sha256,
        model_id=hf.fingerprint(cfg.model_dir) if cfg.model_dir else None,
        total_steps=max_steps,
        packed=isinstance(task, causal_lm.CausalLM) and dataset.index is not None,
    )
    if isinstance(task, classify.Classify):
        run.update(task.run_fields(cfg.class_weights))
    if isinstance(task, recommend.Recommend):
        run.update(task.run_fields())
    return run


def _task(
    cfg: TrainConfig,
    model: ModelConfig,
    dataset: Dataset,
    ranks: parallel.Ranks,
    backend: device.Backend,
    control: dist.ProcessGroup | None,
) -> tuple[Task, int, dict[str, object] | None]:
    """``cfg.task``'s task on ``dataset``, the run's steps and the run header's summary of its
    data: the causal LM (:func:`_causal_lm`), classification
    (:func:`trainer.classify.task.build`) or recommendation
    (:func:`trainer.recommend.task.build`).

    Raises:
        ValueError: classification or interactions data for another task; see
            :func:`_causal_lm`, :func:`trainer.classify.task.build` and
            :func:`trainer.recommend.task.build`.
    """
    if cfg.task == "classify":
        task, max_steps = classify.build(cfg, model, dataset, ranks, backend, control)
        return task, max_steps, task.summary()
    if cfg.task == "recommend":
        rec, max_steps = recommend.build(cfg, dataset, ranks, backend, control)
        return rec, max_steps, rec.summary()
    if is_classification_data(cfg.data):
        raise ValueError(
            f"--data {cfg.data} is classification data (prepare-data --format classify): "
            "train it with --task classify"
        )
    if is_interactions_data(cfg.data):
        raise ValueError(
            f"--data {cfg.data} is interactions data (prepare-data --format interactions): "
            "train it with --task recommend"
        )
    return _causal_lm(cfg, model, dataset, ranks, backend)


def _causal_lm(
    cfg: TrainConfig,
    model: ModelConfig,
    dataset: Dataset,
    ranks: parallel.Ranks,
    backend: device.Backend,
) -> tuple[causal_lm.CausalLM, int, dict[str, object] | None]:
    """The causal-LM task on ``dataset`` (:func:`trainer.causal_lm.build`), the run's steps and
    the run header's summary of its data (None for a token stream); rank 0 prints the data's
    line (:func:`trainer.causal_lm.data_note`).

    Raises:
        ValueError: see :func:`trainer.causal_lm.build`.
    """
    task = causal_lm.build(cfg, model.seq_len, dataset, ranks, backend)
    max_steps = causal_lm.total_steps(cfg, task.sampler)
    data = causal_lm.data_summary(task.sampler, task.held_out)
    note = causal_lm.data_note(data, dataset) if ranks.is_main else ""
    if note:
        print(note, file=sys.stderr)
    return task, max_steps, data


def _checkpointer(cfg: TrainConfig) -> Checkpointer | None:
    """The checkpointer of ``cfg.checkpoint_dir`` (None without one), carrying a ``--model``
    run's model files and base directory, or a two-tower run's id maps (for its export)."""
    if not cfg.checkpoint_dir:
        return None
    carried = hf.carried_files(cfg.model_dir) if cfg.model_dir else ()
    if cfg.task == "recommend":
        carried = recommend.carried_files(cfg.data)
    return Checkpointer(
        open_store(cfg.checkpoint_dir),
        cfg.keep_checkpoints,
        carried,
        # Absolute: an export from another working directory reads the base from it.
        str(Path(cfg.model_dir).resolve()) if cfg.model_dir else "",
    )


def _metrics(
    cfg: TrainConfig,
    spec: ModelSpec,
    ranks: parallel.Ranks,
    backend: device.Backend,
    task: Task,
    max_steps: int,
    data: dict[str, object] | None,
    started: tuple[datetime, float],
) -> tuple[Throughput, MetricsLog]:
    """The run's :class:`Throughput` and its metrics log, opened with the run header (``data``
    added when there is a summary of it) on rank 0 (a log that writes nothing elsewhere).
    ``started``: when the run started, as a date and a ``time.perf_counter`` reading."""
    throughput, settings = _throughput(cfg, spec, ranks, backend, task)
    header = _header(cfg, spec.config, ranks, backend, throughput, settings, started[0])
    log = MetricsLog(
        cfg.metrics if ranks.is_main else "",
        total_steps=max_steps,
        progress=cfg.progress if ranks.is_main else False,
        header=header if data is None else {**header, "data": data},
        started=started[1],
        sink=emf.from_env(os.environ) if ranks.is_main else None,
    )
    return throughput, log


def _throughput(
    cfg: TrainConfig,
    spec: ModelSpec,
    ranks: parallel.Ranks,
    backend: device.Backend,
    task: Task,
) -> tuple[Throughput, dict[str, object]]:
    """The run's :class:`Throughput` and its settings (see :func:`trainer.model_spec.settings`),
    which rank 0 prints."""
    peak = cfg.peak_flops or backend.peak_flops(instance_type=cfg.instance_type)
    flops = flops_per_token(spec, task)
    frozen = backend.frozen_dtype()
    settings = model_spec.settings(
        cfg,
        spec.lora,
        frozen_dtype="fp32" if frozen is None else device.dtype_name(frozen),
        compile_backend=backend.compile_backend,
    )
    if ranks.is_main:
        print(f"trn-train: run settings {json.dumps(settings)}", file=sys.stderr)
    precision = backend.precision()
    rows_per_step = cfg.batch_per_rank * cfg.grad_accum * ranks.world_size
    examples = rows_per_step if isinstance(task, classify.Classify | recommend.Recommend) else None
    # A two-tower run's "token" is an interaction: its speed and MFU are per interaction.
    per_row = 1 if isinstance(task, recommend.Recommend) else spec.config.seq_len
    throughput = Throughput(per_row * rows_per_step, flops, peak, precision, examples)
    return throughput, settings


def _header(
    cfg: TrainConfig,
    model: ModelConfig,
    ranks: parallel.Ranks,
    backend: device.Backend,
    throughput: Throughput,
    settings: dict[str, object],
    started_at: datetime,
) -> dict[str, object]:
    """The metrics file's run header (see :func:`trainer.metrics.run_header`)."""
    return run_header(
        started_at=started_at,
        nodes=ranks.world_size // ranks.local_world_size,
        world_size=ranks.world_size,
        device=backend.name,
        precision=throughput.precision,
        model=_header_model(cfg),
        seq_len=1 if cfg.task == "recommend" else model.seq_len,
        global_batch_tokens=throughput.tokens_per_step,
        flops_per_token=throughput.flops_per_token,
        peak_flops_per_rank=throughput.peak_flops,
        settings=settings,
    )


def _header_model(cfg: TrainConfig) -> str:
    if cfg.task == "recommend":
        return "two-tower"
    return Path(cfg.model_dir).name if cfg.model_dir else cfg.preset


def _stream(task: Task, start: int, max_steps: int, accum: int) -> Iterator[Batch]:
    for step in range(start, max_steps):
        for micro in range(accum):
            yield task.batch(step, micro)


class Interval:
    """The steps since the last metrics record: their losses summed on the device (read once
    per record), their count and when they started."""

    def __init__(self, backend: device.Backend) -> None:
        self.loss_sum = torch.zeros((), device=backend.device)
        self.steps = 0
        self.start = time.perf_counter()
        self.last_loss: float | None = None

    def record(self, run: Run, step: int, figures: StepFigures) -> None:
        """Writes the interval's record ending at ``step`` (mean loss over ranks and steps,
        speed, the last step's learning rate and gradient norm) and starts the next one."""
        mean_loss = parallel.all_mean(self.loss_sum, run.ranks) / self.steps
        self.last_loss = mean_loss.item()  # the one device-to-host read per interval
        run.backend.synchronize()
        elapsed = time.perf_counter() - self.start
        speed = run.throughput
        tokens_per_s = speed.tokens_per_step * self.steps / elapsed
        run.log.write(
            {
                "step": step,
                "loss": self.last_loss,
                "lr": figures.lr,
                "grad_norm": float(figures.grad_norm),
                "tokens_per_s": tokens_per_s,
                "mfu": mfu(
                    tokens_per_s / run.ranks.world_size, speed.flops_per_token, speed.peak_flops
                ),
                "precision": speed.precision,
                "step_time_s": elapsed / self.steps,
                "tokens": step * speed.tokens_per_step,
                **_examples_per_s(speed, self.steps / elapsed),
            }
        )
        self.loss_sum.zero_()
        self.steps = 0
        self.start = time.perf_counter()


def _examples_per_s(speed: Throughput, steps_per_s: float) -> dict[str, float]:
    """A classifier's ``examples_per_s`` (nothing for the causal LM, whose packed rows are not
    examples)."""
    if speed.examples_per_step is None:
        return {}
    return {"examples_per_s": speed.examples_per_step * steps_per_s}


@dataclass(frozen=True)
class StepFigures:
    """What one step gives its metrics record: its learning rate and gradient norm (a device
    tensor, read when the record is written)."""

    lr: float
    grad_norm: torch.Tensor


def run_steps(run: Run) -> TrainResult:
    """Steps ``run.start`` .. ``run.max_steps`` (:func:`train_step`), each followed by
    :func:`after_step`, until the last or until SIGTERM reaches any rank (the run then
    checkpoints and returns ``preempted``); then closes the metrics log and the process group."""
    step, saved_at, preempted = run.start, None, False
    with StopFlag() as stop, contextlib.ExitStack() as guards:
        interval = Interval(run.backend)
        while step < run.max_steps:
            figures = train_step(run, step, interval.loss_sum)
            step += 1
            interval.steps += 1
            if step == run.start + 1:
                _after_warm_up(run, guards)
            preempted, saved = after_step(run, step, figures, interval, stop)
            saved_at = saved if saved is not None else saved_at
            if preempted:
                break
    run.log.close()
    parallel.shutdown()
    return TrainResult(step, interval.last_loss, preempted, saved_at)


def train_step(run: Run, step: int, loss_sum: torch.Tensor) -> StepFigures:
    """Optimizer step ``step``: the scheduled learning rate, then each of ``grad_accum``
    micro-batches through the task's loss (gradients synchronized on the last one only) and
    backward, its loss added to ``loss_sum``; then the gradients reduced and clipped at
    ``grad_clip``, the optimizer stepped and the gradients dropped."""
    cfg = run.cfg
    lr = optim.lr_at(
        step,
        peak=cfg.peak_lr,
        warmup=cfg.warmup_for(run.max_steps),
        total=run.max_steps,
        min_ratio=cfg.min_lr_ratio,
    )
    optim.set_lr(run.optimizer, lr)
    weight = run.task.step_weight(step)
    for micro in range(cfg.grad_accum):
        batch = next(run.batches)
        loss = run.task.loss(_micro_forward(run, micro == cfg.grad_accum - 1), batch, weight)
        loss.backward()  # type: ignore[no-untyped-call]
        loss_sum += loss.detach()
    run.backend.reduce_gradients(run.optimizer, run.ranks.world_size)
    grad_norm = parallel.clip_gradients(run.model, cfg.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.backend.step_boundary()
    return StepFigures(lr, grad_norm)


def _micro_forward(run: Run, sync: bool) -> Forward:
    """The model's forward under the step's autocast, synchronizing gradients when ``sync``
    (the step's last micro-batch)."""

    def forward(*inputs: torch.Tensor) -> torch.Tensor:
        with parallel.gradient_sync(run.model, sync), run.backend.autocast():
            return run.forward(*inputs)

    return forward


def _after_warm_up(run: Run, guards: contextlib.ExitStack) -> None:
    """After the first step: with ``fail_on_recompile`` and a compiled forward, any recompile
    from here is an error, as it means a shape or guard changed."""
    if run.cfg.fail_on_recompile and run.backend.compile_backend is not None:
        guards.enter_context(torch.compiler.set_stance("fail_on_recompile"))


def after_step(
    run: Run, step: int, figures: StepFigures, interval: Interval, stop: StopFlag
) -> tuple[bool, str | None]:
    """What follows step ``step``: the interval's metrics record every ``log_every`` steps and
    at the last; the task's eval every ``eval_every`` steps; whether SIGTERM reached any rank
    (the run is ``preempted``); and a checkpoint every ``checkpoint_every`` steps, at the last
    and when preempted, and (with ``best_metric``) after an eval that improves it, that
    checkpoint kept beside the newest (:attr:`trainer.checkpoint.Checkpointer.pinned`). Returns
    ``preempted`` and the checkpoint written (None if none)."""
    cfg = run.cfg
    if step % cfg.log_every == 0 or step == run.max_steps:
        interval.record(run, step, figures)
    best = cfg.eval_every > 0 and step % cfg.eval_every == 0 and _evaluate(run, step)
    preempted = parallel.any_rank(stop.set, run.ranks, run.control)
    periodic = cfg.checkpoint_every and step % cfg.checkpoint_every == 0
    last = step == run.max_steps
    if run.checkpointer is None or not (periodic or preempted or last or best):
        return preempted, None
    if best:  # before the save, whose pruning then drops the best before it
        run.checkpointer.pinned.clear()
        run.checkpointer.pinned.add(name_for(step))
    saved = run.checkpointer.save(
        step,
        run.model,
        run.optimizer,
        main=run.ranks.is_main,
        run=run.run_config,
        sharded=run.sharded,
        ranks=run.ranks,
        group=run.control,
        best=run.best.record(step) if best and run.best is not None else None,
    )
    return preempted, saved


def _evaluate(run: Run, step: int) -> bool:
    """The task's eval record at ``step``, marked ``best`` when it improves the run's
    ``best_metric``; returns whether it does."""
    figures = run.task.evaluate(run.forward)
    best = run.best is not None and run.best.improves(figures)
    run.log.write_eval({"step": step, **figures, **({"best": True} if best else {})})
    return best
