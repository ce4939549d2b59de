"""``trn-train run --task classify`` end to end on CPU with a tiny Llama: a synthetic task whose
label the text decides reaches held-out accuracy 0.95, the metrics file holds the eval figures
and examples/s, the export loads in transformers (and a LoRA run's in PEFT) with our logits,
and a resumed run is exact."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import hf_tiny
import pytest
import torch
from peft import PeftModel
from test_classify_data import WORDS, documents, write_jsonl
from transformers import AutoModelForSequenceClassification

from trainer import cli, metrics
from trainer.classify.load import load_classifier

SEQ = 10


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny Llama and 300 labelled documents of three classes (skewed 3:2:1), 10% held out."""
    root = tmp_path_factory.mktemp("classify")
    model = hf_tiny.model_dir(root, "llama")
    return model, prepare(model, root, SEQ)


def prepare(model: Path, root: Path, seq_len: int) -> Path:
    """300 labelled documents of three classes (skewed 3:2:1) prepared in ``root`` with
    ``model``'s tokenizer at ``seq_len``, 10% held out."""
    source = write_jsonl(root / "docs.jsonl", documents(300, seed=1, skew=(3, 2, 1)))
    out = root / "data"
    args = ["prepare-data", "--format", "classify", "--tokenizer", str(model), "--input"]
    split = ["--seq-len", str(seq_len), "--eval-fraction", "0.1"]
    assert cli.main([*args, str(source), "--out", str(out), *split]) == 0
    return out


def _run(model: Path, data: Path, ck: Path, *extra: str) -> list[str]:
    return [
        "run", "--task", "classify", "--model", str(model), "--data", str(data), "--device", "cpu",
        "--compile", "none", "--seq-len", str(SEQ), "--micro-batch", "16", "--lr", "3e-3",
        "--checkpoint-dir", str(ck), "--no-progress", "--log-every", "5", *extra,
    ]  # fmt: skip


def test_a_synthetic_task_reaches_accuracy_and_exports(
    task: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, data = task
    log = tmp_path / "m.jsonl"
    args = _run(model, data, tmp_path / "ck", "--epochs", "4", "--eval-every", "17")
    assert cli.main([*args, "--class-weights", "auto", "--metrics", str(log)]) == 0
    train = metrics.read(log)
    assert all(r["examples_per_s"] > 0 for r in train)
    evals = metrics.read(log, kind="eval")
    assert evals and set(evals[-1]["per_class"]) == set(WORDS)
    assert len(evals[-1]["confusion"]) == 3
    header = metrics.headers(log)[0]
    assert header["data"]["classes"] == sorted(WORDS)

    out = tmp_path / "export"
    assert cli.main(["export", "--checkpoint-dir", str(tmp_path / "ck"), "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(out), "--data", str(data), "--seq-len", str(SEQ)]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["accuracy"] >= 0.95, line
    assert line["examples"] == evals[-1]["eval_examples"]
    assert line["accuracy"] == pytest.approx(evals[-1]["eval_accuracy"])
    checkpoint = ["eval", "--checkpoint-dir", str(tmp_path / "ck"), "--data", str(data)]
    assert cli.main(checkpoint) == 0
    assert json.loads(capsys.readouterr().out) == pytest.approx(line)

    theirs = AutoModelForSequenceClassification.from_pretrained(out).eval()
    ours = load_classifier(out, seq_len=SEQ).eval()
    rows = torch.randint(2, 256, (4, SEQ), generator=torch.Generator().manual_seed(0))
    rows[:2, 6:] = 1  # padded with the tokenizer's EOS: it has no pad token
    with torch.no_grad():
        expected = ours.scores(rows)
        torch.testing.assert_close(
            theirs(input_ids=rows).logits,
            expected,
            rtol=1e-4,
            atol=1e-4 * float(expected.abs().max()),
        )


def test_a_lora_classifier_exports_a_peft_adapter(
    task: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, data = task
    assert (
        cli.main([*_run(model, data, tmp_path / "ck", "--max-steps", "6", "--lora-rank", "4")]) == 0
    )
    adapter, merged = tmp_path / "adapter", tmp_path / "merged"
    export = ["export", "--checkpoint-dir", str(tmp_path / "ck")]
    assert cli.main([*export, "--out", str(adapter)]) == 0
    assert cli.main([*export, "--out", str(merged), "--merge-lora"]) == 0
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS" and config["modules_to_save"] == ["score"]

    whole = load_classifier(merged, seq_len=SEQ).eval()
    peft = peft_classifier(model, adapter, pad_token_id=1)
    rows = torch.randint(2, 256, (3, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = whole.scores(rows)
        got = peft(input_ids=rows).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))
    assert not torch.allclose(expected[:, 0], expected[:, 1])  # a trained head, not zeros
    capsys.readouterr()
    figures = []
    for source in (["--model", str(merged)], ["--checkpoint-dir", str(tmp_path / "ck")]):
        assert cli.main(["eval", *source, "--data", str(data), "--seq-len", str(SEQ)]) == 0
        figures.append(json.loads(capsys.readouterr().out))
    assert figures[1] == pytest.approx(figures[0], rel=1e-5)


def peft_classifier(base: Path, adapter: Path, **config: object) -> PeftModel:
    """PEFT's classifier of ``adapter`` on transformers' ``*ForSequenceClassification`` of
    ``base`` with the synthetic task's classes (``config`` on top), in eval mode."""
    names = sorted(WORDS)
    model = AutoModelForSequenceClassification.from_pretrained(
        base,
        id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)},
        **config,
    )
    return PeftModel.from_pretrained(model, adapter).eval()


def test_a_resumed_classification_run_is_exact(task: tuple[Path, Path], tmp_path: Path) -> None:
    model, data = task
    command = functools.partial(
        lambda ck: _run(
            model, data, ck, "--max-steps", "4", "--checkpoint-every", "2", "--grad-accum", "2"
        )
    )
    hf_tiny.assert_resume_is_exact(command, tmp_path, last=4, killed_at=2)


def test_tasks_and_data_must_match(
    task: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, data = task
    causal = [
        a
        for a in _run(model, data, tmp_path / "ck", "--max-steps", "1")
        if a not in ("--task", "classify")
    ]
    assert cli.main(causal) == 2
    assert "train it with --task classify" in capsys.readouterr().err
    assert cli.main([*causal, "--class-weights", "auto"]) == 2
    assert "class_weights 'auto' needs task classify" in capsys.readouterr().err


def test_the_best_checkpoint_by_a_metric_is_kept_and_exported(
    task: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, data = task
    log, ck = tmp_path / "m.jsonl", tmp_path / "ck"
    args = _run(
        model, data, ck, "--max-steps", "12", "--eval-every", "3", "--keep-checkpoints", "1"
    )
    assert cli.main([*args, "--best-metric", "eval_accuracy", "--metrics", str(log)]) == 0
    evals = metrics.read(log, kind="eval")
    scores = [r["eval_accuracy"] for r in evals]
    improved = [r["step"] for i, r in enumerate(evals) if scores[i] > max(scores[:i], default=-1)]
    assert [r["step"] for r in evals if r.get("best")] == improved
    best = next(r for r in evals if r["step"] == improved[-1])
    # Pruning to one keeps the newest and the best (the same one when the last eval is best).
    kept = sorted(p.name for p in ck.iterdir() if p.name.startswith("step_"))
    assert kept == sorted({f"step_{best['step']:08d}", "step_00000012"})
    out = tmp_path / "best"
    assert cli.main(["export", "--checkpoint-dir", str(ck), "--out", str(out), "--best"]) == 0
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(out), "--data", str(data), "--seq-len", str(SEQ)]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["loss"] == pytest.approx(best["eval_loss"], rel=1e-5)
    assert line["accuracy"] == best["eval_accuracy"]


def test_best_metric_needs_eval_and_checkpoints(
    task: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, data = task
    assert (
        cli.main(
            [
                *_run(model, data, tmp_path / "ck", "--max-steps", "2"),
                "--best-metric",
                "eval_accuracy",
            ]
        )
        == 2
    )
    assert "needs eval_every and checkpoint_dir" in capsys.readouterr().err


def test_a_best_metric_no_eval_writes_stops_the_run_at_its_first_eval(
    task: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, data = task
    log = tmp_path / "m.jsonl"
    args = _run(model, data, tmp_path / "ck", "--max-steps", "10", "--eval-every", "5")
    assert cli.main([*args, "--best-metric", "eval_acuracy", "--metrics", str(log)]) == 2
    err = capsys.readouterr().err
    assert "best_metric 'eval_acuracy' is not a figure" in err and "eval_accuracy" in err
    assert max(r["step"] for r in metrics.read(log)) == 5  # not trained on to step 10


def test_eval_accuracy_is_no_best_metric_of_a_multi_label_run() -> None:
    import numpy as np

    from trainer import loop
    from trainer.classify.metrics import Tally

    tally = Tally(("x", "y"), multi_label=True)
    tally.add(np.array([[1.0, -1.0]]), np.array([[1.0, 0.0]]), np.array([True]))
    figures = {f"eval_{k}": v for k, v in tally.result().items()}
    with pytest.raises(ValueError, match="eval_exact_match") as raised:
        loop.Best("eval_accuracy").improves(figures)
    assert "'eval_accuracy'" in str(raised.value)
    assert loop.Best("eval_exact_match").improves(figures)


def test_a_resumed_run_keeps_its_best_checkpoint_and_value(tmp_path: Path) -> None:
    from trainer import loop
    from trainer.checkpoint import Checkpointer, open_store
    from trainer.config import TrainConfig

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = Checkpointer(open_store(str(tmp_path)), keep=1)
    writer.save(3, model, optimizer, run={}, best={"metric": "eval_loss", "value": 0.5, "step": 3})
    writer.pinned.add("step_00000003")
    writer.save(6, model, optimizer, run={})
    writer.save(9, model, optimizer, run={})
    # Pruning to one keeps the newest and the pinned best, older than it.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_")) == [
        "step_00000003",
        "step_00000009",
    ]
    reader = Checkpointer(open_store(str(tmp_path)), keep=1)
    cfg = TrainConfig(best_metric="eval_loss", eval_every=3, checkpoint_dir=str(tmp_path))
    best = loop._best_so_far(cfg, reader)
    assert best is not None and best.value == 0.5 and reader.pinned == {"step_00000003"}
    assert not best.improves({"eval_loss": 0.6}) and best.improves({"eval_loss": 0.4})
