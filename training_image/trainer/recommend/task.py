"""The two-tower task (``trn-train run --task recommend``), as the loop calls a task: its batches
(one interaction a row, :class:`~trainer.recommend.data.InteractionSampler`), the loss of a
micro-batch and its held-out figures.

A step's loss is the mean over the step's interactions of the corrected in-batch softmax
cross-entropy (:class:`~trainer.recommend.model.TwoTower`), however ranks and micro-batches split
them: each micro-batch's loss sum is scaled by ``world_size / interactions`` of the whole step,
which every rank computes on the host from ``(seed, step)`` alone. The negatives of a row are
the other rows of its micro-batch on its rank. Eval: every held-out interaction ranked against
every item (:mod:`trainer.recommend.evaluate`), the tallies gathered on the control group.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainer import data, device, parallel
from trainer.config import TrainConfig
from trainer.recommend import evaluate as rec_eval
from trainer.recommend import sharding
from trainer.recommend.data import (
    ID_FILES,
    TASK,
    Interactions,
    InteractionSampler,
    InteractionsError,
    manifest_entry,
    open_interactions,
)
from trainer.recommend.metrics import DEFAULT_K
from trainer.recommend.model import TableFactory, TwoTower, TwoTowerConfig, embedding


def model_config(entry: Mapping[str, Any], cfg: TrainConfig) -> TwoTowerConfig:
    """The model of ``cfg``'s width and temperature for the tables of a dataset's manifest
    ``entry`` (:func:`trainer.recommend.data.manifest_entry`)."""
    sizes = entry["feature_sizes"]
    return TwoTowerConfig(
        num_users=int(entry["num_users"]),
        num_items=int(entry["num_items"]),
        user_feature_sizes=tuple(int(sizes[n]) for n in entry["user_features"]),
        item_feature_sizes=tuple(int(sizes[n]) for n in entry["item_features"]),
        history=int(entry["history"]),
        dim=cfg.embedding_dim,
        temperature=cfg.temperature,
    )


def carried_files(data_dir: str) -> tuple[Path, ...]:
    """The id maps of ``data_dir`` that the run's checkpoints carry, for its export."""
    return tuple(Path(data_dir) / name for name in ID_FILES.values())


def planned_params(cfg: TrainConfig, ranks: parallel.Ranks) -> int:
    """The parameters one rank of ``ranks`` holds of ``cfg``'s two-tower model on
    ``cfg.data`` (its share of the tables when :func:`shards_tables`), from the manifest alone.

    Raises:
        trainer.recommend.data.InteractionsError: ``cfg.data`` holds no interactions.
    """
    tables, mlps = param_count(model_config(manifest_entry(cfg.data), cfg))
    if shards_tables(cfg, ranks, tables):
        return math.ceil(tables / ranks.world_size) + mlps
    return tables + mlps


def shards_tables(cfg: TrainConfig, ranks: parallel.Ranks, table_params: int) -> bool:
    """Whether a run of ``cfg`` on ``ranks`` splits its tables (``table_params`` parameters)
    row-wise across the ranks (:mod:`trainer.recommend.sharding`): never on one rank or with
    ``shard_embeddings`` off; always with on; with auto, when their FP32 weights, gradients and
    AdamW state outgrow one rank's device memory on ``cfg.instance_type`` (a Neuron instance
    type of the catalog; without one, or with another, they are not split)."""
    import trn_catalog

    if not ranks.distributed or cfg.shard_embeddings == "off":
        return False
    if cfg.shard_embeddings == "on":
        return True
    if not cfg.instance_type:
        return False
    try:
        lnc = device.logical_nc_config(cfg.instance_type)
        memory = device.device_memory_per_rank(cfg.instance_type, lnc)
    except trn_catalog.UnknownInstanceTypeError:
        return False
    return table_params * device.TRAIN_STATE_BYTES_PER_PARAM > memory


def param_count(cfg: TwoTowerConfig) -> tuple[int, int]:
    """The parameters of a model of ``cfg``: in its tables, and in its MLPs."""
    tables = sum(n * cfg.dim for n in (*cfg.user_tables(), *cfg.item_tables()))
    mlps = sum(
        fields * cfg.dim * cfg.dim + cfg.dim + cfg.dim * cfg.dim + cfg.dim
        for fields in (len(cfg.user_tables()), len(cfg.item_tables()))
    )
    return tables, mlps


def flops_per_example(cfg: TwoTowerConfig, micro_batch: int) -> float:
    """Training FLOPs per interaction: forward and backward (3x the forward's 2 per
    multiply-add) of both MLPs and of the row's in-batch logits (``micro_batch`` dot products
    of ``dim``); the table lookups are not matrix products."""
    _, mlps = param_count(cfg)
    return 6.0 * (mlps + micro_batch * cfg.dim)


@dataclass
class Recommend:
    """Two-tower retrieval on ``sampler``'s rows, evaluated on ``interactions.eval`` when
    ``evaluates`` (else no eval), its tables split across the ranks when ``sharded``;
    ``model`` is the unwrapped model once set-up built it (:meth:`build_model`)."""

    sampler: InteractionSampler
    interactions: Interactions
    config: TwoTowerConfig
    ranks: parallel.Ranks
    backend: device.Backend
    control: dist.ProcessGroup | None = None
    evaluates: bool = False
    sharded: bool = False
    model: TwoTower | None = field(default=None, repr=False)

    def new_model(self, table: TableFactory = embedding) -> TwoTower:
        """A model of this task's config and data, its tables made by ``table`` (default
        plain ``nn.Embedding``), its weights drawn from the current RNG."""
        return TwoTower(
            self.config,
            torch.from_numpy(self.interactions.item_features),
            torch.from_numpy(self.interactions.item_counts),
            table,
        )

    def build_model(self, backend: device.Backend) -> TwoTower:
        """This task's model (:meth:`new_model`) on ``backend``'s device, kept as
        :attr:`model`: with :attr:`sharded`, its tables split across the ranks and left out of
        DDP's averaging.

        Raises:
            ValueError: split tables on a backend that reduces gradients itself (XLA), which
                would average the ranks' different rows.
        """
        if self.sharded and not backend.reduces_in_backward:
            raise ValueError(
                f"shard_embeddings: device {backend.name!r} reduces every gradient itself; "
                "split tables need DDP (the native Neuron stack, cuda or cpu), or "
                "--shard-embeddings off"
            )
        self.model = self.new_model(sharding.sharded_tables() if self.sharded else embedding)
        model = backend.prepare_model(self.model)
        if self.sharded:
            sharding.leave_out_of_ddp(model)
        return self.model

    def run_fields(self) -> dict[str, object]:
        """What the run config records of the task, for resuming and export: the model's
        config, the data's row layout, and whether the tables are split (a split run's
        checkpoint holds each rank's rows under their own names: it resumes split, on as many
        ranks)."""
        layout = self.interactions.layout.as_dict()
        fields = {"task": TASK, TASK: self.config.as_dict(), "layout": layout}
        split = {"sharded_tables": self.ranks.world_size} if self.sharded else {}
        return {**fields, **split}

    def summary(self) -> dict[str, object]:
        """What the run header records of the data: users, items, features, interactions of
        each split and the steps of an epoch."""
        held = self.interactions.eval
        return {
            "task": TASK,
            "users": self.config.num_users,
            "items": self.config.num_items,
            "history": self.config.history,
            "features": self.interactions.maps.sizes(),
            "train_examples": self.sampler.examples,
            "eval_examples": 0 if held is None else int(held.shape[0]),
            "steps_per_epoch": self.sampler.steps_in(0),
            "sharded_tables": self.sharded,
        }

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, ...]:
        return self.sampler.batch(step, micro)

    def step_weight(self, step: int) -> torch.Tensor:
        """``world_size`` over the step's interactions (0 for a step of empty rows only), a
        device tensor."""
        total = int(np.count_nonzero(self.sampler.step_examples(step) >= 0))
        value = self.ranks.world_size / total if total else 0.0
        return torch.tensor(value, device=self.backend.device)

    def loss(
        self,
        forward: Callable[..., torch.Tensor],
        batch: tuple[torch.Tensor, ...],
        weight: torch.Tensor | None,
    ) -> torch.Tensor:
        rows, real = batch
        assert weight is not None, "a recommendation step is always weighted"
        return forward(rows, real) * weight

    def evaluate(self, forward: Callable[..., torch.Tensor]) -> dict[str, object]:
        """``eval_loss`` (full-softmax cross-entropy), ``eval_recall@10``, ``eval_ndcg@10``,
        ``eval_mrr`` and ``eval_examples`` over every held-out interaction."""
        assert self.model is not None and self.interactions.eval is not None
        self.model.eval()
        try:
            mine = rec_eval.rank_rows(
                self.model,
                self.interactions.eval,
                self.backend.device,
                k=DEFAULT_K,
                micro_batch=self.sampler.micro_batch,
                ranks_=self.ranks,
            )
        finally:
            self.model.train()
        figures = rec_eval.gathered(mine, self.ranks, self.control).result()
        return {f"eval_{k}": v for k, v in figures.items()}


def build(
    cfg: TrainConfig,
    dataset: data.Dataset,
    ranks: parallel.Ranks,
    backend: device.Backend,
    control: dist.ProcessGroup | None,
) -> tuple[Recommend, int]:
    """The recommendation task of ``cfg`` on ``dataset`` for this rank, and the run's steps
    (``cfg.epochs`` whole epochs, else ``cfg.steps``).

    Raises:
        trainer.recommend.data.InteractionsError: the data is not of ``prepare-data --format
            interactions``, or its files fail their checks.
        ValueError: eval is on and the data has no held-out split.
    """
    interactions = open_interactions(dataset, verify=cfg.verify_data)
    if cfg.eval_every and (interactions.eval is None or not interactions.eval.shape[0]):
        raise ValueError(
            f"eval_every {cfg.eval_every} needs a held-out split; {dataset.root} has none "
            "(prepare-data --format interactions --eval-fraction F, F above 0)"
        )
    if not interactions.train.shape[0]:
        raise InteractionsError(f"--data {dataset.root} holds no training interactions")
    sampler = InteractionSampler(
        interactions.train,
        micro_batch=cfg.batch_per_rank,
        seed=cfg.seed,
        rank=ranks.rank,
        world_size=ranks.world_size,
        grad_accum=cfg.grad_accum,
    )
    config = model_config(manifest_entry(dataset.root), cfg)
    task = Recommend(
        sampler,
        interactions,
        config,
        ranks,
        backend,
        control,
        evaluates=bool(cfg.eval_every),
        sharded=shards_tables(cfg, ranks, param_count(config)[0]),
    )
    return task, sampler.steps_for(cfg.epochs) if cfg.epochs else cfg.steps
