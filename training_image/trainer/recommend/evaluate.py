"""Held-out ranking of a two-tower model against the full item set (:mod:`.metrics`), as the
loop's eval calls it and as ``trn-train eval`` runs it on a checkpoint or an exported directory,
and ``trn-train predict``'s top-K items for each line of a file.

Every rank scores every item (the item vectors of the whole catalogue, in blocks) and ranks its
share of the held-out interactions in blocks of the same size on every rank, empty rows filling
the last: with row-sharded tables each lookup is a collective that every rank joins.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer import parallel
from trainer.recommend.data import Interactions
from trainer.recommend.metrics import DEFAULT_K, RankTally, ranks
from trainer.recommend.model import TwoTower

if TYPE_CHECKING:
    from trainer.recommend.export import Exported

DEFAULT_MICRO_BATCH = 256


@torch.no_grad()
def rank_rows(
    model: TwoTower,
    rows: np.ndarray,
    device: torch.device,
    *,
    k: int = DEFAULT_K,
    micro_batch: int = DEFAULT_MICRO_BATCH,
    ranks_: parallel.Ranks | None = None,
    items: torch.Tensor | None = None,
) -> RankTally:
    """This rank's :class:`RankTally` of stored held-out ``rows`` (every ``world_size``-th block
    of ``micro_batch`` rows from block ``rank`` on) against every item: ``items`` (default: the
    item tower's :meth:`~trainer.recommend.model.TwoTower.item_vectors`)."""
    layout = ranks_ or parallel.Ranks()
    if items is None:
        items = model.item_vectors(device)
    tally = RankTally(k)
    per_round = micro_batch * layout.world_size
    for start in range(0, math.ceil(rows.shape[0] / per_round) * per_round, per_round):
        mine = rows[start + layout.rank * micro_batch : start + (layout.rank + 1) * micro_batch]
        batch = np.zeros((micro_batch, rows.shape[1]), dtype=np.int64)
        batch[: mine.shape[0]] = mine
        users = model.users(torch.from_numpy(batch).to(device)).float()
        scores = users[: mine.shape[0]] @ items.T / model.cfg.temperature
        targets = torch.from_numpy(mine[:, 1].astype(np.int64)).to(device)
        tally.add(ranks(scores, targets), F.cross_entropy(scores, targets, reduction="none"))
    return tally


def gathered(
    tally: RankTally, ranks_: parallel.Ranks, group: dist.ProcessGroup | None
) -> RankTally:
    """The tallies of every rank merged (the same on every rank)."""
    total = RankTally(tally.k)
    for share in parallel.all_gather_object(tally, ranks_, group):
        assert isinstance(share, RankTally)
        total.merge(share)
    return total


@torch.no_grad()
def top_k(model: TwoTower, rows: np.ndarray, items: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` best item ids ``(n, k)`` for each stored row's user, best first (ties: the lower
    id first), against ``items`` (see :meth:`~trainer.recommend.model.TwoTower.item_vectors`)."""
    users = model.users(torch.from_numpy(rows.astype(np.int64)).to(items.device)).float()
    scores = users @ items.T
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    return order[:, :k]


SPLITS = ("eval", "train")


def run(
    *,
    data_dir: str,
    model_dir: str = "",
    checkpoint_dir: str = "",
    split: str = "eval",
    k: int = DEFAULT_K,
    micro_batch: int = DEFAULT_MICRO_BATCH,
    device_name: str = "auto",
) -> dict[str, float | int]:
    """``trn-train eval`` on interactions: ``loss``, ``recall@K``, ``ndcg@K``, ``mrr`` and
    ``examples`` (see :class:`~trainer.recommend.metrics.RankTally`) of ``split`` (``eval`` or
    ``train``) of ``data_dir``, for the exported model in ``model_dir`` (its item embeddings as
    written) or the newest valid checkpoint of a ``--task recommend`` run in ``checkpoint_dir``
    (exactly one).

    Raises:
        ValueError: both or neither model source, an unknown split, one the data does not have,
            ``k`` or ``micro_batch`` below 1, a model whose tables are not the data's; see
            :func:`trainer.recommend.export.load`.
        trainer.checkpoint.CheckpointError: see :func:`trainer.recommend.export.from_checkpoint`.
    """
    from trainer import data, device
    from trainer.recommend import data as rec_data

    if bool(model_dir) == bool(checkpoint_dir):
        raise ValueError("give exactly one of --model DIR and --checkpoint-dir CK")
    if split not in SPLITS:
        raise ValueError(f"--split {split!r} of interactions; allowed: {', '.join(SPLITS)}")
    if k < 1 or micro_batch < 1:
        raise ValueError(f"--top-k and --micro-batch must be >= 1, got {k} and {micro_batch}")
    interactions = rec_data.open_interactions(data.open_dataset(data_dir, verify=False))
    rows = interactions.train if split == "train" else interactions.eval
    if rows is None or not rows.shape[0]:
        raise ValueError(f"--data {data_dir} has no held-out split; --split train reads the rest")
    model, embeddings = _model(model_dir, checkpoint_dir)
    _check_fits(model, interactions, data_dir)
    backend = device.resolve(device_name, compile_backend="none").start()
    model = model.to(backend.device)
    items = None if embeddings is None else embeddings.to(backend.device)
    return rank_rows(
        model, rows, backend.device, k=k, micro_batch=micro_batch, items=items
    ).result()


def _model(model_dir: str, checkpoint_dir: str) -> tuple[TwoTower, torch.Tensor | None]:
    """The model to evaluate and, of an export, its written item embeddings."""
    from trainer.checkpoint import Checkpointer, CheckpointError, open_store
    from trainer.recommend import export

    if model_dir:
        exported = export.load(model_dir)
        return exported.model, exported.embeddings
    checkpointer = Checkpointer(open_store(checkpoint_dir))
    try:
        name = checkpointer.newest_valid()
        if name is None:
            raise CheckpointError(f"{checkpoint_dir} holds no valid checkpoint to evaluate")
        return export.from_checkpoint(checkpointer, name)[0], None
    finally:
        checkpointer.store.drop_local_copies()


def _check_fits(model: TwoTower, interactions: Interactions, data_dir: str) -> None:
    cfg, layout = model.cfg, interactions.layout
    sizes = interactions.maps.sizes()
    ours = (cfg.num_users, cfg.num_items, cfg.history)
    theirs = (interactions.num_users, interactions.num_items, layout.history)
    features = (cfg.user_feature_sizes, cfg.item_feature_sizes)
    data_features = (
        tuple(sizes[n] for n in layout.user_features),
        tuple(sizes[n] for n in layout.item_features),
    )
    if ours != theirs or features != data_features:
        raise ValueError(
            f"the model's tables (users, items, history {ours}; feature sizes {features}) are "
            f"not those of --data {data_dir} ({theirs}; {data_features}): evaluate a model on "
            "the data it was trained on"
        )


def predict(*, model_dir: str, input_path: str, out: str, k: int = DEFAULT_K) -> int:
    """``trn-train predict`` of an exported two-tower model: for each JSON line of
    ``input_path`` (``user_id``, optionally ``history``, the user's previous item ids latest
    first, and the user features by name; unknown or missing features count as unknown), the
    line with ``items`` (the ``k`` best item ids, best first, scored against the exported item
    embeddings alone) and ``scores`` (their dot products), written to ``out``. Returns the
    lines written.

    Raises:
        ValueError: ``k`` below 1, a line whose user or history item the model does not know
            (the line, field and value named); see :func:`trainer.recommend.export.load`.
    """
    from trainer import tokenizing
    from trainer.recommend import export
    from trainer.recommend.data import InteractionsError

    if k < 1:
        raise ValueError(f"--top-k must be >= 1, got {k}")
    exported = export.load(model_dir)
    lines = list(tokenizing._json_lines(Path(input_path)))
    if not lines:
        raise InteractionsError(f"--input {input_path} holds no lines")
    rows = np.stack([query_row(exported, where, raw) for where, raw in lines])
    best = top_k(exported.model, rows, exported.embeddings, min(k, exported.model.cfg.num_items))
    users = exported.model.users(torch.from_numpy(rows)).float()
    with Path(out).open("w", encoding="utf-8") as f:
        for (_, raw), ids, user in zip(lines, best, users, strict=True):
            scores = (exported.embeddings[ids] @ user).tolist()
            items = [exported.maps.items[i] for i in ids.tolist()]
            f.write(json.dumps({**raw, "items": items, "scores": scores}) + "\n")
    return len(lines)


def query_row(exported: Exported, where: str, raw: Mapping[str, Any]) -> np.ndarray:
    """The stored row (see :mod:`trainer.recommend.data`) of one query line.

    Raises:
        trainer.recommend.data.InteractionsError: an unknown user or history item, or a
            history that is not a list.
    """
    from trainer.recommend.data import InteractionsError

    layout, maps = exported.layout, exported.maps
    row = np.zeros(layout.width, dtype=np.int64)
    user = str(raw.get("user_id"))
    users = {name: i for i, name in enumerate(maps.users)}
    if user not in users:
        raise InteractionsError(
            f"{where}: field 'user_id' is {raw.get('user_id')!r:.60}; allowed: a user of the "
            f"model's users.json ({len(users)} users)"
        )
    row[0] = users[user]
    history = raw.get("history", [])
    items = {name: i for i, name in enumerate(maps.items)}
    if not isinstance(history, list) or any(str(h) not in items for h in history):
        raise InteractionsError(
            f"{where}: field 'history' is {history!r:.60}; allowed: a list of item ids of the "
            "model's items.json, latest first"
        )
    recent = [items[str(h)] + 1 for h in history[: layout.history]]
    row[2 : 2 + len(recent)] = recent
    for k, name in enumerate(layout.user_features):
        values = {v: j + 1 for j, v in enumerate(maps.features[name])}
        value = raw.get(name)
        row[2 + layout.history + k] = values.get(str(value), 0) if value is not None else 0
    return row
