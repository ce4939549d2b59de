"""The causal language-model task: next-token cross-entropy over packed rows of whole examples
(a dataset of examples, :mod:`trainer.packing`) or windows of a token stream
(:class:`~trainer.data.WindowSampler`), and the held-out loss as its eval. The one
:class:`~trainer.task.Task` the trainer runs today; see :mod:`trainer.loop`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainer import device, parallel
from trainer.config import TrainConfig
from trainer.data import IGNORE_INDEX, Dataset, WindowSampler
from trainer.packing import PackedSampler
from trainer.task import Batch, Forward

# A token stream is drawn in windows; a dataset of examples in packed rows (trainer.packing).
Sampler = WindowSampler | PackedSampler


@dataclass(frozen=True)
class CausalLM:
    """Next-token cross-entropy on ``sampler``'s batches (:class:`~trainer.task.Task`).

    ``weighted`` (packed rows, or a masked token stream): a step's loss is the mean over every
    trained target of the step, however ranks and micro-batches split them; otherwise each
    micro-batch's mean counts ``1 / grad_accum``. Eval: the mean loss over ``eval_batches``
    batches of ``held_out`` (see :func:`evaluate`)."""

    sampler: Sampler
    held_out: Sampler | None
    eval_batches: int
    grad_accum: int
    weighted: bool
    ranks: parallel.Ranks
    backend: device.Backend

    def batch(self, step: int, micro: int) -> Batch:
        return self.sampler.batch(step, micro)

    def step_weight(self, step: int) -> torch.Tensor | None:
        if not self.weighted:
            return None
        return _target_weight(self.sampler, step, self.ranks, self.backend)

    def loss(self, forward: Forward, batch: Batch, weight: torch.Tensor | None) -> torch.Tensor:
        x, y, *positions = batch
        if weight is None:
            return forward(x, y, *positions) / self.grad_accum
        count = (y != IGNORE_INDEX).sum()
        loss = forward(x, _no_empty_mean(y, count), *positions)
        # The micro-batch's sum over its trained targets, over the step's count: the step's
        # loss is the mean over every trained target however ranks and micro-steps split it.
        return torch.where(count > 0, loss * count, 0.0) * weight

    def evaluate(self, forward: Forward) -> dict[str, object]:
        """``eval_loss`` and ``eval_tokens`` (see :func:`evaluate`)."""
        assert self.held_out is not None, "the loop evaluates only with eval_every, see build"
        loss, targets = evaluate(
            forward, self.held_out, self.eval_batches, self.backend, self.ranks
        )
        return {"eval_loss": loss, "eval_tokens": targets}


def build(
    cfg: TrainConfig,
    seq_len: int,
    dataset: Dataset,
    ranks: parallel.Ranks,
    backend: device.Backend,
) -> CausalLM:
    """The task of ``cfg`` on ``dataset`` in rows of ``seq_len`` for this rank: its training sampler
    (:func:`training_sampler`) and, when eval is on, its held-out one (:func:`eval_sampler`).

    Raises:
        ValueError: see :func:`training_sampler` and :func:`eval_sampler`.
    """
    sampler = training_sampler(cfg, seq_len, dataset, ranks)
    held_out = eval_sampler(cfg, seq_len, dataset, ranks)
    return CausalLM(
        sampler,
        held_out,
        eval_batches(cfg, held_out) if held_out is not None else 0,
        cfg.grad_accum,
        # Packed rows' padding is never a target, so every packed step weighs its targets.
        isinstance(sampler, PackedSampler) or dataset.masks is not None,
        ranks,
        backend,
    )


def training_sampler(
    cfg: TrainConfig, seq_len: int, dataset: Dataset, ranks: parallel.Ranks
) -> Sampler:
    """This rank's sampler of the training split in rows of ``seq_len``: packed rows of whole
    examples for a dataset of examples (:class:`~trainer.packing.PackedSampler`), windows of a
    token stream (:class:`~trainer.data.WindowSampler`) otherwise.

    Raises:
        ValueError: ``cfg.epochs`` with a token stream; no example or shard fits a row.
    """
    options: dict[str, Any] = {
        "seq_len": seq_len,
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


def eval_sampler(
    cfg: TrainConfig, seq_len: int, dataset: Dataset, ranks: parallel.Ranks
) -> Sampler | None:
    """The sampler of the held-out split in rows of ``seq_len`` when ``cfg.eval_every`` asks
    for eval, None when eval is off. A split of examples: every example once, packed in their
    stored order into rows of which each eval batch gives this rank its ``cfg.batch_per_rank``
    (:func:`eval_batches` of them cover the split), the rows `trn-train eval` reads. A token
    stream: this rank's rows of each of the batches ``0 .. eval_batches - 1``, drawn with
    ``cfg.seed``. The same batches at every eval.

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
        "seq_len": seq_len,
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
            f"{seq_len} ({error}); prepare the data with a larger --eval-fraction"
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


def data_note(summary: dict[str, object] | None, dataset: Dataset) -> str:
    """The line the run's log gets about its data: :func:`data_summary`'s for packed rows, a
    warning for a masked token stream, nothing for other streams."""
    return _data_line(summary) if summary is not None else _stream_note(dataset)


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
    forward: Forward,
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
