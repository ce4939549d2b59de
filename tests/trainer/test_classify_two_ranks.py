"""A BERT classifier on two ranks (gloo, DDP and FSDP2 with each layer sharded) against one
rank accumulating over the same global batch: the same loss and gradient norm every step, as a
step's loss is the mean over its documents however ranks split them
(trainer/classify/task.py). The ranks are two warm processes of the suite's two-rank worker
(tests/trainer/two_rank_worker.py) in a launch of their own."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import hf_tiny
import pytest
import test_classify_train
from two_ranks import WORKER

from tests import warm
from trainer import cli, metrics

SEQ, STEPS = 12, 4
PARALLEL = ("ddp", "fsdp")


def _run(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    """Four steps of 8 documents (4 a rank, or one rank accumulating 2 x 4), a step's record
    each, an eval at step 2 (each rank its documents, the counts gathered)."""
    return [
        *["run", "--task", "classify", "--model", str(model), "--data", str(data)],
        *["--device", "cpu", "--compile", "none", "--seq-len", str(SEQ), "--lr", "1e-3"],
        *["--max-steps", str(STEPS), "--micro-batch", "4", "--log-every", "1", "--no-progress"],
        *["--eval-every", "2", "--class-weights", "auto", "--metrics", str(out / "m.jsonl")],
        *extra,
    ]


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, trainer_env: dict[str, str]
) -> dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Each run's train and eval records, by ``one`` and the strategies of :data:`PARALLEL`."""
    root = tmp_path_factory.mktemp("classify-two-ranks")
    model = hf_tiny.bert_dir(root)
    data = test_classify_train.prepare(model, root, SEQ)
    jobs = {
        p: {
            "kind": "cli",
            "argv": _run(model, data, root / p, "--parallel", p),
            "out": str(root / p),
        }
        for p in PARALLEL
    }
    (root / "jobs.json").write_text(json.dumps(jobs))
    done = warm.run_ranks(
        [sys.executable, str(WORKER), str(root / "jobs.json")],
        env=trainer_env,
        world=2,
        cwd=root,
        timeout=600,
    )
    for p in PARALLEL:
        for rank, ended in enumerate(done):
            result = json.loads((root / p / f"rank-{rank}.json").read_text())
            assert result == {"exit": 0}, (p, rank, ended.stderr[-4000:])
    assert cli.main(_run(model, data, root / "one", "--grad-accum", "2")) == 0
    logs = {name: root / name / "m.jsonl" for name in ("one", *PARALLEL)}
    return {name: (metrics.read(log), metrics.read(log, "eval")) for name, log in logs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("parallel", PARALLEL)
def test_two_ranks_train_and_evaluate_as_one(
    runs: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]], parallel: str
) -> None:
    (one, one_evals), (two, two_evals) = runs["one"], runs[parallel]
    assert [r["step"] for r in two] == [r["step"] for r in one] == list(range(1, STEPS + 1))
    for ours, ref in zip(two, one, strict=True):
        assert ours["loss"] == pytest.approx(ref["loss"], rel=1e-5), ours["step"]
        assert ours["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5), ours["step"]
    assert [r["step"] for r in two_evals] == [r["step"] for r in one_evals] == [2, 4]
    for ours, ref in zip(two_evals, one_evals, strict=True):
        assert ours["eval_examples"] == ref["eval_examples"]
        assert ours["eval_loss"] == pytest.approx(ref["eval_loss"], rel=1e-5)
        assert ours["confusion"] == ref["confusion"]
