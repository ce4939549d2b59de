"""The classification task (``trn-train run --task classify``), as the loop calls a task: its
batches (one example a row, :class:`~trainer.classify.data.ClassifySampler`), the loss of a
micro-batch and its held-out figures.

A step's loss is the mean over the step's examples however ranks and micro-batches split them
(weighted by class with ``--class-weights auto``, see :func:`trainer.classify.model.loss_sum`):
each micro-batch's loss sum is scaled by ``world_size / normalizer`` of the whole step, which
every rank computes on the host from ``(seed, step)`` alone. Eval: every held-out example once,
each rank its rows, the counts gathered on the control group (exact, on the CPU), giving every
rank the same :class:`~trainer.classify.evaluate.Totals`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainer import device, parallel
from trainer.classify.data import ClassifySampler, Labels
from trainer.classify.evaluate import Totals, evaluate
from trainer.classify.metrics import Tally
from trainer.classify.model import normalizer

# What --best-metric may name, and whether larger is better.
BEST_METRICS = {"accuracy": True, "macro_f1": True, "micro_f1": True, "loss": False}


@dataclass(frozen=True)
class Classify:
    """Sequence classification on ``sampler``'s rows, evaluated on ``held_out``'s (None: no
    eval); ``class_weights`` per class or None."""

    sampler: ClassifySampler
    held_out: ClassifySampler | None
    labels: Labels
    class_weights: np.ndarray | None
    ranks: parallel.Ranks
    backend: device.Backend
    control: dist.ProcessGroup | None = None

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, ...]:
        return self.sampler.batch(step, micro)

    def step_weight(self, step: int) -> torch.Tensor:
        """``world_size`` over the step's :func:`~trainer.classify.model.normalizer` (0 for a
        step of empty rows only), a device tensor."""
        picks = self.sampler.step_examples(step)
        real = picks >= 0
        labels = self.labels.train[np.where(real, picks, 0)]
        total = normalizer(
            labels, real, multi_label=self.labels.multi_label, class_weights=self.class_weights
        )
        value = self.ranks.world_size / total if total else 0.0
        return torch.tensor(value, device=self.backend.device)

    def loss(
        self,
        forward: Callable[..., torch.Tensor],
        batch: tuple[torch.Tensor, ...],
        weight: torch.Tensor | None,
    ) -> torch.Tensor:
        x, labels, rows = batch
        assert weight is not None, "a classification step is always weighted"
        return forward(x, labels, rows) * weight

    def evaluate(self, forward: Callable[..., torch.Tensor]) -> dict[str, object]:
        """``eval_loss``, ``eval_accuracy`` (multi-label ``eval_exact_match``),
        ``eval_macro_f1``, ``eval_micro_f1``, ``eval_examples``, and ``per_class`` and
        ``confusion`` (see :class:`~trainer.classify.metrics.Tally`)."""
        assert self.held_out is not None, "the loop evaluates only with eval_every"
        held_labels = self.labels.eval
        assert held_labels is not None
        # The forward was compiled with gradients; eval's graph without them is not worth a
        # compile for a few batches (nor an error under fail_on_recompile).
        with torch.compiler.set_stance("eager_on_recompile"):
            mine = evaluate(forward, self.held_out, self.labels, self.backend.device)
        totals = Totals(Tally(self.labels.names, self.labels.multi_label))
        for share in parallel.all_gather_object(mine, self.ranks, self.control):
            assert isinstance(share, Totals)
            totals.merge(share)
        figures = totals.result()
        record: dict[str, Any] = {
            f"eval_{k}": v for k, v in figures.items() if k not in ("per_class", "confusion")
        }
        return {**record, "per_class": figures["per_class"], "confusion": figures["confusion"]}
