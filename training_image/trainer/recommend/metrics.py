"""Ranking figures of held-out interactions scored against the full item set: recall@K,
NDCG@K and MRR.

Each held-out interaction has one relevant item, its own. Its rank is the number of items that
do not score strictly below it, itself included (nothing is excluded: items the user met in
training count too). A tie goes against the held-out item, and a NaN score ranks it last: a model
that scores every item alike, or whose scores are NaN, ranks every target last rather than first
(with ties to the target it would score a perfect recall). With one relevant item, recall@K is
whether the rank is at most K, NDCG@K is ``1 / log2(1 + rank)`` within K (the ideal DCG is 1) and
0 beyond, and MRR is the mean of ``1 / rank`` without a cut-off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DEFAULT_K = 10


def ranks(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The rank (1 = first) of each row's target among all of the row's items, ties and NaN
    against the target (see the module's documentation): ``scores`` ``(n, items)``, ``targets``
    ``(n,)`` item ids; int64 ``(n,)``."""
    own = scores.gather(1, targets.unsqueeze(1))
    # Counting the items strictly below (a comparison with NaN is False) puts tied and NaN
    # items ahead of the target, and a NaN target behind every item.
    return scores.shape[1] - (scores < own).sum(dim=1)


@dataclass
class RankTally:
    """Sums over ranks at cut-off ``k``: hits within ``k``, the DCG within ``k``, the
    reciprocal ranks, the count of ranks and the full-softmax loss (mean cross-entropy of the
    target over every item), to be merged across ranks of the process group."""

    k: int = DEFAULT_K
    hits: int = 0
    dcg: float = 0.0
    reciprocal: float = 0.0
    loss: float = 0.0
    count: int = 0

    def add(self, rank: torch.Tensor, losses: torch.Tensor | None = None) -> None:
        """Adds ranks ``(n,)`` and, when given, each one's cross-entropy ``(n,)``."""
        rank = rank.to(torch.float64)
        within = rank <= self.k
        self.hits += int(within.sum())
        self.dcg += float((within / torch.log2(rank + 1)).sum())
        self.reciprocal += float((1.0 / rank).sum())
        self.count += int(rank.numel())
        if losses is not None:
            self.loss += float(losses.to(torch.float64).sum())

    def merge(self, other: RankTally) -> None:
        self.hits += other.hits
        self.dcg += other.dcg
        self.reciprocal += other.reciprocal
        self.loss += other.loss
        self.count += other.count

    def result(self) -> dict[str, float | int]:
        """``loss``, ``recall@K``, ``ndcg@K``, ``mrr`` and ``examples`` (NaN figures of no
        ranks)."""
        n = self.count or math.nan
        return {
            "loss": self.loss / n,
            f"recall@{self.k}": self.hits / n,
            f"ndcg@{self.k}": self.dcg / n,
            "mrr": self.reciprocal / n,
            "examples": self.count,
        }
