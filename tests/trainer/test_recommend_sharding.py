"""Row-sharded embedding tables (trainer.recommend.sharding) at two ranks on gloo, jobs of the
suite's one two-rank launch (tests/trainer/two_ranks.py): the same loss, vectors and gradients
as the same weights unsharded, each rank holding its contiguous rows; and `trn-train run --task
recommend --shard-embeddings on` training as the unsplit DDP run does, its checkpoint exported
whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import two_ranks as two_ranks_launch
from tolerance import assert_fp32_close
from two_ranks import TwoRanks

from trainer import cli, metrics
from trainer.checkpoint import Checkpointer, LocalStore
from trainer.config import TrainConfig
from trainer.parallel import Ranks
from trainer.recommend.sharding import row_range, whole_tables
from trainer.recommend.task import shards_tables


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
        full = saved["full"]
        # Eager, and compiled as one graph (aot_eager: the collectives traced by Dynamo).
        for label in ("split", "compiled"):
            split = saved[label]
            for key in ("loss", "users", "items"):
                assert_fp32_close(split[key], full[key], msg=f"rank {rank} {label} {key}")
            for name, grad in split["grads"].items():
                expected = full["grads"][name]
                table = name.removesuffix(".weight")
                if table in saved["ranges"]:
                    start, stop = saved["ranges"][table]
                    expected = expected[start:stop]
                assert_fp32_close(grad, expected, msg=f"rank {rank} {label} {name}")
            assert set(split["grads"]) == set(full["grads"])


@pytest.mark.slow
@pytest.mark.xdist_group(two_ranks_launch.GROUP)
def test_a_split_run_trains_as_the_unsplit_one(
    two_ranks: TwoRanks, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both runs draw the same weights (a split table keeps its rows of the whole table's
    draw) and clip by the norm over every rank's rows, so their losses, gradient norms and
    eval figures agree step by step; the split checkpoint (each rank's rows under their own
    names) exports whole and evaluates as the unsplit one."""
    for job in ("recommend-ddp", "recommend-split"):
        assert [r["exit"] for r in two_ranks.results(job)] == [0, 0], job
    ddp, split = (two_ranks.root / job for job in ("recommend-ddp", "recommend-split"))
    steps = metrics.read(ddp / "m.jsonl")
    assert len(steps) == 6
    for a, b in zip(metrics.read(split / "m.jsonl"), steps, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), a["step"]
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5), a["step"]
    for a, b in zip(
        metrics.read(split / "m.jsonl", kind="eval"),
        metrics.read(ddp / "m.jsonl", kind="eval"),
        strict=True,
    ):
        assert a["eval_recall@10"] == pytest.approx(b["eval_recall@10"]), a["step"]
        assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-5), a["step"]
    figures = []
    for run in (ddp, split):
        capsys.readouterr()
        assert (
            cli.main(
                ["export", "--checkpoint-dir", str(run / "ck"), "--out", str(tmp_path / run.name)]
            )
            == 0
        )
        capsys.readouterr()
        model = str(tmp_path / run.name)
        assert cli.main(["eval", "--model", model, "--data", str(two_ranks.interactions)]) == 0
        figures.append(json.loads(capsys.readouterr().out))
    assert figures[1] == pytest.approx(figures[0], rel=1e-5)


@pytest.mark.slow
@pytest.mark.xdist_group(two_ranks_launch.GROUP)
def test_a_resumed_split_run_is_exact(two_ranks: TwoRanks) -> None:
    """Killed after step 3's checkpoint and resumed on two ranks, each rank reading its own
    rows back: step 6's model and optimizer states are bit-identical to the straight run's."""
    job = two_ranks.root / "recommend-split-resumed"
    assert [r["exit"] for r in two_ranks.results("recommend-split-resumed")] == [[0, 0], [0, 0]]
    # The second run trained steps 4 to 6 only: it resumed.
    lines = (job / "m.jsonl").read_text().splitlines()
    steps = [r["step"] for r in map(json.loads, lines) if "loss" in r and "kind" not in r]
    assert steps == [1, 2, 3, 4, 5, 6, 4, 5, 6]
    assert len(metrics.headers(job / "m.jsonl")) == 2
    straight = Checkpointer(LocalStore(job / "straight")).load("step_00000006")
    resumed = Checkpointer(LocalStore(job / "ck")).load("step_00000006")
    assert any(".rows_" in key for key in resumed["model"])
    for part in ("model", "optimizer"):
        a = torch.utils._pytree.tree_leaves(straight[part])
        b = torch.utils._pytree.tree_leaves(resumed[part])
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y


def test_split_parts_join_in_row_order() -> None:
    parts = {"t.rows_2_3": torch.ones(1, 2), "t.rows_0_2": torch.zeros(2, 2), "b": torch.ones(1)}
    joined = whole_tables(parts)
    assert set(joined) == {"t.weight", "b"}
    assert joined["t.weight"].tolist() == [[0, 0], [0, 0], [1, 1]]
    with pytest.raises(ValueError, match=r"t: the parts of rows \[0, 2, 4\] leave a gap"):
        whole_tables({"t.rows_0_2": torch.zeros(2, 2), "t.rows_3_4": torch.zeros(1, 2)})


@pytest.mark.parametrize(
    ("setting", "world", "instance", "params", "split"),
    [
        ("auto", 2, "", 10**12, False),  # no instance type: no device memory to outgrow
        ("auto", 1, "trn2.48xlarge", 10**12, False),  # one rank: nothing to split across
        ("auto", 2, "trn2.48xlarge", 10**6, False),
        ("auto", 2, "trn2.48xlarge", 10**10, True),  # 160 GB of training state > 24 GiB
        ("auto", 2, "p5.48xlarge", 10**12, False),  # not a Neuron instance type
        ("on", 2, "", 1, True),
        ("off", 2, "trn2.48xlarge", 10**12, False),
    ],
)
def test_tables_are_split_when_they_outgrow_a_core(
    setting: str, world: int, instance: str, params: int, split: bool
) -> None:
    cfg = TrainConfig(task="recommend", data="d", shard_embeddings=setting, instance_type=instance)
    assert shards_tables(cfg, Ranks(world_size=world), params) is split


def test_shard_embeddings_on_needs_task_recommend() -> None:
    with pytest.raises(ValueError, match=r"shard_embeddings 'on' needs task recommend"):
        TrainConfig(data="d", shard_embeddings="on").validate()
    with pytest.raises(ValueError, match=r"shard_embeddings 'most' is not one of auto, on, off"):
        TrainConfig(task="recommend", data="d", shard_embeddings="most").validate()
