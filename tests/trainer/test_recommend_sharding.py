"""Row-sharded embedding tables (trainer.recommend.sharding) at two ranks on gloo, a job of the
suite's one two-rank launch (tests/trainer/two_ranks.py): the same loss, vectors and gradients
as the same weights unsharded, each rank holding its contiguous rows."""

from __future__ import annotations

import pytest
import torch
import two_ranks as two_ranks_launch
from tolerance import assert_fp32_close
from two_ranks import TwoRanks

from trainer.recommend.sharding import row_range


def test_each_rank_holds_a_contiguous_range() -> None:
    assert [row_range(7, r, 2) for r in range(2)] == [(0, 4), (4, 7)]
    assert [row_range(2, r, 3) for r in range(3)] == [(0, 1), (1, 2), (2, 2)]


@pytest.mark.slow
@pytest.mark.xdist_group(two_ranks_launch.GROUP)
def test_sharded_tables_give_the_unsharded_loss_and_gradients(two_ranks: TwoRanks) -> None:
    results = two_ranks.results("recommend-shards")
    assert [r["ranges"]["user_tower.tables.0"] for r in results] == [[0, 4], [4, 7]]
    for rank in (0, 1):
        saved = torch.load(two_ranks.root / "recommend-shards" / f"rank-{rank}.pt")
        full, split = saved["full"], saved["split"]
        for key in ("loss", "users", "items"):
            assert_fp32_close(split[key], full[key], msg=f"rank {rank} {key}")
        for name, grad in split["grads"].items():
            expected = full["grads"][name]
            table = name.removesuffix(".weight")
            if table in saved["ranges"]:
                start, stop = saved["ranges"][table]
                expected = expected[start:stop]
            assert_fp32_close(grad, expected, msg=f"rank {rank} {name}")
        assert set(split["grads"]) == set(full["grads"])
