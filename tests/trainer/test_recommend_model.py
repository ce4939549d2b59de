"""The two-tower model's parts by hand: the masked mean against ``nn.EmbeddingBag``'s mean, the
in-batch softmax with its logQ correction and masks, and recall@K, NDCG@K and MRR."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_fp32_close

from trainer.recommend.metrics import RankTally, ranks
from trainer.recommend.model import TwoTower, TwoTowerConfig, masked_mean


def test_the_masked_mean_is_embedding_bags_mean() -> None:
    """What EmbeddingBag(mode="mean") computes (the op Neuron lacks) from a lookup and sums."""
    torch.manual_seed(0)
    table = torch.nn.Embedding(10, 4)
    ids = torch.tensor([[1, 2, 3], [4, 0, 0], [5, 6, 0]])
    mask = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])
    bag = torch.nn.EmbeddingBag.from_pretrained(table.weight, mode="mean")
    offsets = torch.tensor([0, 3, 4])
    expected = bag(torch.tensor([1, 2, 3, 4]), offsets)  # an empty bag is zeros
    assert_fp32_close(masked_mean(table, ids, mask), expected)


def _model(counts: list[int]) -> TwoTower:
    torch.manual_seed(0)
    cfg = TwoTowerConfig(num_users=3, num_items=len(counts), history=1, dim=8, temperature=0.1)
    features = torch.zeros((len(counts), 0), dtype=torch.int64)
    return TwoTower(cfg, features, torch.tensor(counts))


def test_the_loss_is_the_logq_corrected_in_batch_softmax_by_hand() -> None:
    """Yi et al. 2019, eq. 3: s_c(x_i, y_j) = s(x_i, y_j) - log(p_j); the loss is the
    softmax cross-entropy of each row's own item among the batch's items."""
    counts = [6, 3, 1, 0]  # item 3 never trains: its count is taken as 1
    model = _model(counts)
    rows = torch.tensor([[0, 0, 0], [1, 1, 1], [2, 2, 3]])  # [user, item, history + 1]
    real = torch.ones(3, dtype=torch.bool)
    users = model.users(rows).detach()
    items = model.items(rows[:, 1]).detach()
    p = torch.tensor([6, 3, 1, 1], dtype=torch.float64) / 11
    by_hand = 0.0
    for i in range(3):
        logits = [float(users[i] @ items[j]) / 0.1 - math.log(p[j]) for j in range(3)]
        by_hand += -logits[i] + math.log(sum(math.exp(v) for v in logits))
    assert_fp32_close(model(rows, real), torch.tensor(by_hand, dtype=torch.float32))


def test_the_correction_subtracts_the_log_of_each_candidates_share() -> None:
    """A rare candidate's logit gains more than a popular one's: -log 0.01 against -log 0.9."""
    model = _model([90, 9, 1])
    rows = torch.tensor([[0, 0, 0], [1, 1, 0], [2, 2, 0]])
    logits = model.logits(rows, torch.ones(3, dtype=torch.bool))
    raw = model.users(rows) @ model.items(rows[:, 1]).T / 0.1
    assert_fp32_close(raw - logits, torch.log(torch.tensor([0.9, 0.09, 0.01])).expand(3, 3))


def test_accidental_hits_and_empty_rows_are_no_negatives() -> None:
    model = _model([5, 5, 5])
    rows = torch.tensor([[0, 0, 0], [1, 0, 0], [2, 1, 0], [0, 2, 0]])
    real = torch.tensor([True, True, True, False])
    logits = model.logits(rows, real)
    masked = logits < -1e8
    # Rows 0 and 1 hold the same item: neither is the other's negative; row 3 is empty.
    assert masked.tolist() == [
        [False, True, False, True],
        [True, False, False, True],
        [False, False, False, True],
        [False, False, False, True],
    ]
    loss = model(rows, real)
    kept = torch.tensor([0, 1, 2])
    by_rows = F.cross_entropy(logits[kept], kept, reduction="sum")
    assert_fp32_close(loss, by_rows)


def test_ranks_recall_ndcg_and_mrr_by_hand() -> None:
    scores = torch.tensor(
        [
            [0.9, 0.1, 0.5, 0.3],  # target 0: rank 1
            [0.9, 0.1, 0.5, 0.3],  # target 2: rank 2
            [0.9, 0.1, 0.5, 0.3],  # target 1: rank 4
            [0.5, 0.5, 0.5, 0.1],  # target 1: items 0 and 2 tie with it, ahead: rank 3
        ]
    )
    found = ranks(scores, torch.tensor([0, 2, 1, 1]))
    assert found.tolist() == [1, 2, 4, 3]
    tally = RankTally(k=2)
    tally.add(found[:2])
    other = RankTally(k=2)
    other.add(found[2:])
    tally.merge(other)
    result = tally.result()
    assert result["examples"] == 4
    assert result["recall@2"] == pytest.approx(2 / 4)
    assert result["ndcg@2"] == pytest.approx((1 + 1 / math.log2(3) + 0 + 0) / 4)
    assert result["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 4 + 1 / 3) / 4)


def test_a_model_that_scores_every_item_alike_ranks_every_target_last() -> None:
    """Ties and NaN go against the target: a collapsed or diverged model scores recall 0, not
    the perfect recall that ties to the target would give it."""
    same = torch.full((3, 5), 0.25)
    nan = torch.full((3, 5), math.nan)
    for scores in (same, nan):
        assert ranks(scores, torch.tensor([0, 2, 4])).tolist() == [5, 5, 5]
    some_nan = torch.tensor([[0.1, math.nan, 0.3, 0.2]])  # a NaN item is ahead of the target
    assert ranks(some_nan, torch.tensor([2])).tolist() == [2]
    tally = RankTally(k=4)
    tally.add(ranks(same, torch.tensor([0, 2, 4])))
    assert tally.result()["recall@4"] == 0.0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_items": 0}, r"num_items must be >= 1, got 0"),
        ({"dim": 0}, r"dim must be >= 1, got 0"),
        ({"history": -1}, r"history must be >= 0, got -1"),
        ({"temperature": 0.0}, r"temperature must be a number above 0, got 0.0"),
        ({"user_feature_sizes": (0,)}, r"every feature must have at least one value"),
    ],
)
def test_the_config_is_checked(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TwoTowerConfig(**{"num_users": 2, "num_items": 2, **fields})  # type: ignore[arg-type]
