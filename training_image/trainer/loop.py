"""The training loop: config -> backend -> model -> data -> optimizer -> steps -> metrics.

Reads top to bottom. Device differences live in :mod:`trainer.device`, data parallelism in
:mod:`trainer.parallel`; the loop only calls them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from trainer import device, emf, hf, lora, optim, parallel, tokenizing
from trainer.checkpoint import Checkpointer, open_store, resume_newest, run_config
from trainer.config import TrainConfig
from trainer.data import IGNORE_INDEX, Dataset, ShardError, WindowSampler, open_dataset
from trainer.metrics import MetricsLog, mfu, run_header, train_flops_per_token
from trainer.model import GPT
from trainer.packing import PackedSampler

# A token stream is drawn in windows; a dataset of examples in packed rows (trainer.packing).
Sampler = WindowSampler | PackedSampler


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


def _stream(
    sampler: Sampler, start: int, max_steps: int, accum: int
) -> Iterator[tuple[torch.Tensor, ...]]:
    for step in range(start, max_steps):
        for micro in range(accum):
            yield sampler.batch(step, micro)


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
    return f"model {cfg.model_dir!r}" if cfg.model_dir else f"preset {cfg.preset!r}"


def training_sampler(cfg: TrainConfig, dataset: Dataset, ranks: parallel.Ranks) -> Sampler:
    """This rank's sampler of the training split: packed rows of whole examples for a dataset
    of examples (:class:`~trainer.packing.PackedSampler`), windows of a token stream
    (:class:`~trainer.data.WindowSampler`) otherwise.

    Raises:
        ValueError: ``cfg.epochs`` with a token stream; no example or shard fits a row.
    """
    options: dict[str, Any] = {
        "seq_len": cfg.model.seq_len,
        "micro_batch": cfg.batch_per_rank,
        "seed": cfg.seed,
        "rank": ranks.rank,
        "world_size": ranks.world_size,
        "grad_accum": cfg.grad_accum,
    }
    if dataset.index is not None:
        return PackedSampler(dataset, **options)
    if cfg.epochs:
        raise ValueError(
            f"epochs {cfg.epochs}: {dataset.root} is a token stream (the byte corpus or "
            "--format text), which has no examples to count epochs in; give --max-steps, or "
            "prepare the data with --format jsonl or chat"
        )
    return WindowSampler(dataset, **options)


def total_steps(cfg: TrainConfig, sampler: Sampler) -> int:
    """The run's optimizer steps: ``cfg.epochs`` whole epochs of ``sampler``'s rows, or
    ``cfg.steps``."""
    if cfg.epochs and isinstance(sampler, PackedSampler):
        return sampler.steps_for(cfg.epochs)
    return cfg.steps


def eval_sampler(cfg: TrainConfig, dataset: Dataset, ranks: parallel.Ranks) -> Sampler | None:
    """The sampler of the held-out split when ``cfg.eval_every`` asks for eval, None when eval
    is off. A split of examples: every example once, packed in their stored order into rows of
    which each eval batch gives this rank its ``cfg.batch_per_rank`` (:func:`eval_batches` of
    them cover the split), the rows `trn-train eval` reads. A token stream: this rank's rows of
    each of the batches ``0 .. eval_batches - 1``, drawn with ``cfg.seed``. The same batches at
    every eval.

    Raises:
        ValueError: eval is on but the dataset has no held-out split, or one too short for a
            row.
    """
    if not cfg.eval_every:
        return None
    held_out = dataset.eval_split
    if held_out is None:
        raise ValueError(
            f"eval_every {cfg.eval_every} needs a held-out split; {dataset.root} has none "
            "(prepare-data --tokenizer ... --eval-fraction F writes one)"
        )
    options: dict[str, Any] = {
        "seq_len": cfg.model.seq_len,
        "micro_batch": cfg.batch_per_rank,
        "seed": cfg.seed,
        "rank": ranks.rank,
        "world_size": ranks.world_size,
    }
    try:
        if held_out.index is None:
            return WindowSampler(held_out, **options)
        return PackedSampler(held_out, shuffle=False, **options)
    except ValueError as error:
        raise ValueError(
            f"the held-out split of {dataset.root} has nothing for a row of seq_len "
            f"{cfg.model.seq_len} ({error}); prepare the data with a larger --eval-fraction"
        ) from None


def eval_batches(cfg: TrainConfig, sampler: Sampler) -> int:
    """Batches per eval: those that cover a split of examples once, else ``cfg.eval_batches``."""
    return sampler.steps_in(0) if isinstance(sampler, PackedSampler) else cfg.eval_batches


def data_summary(sampler: Sampler, held_out: Sampler | None) -> dict[str, object] | None:
    """For packed rows, what the run header records of its data: each split's
    :class:`~trainer.packing.CutReport` at the run's sequence length, and epoch 0's rows,
    steps and ``fill`` (the share of row positions that hold example tokens); None for a token
    stream."""
    if not isinstance(sampler, PackedSampler):
        return None
    rows = sampler.rows(0)
    positions = sampler.steps_in(0) * sampler.rows_per_step * sampler.seq_len
    summary: dict[str, object] = {
        "seq_len": sampler.seq_len,
        "train": sampler.report.as_dict(),
        "rows_per_epoch": rows.count,
        "steps_per_epoch": sampler.steps_in(0),
        "fill": float(rows.tokens.sum()) / positions,
    }
    if isinstance(held_out, PackedSampler):
        summary["eval"] = held_out.report.as_dict()
    return summary


def _stream_note(dataset: Dataset) -> str:
    """For a masked token stream (conversations prepared before examples were kept whole), that
    it trains in windows across conversations; nothing for other streams."""
    if dataset.masks is None:
        return ""
    return (
        f"data: {dataset.root} is a masked token stream (conversations prepared before manifest "
        "format 3): its windows run across conversations; prepare it again for rows of whole "
        "conversations"
    )


def _data_line(summary: dict[str, object]) -> str:
    """One line of :func:`data_summary` for the run's log."""
    train = summary["train"]
    assert isinstance(train, dict)
    line = (
        f"data: {train['examples']} training examples at seq_len {summary['seq_len']}: "
        f"{train['cut']} cut, {train['dropped']} dropped; {summary['rows_per_epoch']} rows, "
        f"{summary['steps_per_epoch']} steps per epoch, {summary['fill']:.1%} of row "
        "positions hold example tokens"
    )
    held_out = summary.get("eval")
    if isinstance(held_out, dict):
        line += (
            f"; {held_out['examples']} eval examples: {held_out['cut']} cut, "
            f"{held_out['dropped']} dropped"
        )
    return line


def evaluate(
    forward: Callable[..., torch.Tensor],
    sampler: Sampler,
    num_batches: int,
    backend: device.Backend,
    ranks: parallel.Ranks,
) -> tuple[float | None, int]:
    """Mean cross-entropy over every trained target of ``num_batches`` held-out batches, on all
    ranks (summed over ranks, so every rank gets the same value), without gradients; returns
    the loss (None when no target is trained: JSON has no NaN) and the number of targets. A
    batch without trained targets adds nothing."""
    total = torch.zeros(2, device=backend.device)
    source = (sampler.batch(k) for k in range(num_batches))
    # eager_on_recompile: the forward was compiled with gradients; eval runs it without, and a
    # second graph for a few batches is not worth compiling (nor an error under
    # fail_on_recompile).
    with torch.no_grad(), torch.compiler.set_stance("eager_on_recompile"):
        for x, y, *positions in backend.batches(source):
            count = (y != IGNORE_INDEX).sum()
            with backend.autocast():
                loss = forward(x, _no_empty_mean(y, count), *positions).float()
            total += torch.stack([torch.where(count > 0, loss * count, 0.0), count.float()])
            backend.step_boundary()
    loss_sum, targets = (parallel.all_mean(total, ranks) * ranks.world_size).tolist()
    return (loss_sum / targets if targets else None), int(targets)


def _target_weight(
    sampler: Sampler, step: int, ranks: parallel.Ranks, backend: device.Backend
) -> torch.Tensor:
    """``world_size / trained targets of the step`` (0 when there are none), a device tensor:
    gradients are averaged over ranks, so each rank's sum is scaled by the world size. A tensor
    rather than a number, so that a lazy (XLA) graph takes it as an input, not a constant."""
    targets = sampler.trained_targets(step)
    return torch.tensor(ranks.world_size / targets if targets else 0.0, device=backend.device)


def _no_empty_mean(targets: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``targets``, or all zeros when none is trained (``count`` 0): the mean over no target is
    NaN, and its backward divides by a zero weight; token 0 gives a finite loss that the caller
    weights by 0. On the device, without a host read."""
    return torch.where(count > 0, targets, torch.zeros_like(targets))


def _num_params(cfg: TrainConfig) -> int:
    """The preset's parameter count, from a model on the meta device (no memory, no init)."""
    with torch.device("meta"):
        return GPT(cfg.model).num_params()


def flops_per_token(cfg: TrainConfig) -> float:
    """Training FLOPs per token of ``cfg``'s model (see
    :func:`trainer.metrics.train_flops_per_token`), counted on a model on the meta device with
    the run's LoRA adapters: the embedding lookups
    (learned positions, and the input embedding unless it is the tied output head) are not
    matrix products; a LoRA run trains the adapters only."""
    with torch.device("meta"):
        gpt = GPT(cfg.model)
        if cfg.lora is not None:
            lora.apply(gpt, cfg.model, cfg.lora)
    lookups = {id(gpt.pos.weight)} if gpt.pos is not None else set()
    if not cfg.model.tie_embeddings:
        lookups.add(id(gpt.tok.weight))
    products = [p for p in gpt.parameters() if id(p) not in lookups]
    return train_flops_per_token(
        matmul_params=sum(p.numel() for p in products),
        trained_params=sum(p.numel() for p in products if p.requires_grad),
        layers=cfg.model.n_layer,
        width=cfg.model.d_model,
        seq_len=cfg.model.seq_len,
    )


def _fsdp_sharded(cfg: TrainConfig, ranks: parallel.Ranks, backend: device.Backend) -> bool:
    """Whether the model is sharded: FSDP2 on several ranks of a backend whose gradients it
    reduces (every one but XLA, see :func:`trainer.parallel.wrap`)."""
    return ranks.distributed and cfg.parallelism == "fsdp" and backend.reduces_in_backward


def _initial_model(cfg: TrainConfig, backend: device.Backend) -> GPT:
    """The model as training starts: ``cfg.model_dir``'s weights or the preset's random ones
    (drawn with ``cfg.seed``), with LoRA adapters when ``cfg.lora`` asks (drawn after) and its
    frozen weights in the backend's :meth:`~trainer.device.Backend.frozen_dtype`."""
    torch.manual_seed(cfg.seed)
    gpt = hf.load_pretrained(cfg.model_dir, cfg.model) if cfg.model_dir else GPT(cfg.model)
    if cfg.lora is not None:
        _with_adapters(gpt, cfg, backend)
    return gpt


def _with_adapters(gpt: GPT, cfg: TrainConfig, backend: device.Backend) -> None:
    """``cfg.lora``'s adapters on ``gpt`` (the optimizer then sees them only) and the frozen
    weights cast to the backend's :meth:`~trainer.device.Backend.frozen_dtype`."""
    assert cfg.lora is not None
    lora.apply(gpt, cfg.model, cfg.lora)
    dtype = backend.frozen_dtype()
    if dtype is not None:
        lora.cast_frozen(gpt, dtype)


def build_model(
    cfg: TrainConfig,
    ranks: parallel.Ranks,
    backend: device.Backend,
    *,
    activation_checkpointing: bool = False,
) -> tuple[torch.nn.Module, Callable[..., torch.Tensor]]:
    """The model wrapped for data parallelism and its forward (see
    :func:`trainer.parallel.wrap`).

    A ``--model`` run on several FSDP2 ranks never holds the full weights on a rank but rank 0:
    every rank builds the model on the meta device and shards it, rank 0 alone reads the
    safetensors files (:func:`trainer.hf.load_pretrained`, plus the LoRA adapters drawn as one
    rank would), and torch's ``set_model_state_dict`` with ``broadcast_from_rank0`` sends each
    tensor from rank 0 to every rank, which keeps its shard. The RoPE tables (buffers that are
    not in the state) are computed again on every rank after ``to_empty``.
    """
    if not (cfg.model_dir and _fsdp_sharded(cfg, ranks, backend)):
        gpt = _initial_model(cfg, backend)
        model, forward = parallel.wrap(
            backend.prepare_model(gpt),
            ranks,
            cfg.parallelism,
            backend,
            activation_checkpointing=activation_checkpointing,
        )
        return model, forward
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full = _initial_model(cfg, backend).state_dict() if ranks.is_main else {}
    with torch.device("meta"):
        gpt = GPT(cfg.model)
        if cfg.lora is not None:
            _with_adapters(gpt, cfg, backend)
    model, forward = parallel.wrap(
        gpt, ranks, cfg.parallelism, backend, activation_checkpointing=activation_checkpointing
    )
    model.to_empty(device=backend.device)
    set_model_state_dict(
        model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    del full
    with torch.device(backend.device):
        gpt.init_rope()
    return model, forward


def train(cfg: TrainConfig) -> TrainResult:
    """Trains ``cfg.preset``, or ``cfg.model_dir``'s model from its weights, for its steps
    (:func:`total_steps`) or until SIGTERM, resuming from the newest valid
    checkpoint in ``cfg.checkpoint_dir`` and appending to ``cfg.metrics``.

    Raises:
        ValueError: invalid config (see :meth:`TrainConfig.validate`), an unavailable device, a
            device that cannot run on ``cfg.instance_type`` (TorchNeuron on trn1), a plan it
            cannot train (see :meth:`trainer.device.Backend.check_plan`), or data it cannot
            make rows of (see :func:`training_sampler`, :func:`eval_sampler`).
        trainer.data.ShardError: a shard or the manifest is wrong; the message names it.
        trainer.checkpoint.RunConfigError: the newest checkpoint was saved with another preset,
            model, sequence length, seed, global batch, schedule, epochs or dataset.
        trainer.hf.HFConfigError, trainer.hf.HFWeightsError: ``cfg.model_dir`` holds a model
            this trainer does not implement, or weights that do not match its config.
    """
    started_at, started = datetime.now(UTC), time.perf_counter()  # the run header's clock
    cfg.validate()
    ranks = parallel.ranks_from_env()
    backend = device.resolve(cfg.device, compile_backend=cfg.compile, local_rank=ranks.local_rank)
    backend.check_instance(cfg.instance_type)
    num_params = _num_params(cfg)
    backend.check_plan(
        strategy=cfg.parallelism,
        model=_model_label(cfg),
        num_params=num_params,
        instance_type=cfg.instance_type,
    )
    backend.fit_compile(sharded=_fsdp_sharded(cfg, ranks, backend))
    parallel.init(ranks, backend.dist_backend)
    backend.start()  # after the process group: see Backend.start
    control = parallel.control_group(ranks)

    dataset = open_dataset_per_node(cfg.data, ranks, control, verify=cfg.verify_data)
    if cfg.model_dir:
        tokenizing.check_data_for_model(cfg.data, cfg.model_dir)
    elif dataset.vocab_size > cfg.model.vocab_size:
        raise ValueError(
            f"data vocabulary {dataset.vocab_size} ({dataset.tokenizer}) exceeds "
            f"{_model_label(cfg)} vocabulary {cfg.model.vocab_size}"
        )
    sampler = training_sampler(cfg, dataset, ranks)
    held_out = eval_sampler(cfg, dataset, ranks)
    max_steps = total_steps(cfg, sampler)
    data = data_summary(sampler, held_out)
    if ranks.is_main:
        note = _data_line(data) if data is not None else _stream_note(dataset)
        if note:
            print(note, file=sys.stderr)

    model, forward = build_model(
        cfg, ranks, backend, activation_checkpointing=cfg.checkpoints_blocks(num_params)
    )
    optimizer = optim.build(model, lr=cfg.peak_lr, weight_decay=cfg.decay, betas=cfg.betas)

    checkpointer = (
        Checkpointer(
            open_store(cfg.checkpoint_dir),
            cfg.keep_checkpoints,
            hf.carried_files(cfg.model_dir) if cfg.model_dir else (),
            # Absolute: an export from another working directory reads the base from it.
            str(Path(cfg.model_dir).resolve()) if cfg.model_dir else "",
        )
        if cfg.checkpoint_dir
        else None
    )
    run = run_config(
        cfg,
        world_size=ranks.world_size,
        manifest_sha256=dataset.manifest_sha256,
        model_id=hf.fingerprint(cfg.model_dir) if cfg.model_dir else None,
        total_steps=max_steps,
        packed=data is not None,
    )
    # FSDP2's state is sharded: each rank writes its shards rather than gathering on rank 0.
    sharded = _fsdp_sharded(cfg, ranks, backend)
    start = 0
    if checkpointer is not None:
        start = resume_newest(checkpointer, model, optimizer, run=run, ranks=ranks, group=control)

    peak = cfg.peak_flops or backend.peak_flops(instance_type=cfg.instance_type)
    flops = flops_per_token(cfg)
    frozen = backend.frozen_dtype()
    settings = cfg.settings(
        frozen_dtype="fp32" if frozen is None else device.dtype_name(frozen),
        compile_backend=backend.compile_backend,
    )
    if ranks.is_main:
        print(f"trn-train: run settings {json.dumps(settings)}", file=sys.stderr)
    precision = backend.precision()
    tokens_per_step = cfg.model.seq_len * cfg.batch_per_rank * cfg.grad_accum * ranks.world_size
    header = run_header(
        started_at=started_at,
        nodes=ranks.world_size // ranks.local_world_size,
        world_size=ranks.world_size,
        device=backend.name,
        precision=precision,
        model=Path(cfg.model_dir).name if cfg.model_dir else cfg.preset,
        seq_len=cfg.model.seq_len,
        global_batch_tokens=tokens_per_step,
        flops_per_token=flops,
        peak_flops_per_rank=peak,
        settings=settings,
    )
    log = MetricsLog(
        cfg.metrics if ranks.is_main else "",
        total_steps=max_steps,
        progress=cfg.progress if ranks.is_main else False,
        header=header if data is None else {**header, "data": data},
        started=started,
        sink=emf.from_env(os.environ) if ranks.is_main else None,
    )
    batches = backend.batches(_stream(sampler, start, max_steps, cfg.grad_accum))
    # Packed rows' padding is never a target, so every packed step weighs its trained targets.
    weighted = isinstance(sampler, PackedSampler) or dataset.masks is not None

    loss_sum = torch.zeros((), device=backend.device)
    logged_steps, last_loss, saved_at, preempted = 0, None, None, False
    step = start
    with StopFlag() as stop, contextlib.ExitStack() as guards:
        interval_start = time.perf_counter()
        while step < max_steps:
            lr = optim.lr_at(
                step,
                peak=cfg.peak_lr,
                warmup=cfg.warmup_for(max_steps),
                total=max_steps,
                min_ratio=cfg.min_lr_ratio,
            )
            optim.set_lr(optimizer, lr)
            weight = _target_weight(sampler, step, ranks, backend) if weighted else None
            for micro in range(cfg.grad_accum):
                x, y, *positions = next(batches)
                if weight is not None:
                    count = (y != IGNORE_INDEX).sum()
                    y = _no_empty_mean(y, count)
                with parallel.gradient_sync(model, micro == cfg.grad_accum - 1), backend.autocast():
                    loss = forward(x, y, *positions)
                if weight is None:
                    loss = loss / cfg.grad_accum
                else:
                    # The micro-batch's sum over its trained targets, over the step's count: the
                    # step's loss is the mean over every trained target however ranks and
                    # micro-steps split it.
                    loss = torch.where(count > 0, loss * count, 0.0) * weight
                loss.backward()  # type: ignore[no-untyped-call]
                loss_sum += loss.detach()
            backend.reduce_gradients(optimizer, ranks.world_size)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            backend.step_boundary()
            step += 1
            logged_steps += 1
            if step == start + 1 and cfg.fail_on_recompile and backend.compile_backend is not None:
                # Warm-up is over: from here a recompile means a shape or guard changed.
                guards.enter_context(torch.compiler.set_stance("fail_on_recompile"))

            if step % cfg.log_every == 0 or step == max_steps:
                mean_loss = parallel.all_mean(loss_sum, ranks) / logged_steps
                last_loss = mean_loss.item()  # the one device-to-host read per interval
                backend.synchronize()
                elapsed = time.perf_counter() - interval_start
                tokens_per_s = tokens_per_step * logged_steps / elapsed
                log.write(
                    {
                        "step": step,
                        "loss": last_loss,
                        "lr": lr,
                        "grad_norm": float(grad_norm),
                        "tokens_per_s": tokens_per_s,
                        "mfu": mfu(tokens_per_s / ranks.world_size, flops, peak),
                        "precision": precision,
                        "step_time_s": elapsed / logged_steps,
                        "tokens": step * tokens_per_step,
                    }
                )
                loss_sum.zero_()
                logged_steps = 0
                interval_start = time.perf_counter()

            if held_out is not None and step % cfg.eval_every == 0:
                eval_loss, eval_targets = evaluate(
                    forward, held_out, eval_batches(cfg, held_out), backend, ranks
                )
                log.write_eval({"step": step, "eval_loss": eval_loss, "eval_tokens": eval_targets})

            preempted = parallel.any_rank(stop.set, ranks, control)
            periodic = cfg.checkpoint_every and step % cfg.checkpoint_every == 0
            if checkpointer is not None and (periodic or preempted or step == max_steps):
                saved_at = checkpointer.save(
                    step,
                    model,
                    optimizer,
                    main=ranks.is_main,
                    run=run,
                    sharded=sharded,
                    ranks=ranks,
                    group=control,
                )
            if preempted:
                break
    log.close()
    parallel.shutdown()
    return TrainResult(step, last_loss, preempted, saved_at)
