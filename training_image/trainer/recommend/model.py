"""The two-tower model: a user tower and an item tower, each a set of ``nn.Embedding`` tables
pooled by an explicit masked mean, concatenated and put through a two-layer MLP onto the unit
sphere; a pair's score is the dot product of its two vectors over a temperature.

Why ``nn.Embedding`` and a hand-written mean rather than ``nn.EmbeddingBag``: the Neuron operator
list has ``aten::embedding`` but no ``embedding_bag`` (docs/recommendation.md), and a lookup of
a static ``(batch, k)`` shape with a 0/1 mask is one graph on every device.

Training (:meth:`TwoTower.forward`) is a sampled softmax over in-batch negatives with the logQ
correction of Yi et al., "Sampling-Bias-Corrected Neural Modeling for Large Corpus Item
Recommendations" (RecSys 2019, section 3): each candidate's logit loses the log of its sampling
probability, here its share of the training interactions (the probability it is drawn into a
batch, up to a factor the softmax cancels). Another row holding the same item as the positive is
not a negative ("accidental hit", masked out as TensorFlow Recommenders' ``Retrieval`` task does
with ``remove_accidental_hits``); empty rows of the batch are neither queries nor candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

DEFAULT_DIM = 64
DEFAULT_TEMPERATURE = 0.05
# A logit that takes no part in the softmax (finite, so an all-masked row is no NaN).
_MASKED = -1e9
# The smallest item count the logQ correction reads: an item without training interactions
# is never a candidate in training, and its log stays finite.
_MIN_COUNT = 1

# What looks ids up in a table: ``nn.Embedding`` itself, or a row-sharded table
# (:class:`trainer.recommend.sharding.RowShardedEmbedding`).
TableFactory = Callable[[int, int], nn.Module]


@dataclass(frozen=True)
class TwoTowerConfig:
    """The model's shape: table sizes (users, items, each user and item feature's values), the
    history length, the embedding width ``dim`` (default :data:`DEFAULT_DIM`) and the softmax
    ``temperature`` (default :data:`DEFAULT_TEMPERATURE`).

    Raises:
        ValueError: a size below 1 (users, items, dim), a feature of no values, a negative
            history or a temperature that is not above 0.
    """

    num_users: int
    num_items: int
    user_feature_sizes: tuple[int, ...] = ()
    item_feature_sizes: tuple[int, ...] = ()
    history: int = 0
    dim: int = DEFAULT_DIM
    temperature: float = DEFAULT_TEMPERATURE

    def __post_init__(self) -> None:
        for name in ("num_users", "num_items", "dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if any(n < 1 for n in (*self.user_feature_sizes, *self.item_feature_sizes)):
            raise ValueError("every feature must have at least one value")
        if self.history < 0:
            raise ValueError(f"history must be >= 0, got {self.history}")
        if not 0 < self.temperature < float("inf"):
            raise ValueError(f"temperature must be a number above 0, got {self.temperature}")

    def as_dict(self) -> dict[str, object]:
        return {
            "num_users": self.num_users,
            "num_items": self.num_items,
            "user_feature_sizes": list(self.user_feature_sizes),
            "item_feature_sizes": list(self.item_feature_sizes),
            "history": self.history,
            "dim": self.dim,
            "temperature": self.temperature,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> TwoTowerConfig:
        return cls(
            int(raw["num_users"]),  # type: ignore[call-overload]
            int(raw["num_items"]),  # type: ignore[call-overload]
            tuple(raw["user_feature_sizes"]),  # type: ignore[arg-type]
            tuple(raw["item_feature_sizes"]),  # type: ignore[arg-type]
            int(raw["history"]),  # type: ignore[call-overload]
            int(raw["dim"]),  # type: ignore[call-overload]
            float(raw["temperature"]),  # type: ignore[arg-type]
        )

    def user_tables(self) -> list[int]:
        """Rows of the user tower's tables: the users, the history's items (when the history
        is not empty), each user feature."""
        history = [self.num_items] if self.history else []
        return [self.num_users, *history, *self.user_feature_sizes]

    def item_tables(self) -> list[int]:
        """Rows of the item tower's tables: the items, each item feature."""
        return [self.num_items, *self.item_feature_sizes]


def masked_mean(table: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``table``'s rows at ``ids`` ``(batch, k)`` where ``mask`` is True, over
    ``k``: ``(batch, dim)``, zeros for a row with none (what ``EmbeddingBag(mode="mean")`` gives
    with per-sample weights of 0/1, built of a lookup, a product and a sum)."""
    vectors: torch.Tensor = table(torch.where(mask, ids, torch.zeros_like(ids)))
    weights = mask.to(vectors.dtype).unsqueeze(-1)
    count = weights.sum(dim=1).clamp(min=1.0)
    return (vectors * weights).sum(dim=1) / count


def optional_ids(stored: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and their mask of stored ``id + 1`` values (0: none)."""
    return (stored - 1).clamp(min=0), stored > 0


class Tower(nn.Module):
    """Tables (one per field), each field's masked mean concatenated, a two-layer MLP, and the
    result normalized to unit length."""

    def __init__(self, sizes: Sequence[int], dim: int, table: TableFactory) -> None:
        super().__init__()
        self.tables = nn.ModuleList(table(n, dim) for n in sizes)
        self.mlp = nn.Sequential(nn.Linear(len(sizes) * dim, dim), nn.ReLU(), nn.Linear(dim, dim))

    def forward(self, fields: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        pooled = [masked_mean(t, ids, m) for t, (ids, m) in zip(self.tables, fields, strict=True)]
        return F.normalize(self.mlp(torch.cat(pooled, dim=-1)), dim=-1)


def embedding(rows: int, dim: int) -> nn.Module:
    """A plain table, drawn as ``nn.Embedding`` draws it (standard normal)."""
    return nn.Embedding(rows, dim)


class TwoTower(nn.Module):
    """The user and item towers of ``cfg``; ``item_features`` (items by item features, ``id +
    1``, 0 unknown) and ``item_counts`` (training interactions per item) are buffers, so that
    the item tower takes item ids alone and the loss its logQ correction. ``table`` (default
    :func:`embedding`) makes each table."""

    item_features: torch.Tensor
    log_q: torch.Tensor

    def __init__(
        self,
        cfg: TwoTowerConfig,
        item_features: torch.Tensor,
        item_counts: torch.Tensor,
        table: TableFactory = embedding,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.user_tower = Tower(cfg.user_tables(), cfg.dim, table)
        self.item_tower = Tower(cfg.item_tables(), cfg.dim, table)
        self.register_buffer("item_features", item_features.to(torch.int64))
        counts = item_counts.to(torch.float64).clamp(min=_MIN_COUNT)
        self.register_buffer("log_q", (counts / counts.sum()).log().to(torch.float32))

    def users(self, rows: torch.Tensor) -> torch.Tensor:
        """The user vectors ``(batch, dim)`` of stored rows ``[user, item, history...,
        features...]`` (the item column is not read)."""
        h = self.cfg.history
        fields = [(rows[:, :1], torch.ones_like(rows[:, :1], dtype=torch.bool))]
        if h:
            fields.append(optional_ids(rows[:, 2 : 2 + h]))
        for k in range(len(self.cfg.user_feature_sizes)):
            fields.append(optional_ids(rows[:, 2 + h + k : 3 + h + k]))
        users: torch.Tensor = self.user_tower(fields)
        return users

    def items(self, ids: torch.Tensor) -> torch.Tensor:
        """The item vectors ``(n, dim)`` of item ids ``(n,)``."""
        column = ids.unsqueeze(-1)
        fields = [(column, torch.ones_like(column, dtype=torch.bool))]
        features = self.item_features[ids]
        for k in range(features.shape[1]):
            fields.append(optional_ids(features[:, k : k + 1]))
        items: torch.Tensor = self.item_tower(fields)
        return items

    @torch.no_grad()
    def item_vectors(self, device: torch.device, block: int = 4096) -> torch.Tensor:
        """Every item's vector ``(items, dim)``, FP32, in blocks of ``block`` items (the same
        blocks on every rank: a row-sharded table's lookups are collectives)."""
        n = self.cfg.num_items
        parts = []
        for start in range(0, n, block):
            ids = torch.arange(start, min(n, start + block), device=device)
            parts.append(self.items(ids).float())
        return torch.cat(parts)

    def logits(self, rows: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """The in-batch logits ``(batch, batch)``: query ``i`` (row ``i``'s user) against
        candidate ``j`` (row ``j``'s item), in FP32, over the temperature, less ``log q`` of
        the candidate; accidental hits and empty rows' candidates masked out."""
        items = rows[:, 1]
        scores = self.users(rows).float() @ self.items(items).float().T / self.cfg.temperature
        scores = scores - self.log_q[items].unsqueeze(0)
        eye = torch.eye(rows.shape[0], dtype=torch.bool, device=rows.device)
        hit = (items.unsqueeze(0) == items.unsqueeze(1)) & ~eye
        return scores.masked_fill(hit | ~real.unsqueeze(0), _MASKED)

    def forward(self, rows: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """The sum over the real rows of the corrected in-batch softmax cross-entropy (see
        the module's documentation); each row's positive is its own item."""
        logits = self.logits(rows, real)
        target = torch.arange(rows.shape[0], device=rows.device)
        losses = F.cross_entropy(logits, target, reduction="none")
        return (losses * real.to(losses.dtype)).sum()
