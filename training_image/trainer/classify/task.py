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
from trainer.classify import encoder
from trainer.classify.data import ClassifySampler, Labels, open_labels
from trainer.classify.evaluate import Totals, evaluate
from trainer.classify.load import Classifier
from trainer.classify.metrics import Tally
from trainer.classify.model import (
    HeadSpec,
    SequenceClassifier,
    auto_class_weights,
    from_causal_lm,
    normalizer,
)
from trainer.config import ModelConfig, TrainConfig
from trainer.data import Dataset

TASK = "classify"


@dataclass(frozen=True)
class Classify:
    """Sequence classification on ``sampler``'s rows, evaluated on ``held_out``'s (None: no
    eval); ``class_weights`` per class or None; ``bert`` the shape of the BERT encoder the
    model directory holds (None: a decoder)."""

    sampler: ClassifySampler
    held_out: ClassifySampler | None
    labels: Labels
    class_weights: np.ndarray | None
    ranks: parallel.Ranks
    backend: device.Backend
    control: dist.ProcessGroup | None = None
    bert: encoder.BertConfig | None = None

    @property
    def head(self) -> HeadSpec:
        return HeadSpec(self.labels.names, self.labels.multi_label, self.labels.pad_token_id)

    def new_model(self, cfg: ModelConfig) -> Classifier:
        """A classifier of ``cfg`` (of :attr:`bert` for an encoder) with this task's head and
        class weights, its weights drawn (on the meta device: none)."""
        if self.bert is not None:
            return encoder.BertClassifier(self.bert, self.head, self._weights())
        return SequenceClassifier(cfg, self.head, self._weights())

    def pretrained(self, model_dir: str, cfg: ModelConfig) -> Classifier:
        """A classifier on ``model_dir``'s decoder or BERT encoder with a new head (see
        :func:`trainer.classify.model.from_causal_lm` and :func:`trainer.classify.encoder.load`)
        and this task's class weights."""
        model: Classifier
        if self.bert is not None:
            model = encoder.load(model_dir, seq_len=self.bert.seq_len, head=self.head)
        else:
            model = from_causal_lm(model_dir, cfg, self.head)
        model.class_weights = self._weights()
        return model

    def set_class_weights(self, model: torch.nn.Module) -> None:
        """Sets the classifier ``model``'s class weights (a buffer outside the state, as after
        ``to_empty``) on the default device."""
        assert isinstance(model, SequenceClassifier | encoder.BertClassifier)
        weights = self._weights()
        model.class_weights = None if weights is None else weights.to(torch.get_default_device())

    def _weights(self) -> torch.Tensor | None:
        return None if self.class_weights is None else torch.from_numpy(self.class_weights)

    def run_fields(self, class_weights: str) -> dict[str, object]:
        """What the run config records of the task, for resuming and export: the classes,
        multi-label, the pad token and the class weights setting."""
        return {
            "task": TASK,
            "labels": list(self.labels.names),
            "multi_label": self.labels.multi_label,
            "pad_token_id": self.labels.pad_token_id,
            "class_weights": class_weights,
        }

    def summary(self) -> dict[str, object]:
        """What the run header records of the data: the classes, the examples of each split,
        the rows' length and the steps of an epoch."""
        held = 0 if self.labels.eval is None else int(self.labels.eval.shape[0])
        return {
            "task": TASK,
            "classes": list(self.labels.names),
            "multi_label": self.labels.multi_label,
            "seq_len": self.sampler.seq_len,
            "train_examples": self.sampler.examples,
            "eval_examples": held,
            "steps_per_epoch": self.sampler.steps_in(0),
            "class_weights": None if self.class_weights is None else self.class_weights.tolist(),
        }

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


def build(
    cfg: TrainConfig,
    model: ModelConfig,
    dataset: Dataset,
    ranks: parallel.Ranks,
    backend: device.Backend,
    control: dist.ProcessGroup | None,
) -> tuple[Classify, int]:
    """The classification task of ``cfg`` on ``dataset`` for this rank, in rows of ``model``'s
    sequence length, on ``cfg.model_dir``'s decoder or BERT encoder, and the run's steps
    (``cfg.epochs`` whole epochs, else ``cfg.steps``).

    Raises:
        trainer.classify.data.LabelsError: the data is not of ``prepare-data --format
            classify``, or its label files fail their checks.
        ValueError: eval is on and the data has no held-out split.
    """
    labels = open_labels(cfg.data, verify=cfg.verify_data)
    options: dict[str, Any] = {
        "pad_token_id": labels.pad_token_id,
        "tail": labels.tail,
        "seq_len": model.seq_len,
        "micro_batch": cfg.batch_per_rank,
        "seed": cfg.seed,
        "rank": ranks.rank,
        "world_size": ranks.world_size,
    }
    sampler = ClassifySampler(dataset, labels.train, grad_accum=cfg.grad_accum, **options)
    held_out = None
    if cfg.eval_every:
        if dataset.eval_split is None or labels.eval is None:
            raise ValueError(
                f"eval_every {cfg.eval_every} needs a held-out split; {dataset.root} has none "
                "(prepare-data --format classify --eval-fraction F or --eval-input FILE)"
            )
        held_out = ClassifySampler(dataset.eval_split, labels.eval, shuffle=False, **options)
    weights = (
        auto_class_weights(labels.train, labels.num_labels) if cfg.class_weights == "auto" else None
    )
    bert = encoder.config_of(cfg.model_dir, seq_len=model.seq_len)
    task = Classify(sampler, held_out, labels, weights, ranks, backend, control, bert)
    return task, sampler.steps_for(cfg.epochs) if cfg.epochs else cfg.steps
