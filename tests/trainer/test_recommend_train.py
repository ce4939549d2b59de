"""``trn-train run --task recommend`` end to end on CPU: the two towers learn a synthetic
preference structure (held-out recall@10 at least three times a random ranking's), the metrics
file holds the eval figures and examples/s, and a resumed run is exact."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import hf_tiny
import pytest
import torch
from test_recommend_data import interactions, write_jsonl

from trainer import cli, metrics
from trainer.checkpoint import Checkpointer, LocalStore
from trainer.config import TrainConfig
from trainer.data import open_dataset
from trainer.recommend import evaluate as rec_eval
from trainer.recommend import export as rec_export
from trainer.recommend.data import IdMaps, Interactions, manifest_entry, open_interactions

ITEMS = 200


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,600 interactions of 120 users and 200 items, the latest 10% held out."""
    root = tmp_path_factory.mktemp("recommend")
    source = write_jsonl(root / "i.jsonl", interactions(items=ITEMS))
    args = ["prepare-data", "--format", "interactions", "--input", str(source)]
    features = ["--user-features", "region", "--item-features", "category", "--history", "4"]
    assert cli.main([*args, *features, "--out", str(root / "data")]) == 0
    return root / "data"


def _open(root: Path) -> Interactions:
    return open_interactions(open_dataset(root))


def _run(data: Path, ck: Path, *extra: str) -> list[str]:
    return [
        "run", "--task", "recommend", "--data", str(data), "--device", "cpu", "--compile", "none",
        "--embedding-dim", "16", "--micro-batch", "64", "--checkpoint-dir", str(ck),
        "--no-progress", "--log-every", "10", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def trained(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Four epochs (204 steps) of 64 rows, an eval every 51 steps: the checkpoints and the
    metrics file."""
    root = tmp_path_factory.mktemp("trained")
    args = _run(prepared, root / "ck", "--epochs", "4", "--eval-every", "51")
    assert cli.main([*args, "--metrics", str(root / "m.jsonl")]) == 0
    return root / "ck", root / "m.jsonl"


def test_the_towers_learn_a_preference_structure(
    prepared: Path, trained: tuple[Path, Path]
) -> None:
    log = trained[1]
    train = metrics.read(log)
    assert all(r["examples_per_s"] > 0 for r in train)
    assert train[-1]["loss"] < train[0]["loss"]
    header = metrics.headers(log)[0]
    assert header["data"]["items"] == ITEMS == manifest_entry(prepared)["num_items"]
    evals = metrics.read(log, kind="eval")
    last = evals[-1]
    assert last["eval_examples"] == 360
    random_recall = 10 / ITEMS
    assert last["eval_recall@10"] >= 3 * random_recall, last
    assert 0 < last["eval_ndcg@10"] <= last["eval_recall@10"]
    assert last["eval_mrr"] > 0


def _eval_line(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert cli.main(["eval", *args]) == 0
    line: dict[str, Any] = json.loads(capsys.readouterr().out)
    return line


def test_eval_export_and_predict_agree_with_training(
    prepared: Path,
    trained: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`eval` of the checkpoint gives the run's last eval record; the export, read from its
    files alone, ranks as the checkpoint does: its figures, and `predict`'s top 10 of every
    held-out user, are the trained model's."""
    ck, log = trained
    last = metrics.read(log, kind="eval")[-1]
    line = _eval_line(capsys, "--checkpoint-dir", str(ck), "--data", str(prepared))
    assert line == pytest.approx(
        {k.removeprefix("eval_"): v for k, v in last.items() if k.startswith("eval_")}
    )

    out = tmp_path / "export"
    assert cli.main(["export", "--checkpoint-dir", str(ck), "--out", str(out)]) == 0
    written = json.loads(capsys.readouterr().out)["files"]
    assert sorted(written) == sorted(p.name for p in out.iterdir())
    exported_line = _eval_line(capsys, "--model", str(out), "--data", str(prepared))
    assert exported_line == pytest.approx(line, rel=1e-5)

    trained_model, _ = rec_export.from_checkpoint(Checkpointer(LocalStore(ck)), "step_00000204")
    held = _open(prepared).eval
    assert held is not None
    expected = rec_eval.top_k(
        trained_model, held, trained_model.item_vectors(torch.device("cpu")), 10
    )
    queries = tmp_path / "users.jsonl"
    maps = rec_export.load(out).maps
    write_jsonl(queries, [_query(row, maps) for row in held])
    assert (
        cli.main(
            [
                "predict",
                "--model",
                str(out),
                "--input",
                str(queries),
                "--out",
                str(tmp_path / "top.jsonl"),
            ]
        )
        == 0
    )
    predicted = [json.loads(x) for x in (tmp_path / "top.jsonl").read_text().splitlines()]
    ids = {name: i for i, name in enumerate(maps.items)}
    assert [[ids[i] for i in p["items"]] for p in predicted] == expected.tolist()
    assert all(p["scores"] == sorted(p["scores"], reverse=True) for p in predicted)
    unknown = write_jsonl(tmp_path / "bad.jsonl", [{"user_id": "nobody"}])
    capsys.readouterr()
    bad = ["predict", "--model", str(out), "--input", str(unknown), "--out", str(tmp_path / "x")]
    assert cli.main(bad) == cli.USAGE
    assert "bad.jsonl:1: field 'user_id' is 'nobody'; allowed: a user of the model's" in (
        capsys.readouterr().err
    )


def _query(row: Any, maps: IdMaps) -> dict[str, Any]:
    """A held-out row as a predict line: the user, its history (latest first), its region."""
    history = [maps.items[i - 1] for i in row[2:6] if i]
    region = maps.features["region"][row[6] - 1] if row[6] else None
    return {"user_id": maps.users[row[0]], "history": history, "region": region}


def test_a_resumed_recommendation_run_is_exact(prepared: Path, tmp_path: Path) -> None:
    def command(ck: Path) -> list[str]:
        return _run(prepared, ck, "--max-steps", "4", "--checkpoint-every", "1")

    hf_tiny.assert_resume_is_exact(command, tmp_path, last=4, killed_at=2)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--parallel", "fsdp"], r"parallel 'fsdp' is not available with task recommend"),
        (["--embedding-dim", "0"], r"embedding_dim must be >= 1, got 0"),
        (["--micro-batch", "1"], r"micro_batch 1 leaves a row no in-batch negatives: task "),
        (["--micro-batch", "-2"], r"micro_batch must be >= 0 \(0: the default\), got -2"),
        (["--temperature", "-1"], r"temperature must be a number above 0, got -1.0"),
    ],
)
def test_recommend_flags_are_checked(
    prepared: Path,
    tmp_path: Path,
    extra: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main([*_run(prepared, tmp_path / "ck"), *extra]) == cli.USAGE
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize(("field", "value"), [("embedding_dim", 32), ("temperature", 0.1)])
def test_the_two_tower_fields_need_task_recommend(field: str, value: float) -> None:
    """Another task has no two-tower model: a width or temperature set for it would go unused."""
    message = rf"{field} {value} needs task recommend \(task 'causal-lm' has no two-tower model\)"
    with pytest.raises(ValueError, match=message):
        TrainConfig(data="d", **{field: value}).validate()  # type: ignore[arg-type]
    TrainConfig(data="d", task="recommend", **{field: value}).validate()  # type: ignore[arg-type]


def test_tasks_and_data_must_match(
    prepared: Path, corpus_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = ["run", "--data", str(prepared), "--device", "cpu", "--compile", "none"]
    assert cli.main([*plain, "--max-steps", "1", "--no-progress"]) == cli.USAGE
    assert "train it with --task recommend" in capsys.readouterr().err
    assert cli.main(_run(corpus_dir, tmp_path / "ck")) == cli.USAGE
    assert "prepare-data --format interactions" in capsys.readouterr().err
