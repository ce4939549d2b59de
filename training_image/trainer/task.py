"""What a training task gives the loop (:mod:`trainer.loop`): its batches, the loss of a
micro-batch, and its eval figures.

The loop owns everything a task does not: the learning-rate schedule, gradient accumulation,
data parallelism, autocast, backward, clipping, the optimizer, logging, checkpoints and
preemption. A task owns what is specific to its objective. :class:`trainer.causal_lm.CausalLM`
(next-token cross-entropy over packed rows or windows of a token stream) is the one the
trainer runs today; a classification head or a recommender is another class with these four
methods, built in set-up (:func:`trainer.loop.set_up`) in its place, with the step
(:func:`trainer.loop.train_step`) unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

# One micro-batch: host tensors as the task's sampler draws them (moved to the device by
# :meth:`trainer.device.Backend.batches` before the task sees them in :meth:`Task.loss`).
Batch = tuple[torch.Tensor, ...]
# The wrapped model's forward (see :func:`trainer.parallel.wrap`): inputs in, a loss out.
Forward = Callable[..., torch.Tensor]


class Task(Protocol):
    """A training objective, as the loop calls it."""

    def batch(self, step: int, micro: int) -> Batch:
        """Micro-batch ``micro`` of optimizer step ``step`` for this rank, on the host; the same
        for the same arguments, so that a resumed run draws what the interrupted one would."""
        ...

    def step_weight(self, step: int) -> torch.Tensor | None:
        """What :meth:`loss` needs of step ``step`` as a whole, computed once before its
        micro-batches (a device tensor, so that a lazy graph takes it as an input), or None."""
        ...

    def loss(self, forward: Forward, batch: Batch, weight: torch.Tensor | None) -> torch.Tensor:
        """The loss of one micro-batch (on the device), scaled so that the sum over a step's
        micro-batches and ranks' mean is the step's loss: backward runs on it and the loop logs
        the interval's mean of those sums as ``loss``. ``forward`` runs the model under the
        step's autocast and gradient synchronization; ``weight`` is :meth:`step_weight`'s."""
        ...

    def evaluate(self, forward: Forward) -> dict[str, object]:
        """The held-out figures, the same on every rank, logged as one eval record beside its
        step (called every ``eval_every`` steps, never when it is 0)."""
        ...
