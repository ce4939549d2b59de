"""``trn-train run --task classify`` on a BERT encoder, end to end on CPU with a tiny
BertForSequenceClassification and a WordPiece tokenizer as BERT's ([CLS] ... [SEP], [PAD], no
EOS): prepared, trained to the synthetic task's accuracy bar, exported to a directory whose
logits transformers matches, evaluated, predicted, and resumed exactly."""

from __future__ import annotations

import json
from pathlib import Path

import hf_tiny
import pytest
import test_classify_train
import torch
from test_classify_data import WORDS, write_jsonl
from transformers import AutoModelForSequenceClassification

from trainer import cli, metrics
from trainer.classify.encoder import BertClassifier
from trainer.classify.load import load_classifier

SEQ = 12  # [CLS], up to 9 words, [SEP], padding


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny BERT and 300 labelled documents of three classes (skewed 3:2:1), 10% held out."""
    root = tmp_path_factory.mktemp("bert")
    model = hf_tiny.bert_dir(root)
    return model, test_classify_train.prepare(model, root, SEQ)


def _run(model: Path, data: Path, ck: Path, *extra: str) -> list[str]:
    """The decoder tests' command line at this sequence length and learning rate (a repeated
    flag's last value wins)."""
    ours = ("--seq-len", str(SEQ), "--lr", "1e-3")
    return test_classify_train._run(model, data, ck, *ours, *extra)


def test_prepared_rows_are_cls_text_sep_and_padding(task: tuple[Path, Path]) -> None:
    from trainer.classify.data import ClassifySampler, open_labels
    from trainer.data import open_dataset

    _, data = task
    labels = open_labels(data)
    assert labels.pad_token_id == 0  # BERT's [PAD]: its tokenizer has no EOS
    sampler = ClassifySampler(
        open_dataset(data), labels.train, pad_token_id=0, seq_len=SEQ, micro_batch=4, seed=0
    )
    rows, _, real = sampler.batch(0, 0)
    assert rows.shape == (4, SEQ) and bool(real.all())
    for row in rows.tolist():
        length = row.index(0) if 0 in row else SEQ
        assert row[0] == 2 and row[length - 1] == 3  # [CLS] ... [SEP]
        assert all(t == 0 for t in row[length:])


def test_bert_trains_to_the_accuracy_bar_and_exports_for_transformers(
    task: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, data = task
    log, ck = tmp_path / "m.jsonl", tmp_path / "ck"
    args = _run(model, data, ck, "--epochs", "4", "--eval-every", "17", "--metrics", str(log))
    assert cli.main([*args, "--class-weights", "auto", "--best-metric", "eval_macro_f1"]) == 0
    assert all(r["examples_per_s"] > 0 for r in metrics.read(log))
    evals = metrics.read(log, kind="eval")
    assert evals and set(evals[-1]["per_class"]) == set(WORDS)
    assert metrics.headers(log)[0]["data"]["seq_len"] == SEQ

    out = tmp_path / "export"
    assert cli.main(["export", "--checkpoint-dir", str(ck), "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {str(i): n for i, n in enumerate(sorted(WORDS))}
    assert (out / "tokenizer.json").is_file()
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(out), "--data", str(data), "--seq-len", str(SEQ)]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["accuracy"] >= 0.95, line
    assert line["accuracy"] == pytest.approx(evals[-1]["eval_accuracy"])
    assert cli.main(["eval", "--checkpoint-dir", str(ck), "--data", str(data)]) == 0
    assert json.loads(capsys.readouterr().out) == pytest.approx(line, rel=1e-5)

    theirs = AutoModelForSequenceClassification.from_pretrained(out).eval()
    ours = load_classifier(out, seq_len=SEQ).eval()
    assert isinstance(ours, BertClassifier)
    rows = torch.randint(5, 256, (4, SEQ), generator=torch.Generator().manual_seed(0))
    rows[:, 0] = 2
    rows[:2, 6:] = 0  # padded rows: transformers masks what the attention mask says
    with torch.no_grad():
        expected = ours.scores(rows)
        got = theirs(input_ids=rows, attention_mask=(rows != 0).long()).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


def test_bert_predicts_each_line(
    task: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, data = task
    ck = tmp_path / "ck"
    assert cli.main(_run(model, data, ck, "--max-steps", "2")) == 0
    out = tmp_path / "export"
    assert cli.main(["export", "--checkpoint-dir", str(ck), "--out", str(out)]) == 0
    lines = write_jsonl(tmp_path / "new.jsonl", [{"text": "w21 w22", "id": 7}, {"text": "w41"}])
    scored = tmp_path / "scored.jsonl"
    args = ["predict", "--model", str(out), "--input", str(lines), "--out", str(scored)]
    assert cli.main(args) == 0
    records = [json.loads(r) for r in scored.read_text().splitlines()]
    assert [r.get("id") for r in records] == [7, None]
    for record in records:
        assert record["label"] in WORDS
        assert sum(record["scores"].values()) == pytest.approx(1.0)


def test_a_resumed_bert_run_is_exact(task: tuple[Path, Path], tmp_path: Path) -> None:
    model, data = task
    hf_tiny.assert_resume_is_exact(
        lambda ck: _run(model, data, ck, "--max-steps", "4", "--checkpoint-every", "2"),
        tmp_path,
        last=4,
        killed_at=2,
    )


def test_a_lora_bert_exports_a_peft_adapter_and_a_merged_classifier(
    task: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, data = task
    ck = tmp_path / "ck"
    assert cli.main([*_run(model, data, ck, "--max-steps", "6", "--lora-rank", "4")]) == 0
    adapter, merged = tmp_path / "adapter", tmp_path / "merged"
    export = ["export", "--checkpoint-dir", str(ck)]
    assert cli.main([*export, "--out", str(adapter)]) == 0
    assert cli.main([*export, "--out", str(merged), "--merge-lora"]) == 0
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS"
    assert config["modules_to_save"] == ["bert.pooler.dense", "classifier"]
    # Every linear layer of each BERT layer but a gate projection BERT does not have.
    assert len(config["target_modules"]) == 6 * hf_tiny.BERT_SHAPE["num_hidden_layers"]

    whole = load_classifier(merged, seq_len=SEQ).eval()
    # The base's own head has two classes: transformers draws a new one, the adapter's replaces it.
    peft = test_classify_train.peft_classifier(model, adapter, ignore_mismatched_sizes=True)
    rows = torch.randint(5, 256, (3, SEQ), generator=torch.Generator().manual_seed(1))
    rows[:, 0] = 2
    with torch.no_grad():
        expected = whole.scores(rows)
        got = peft(input_ids=rows).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))
    capsys.readouterr()
    figures = []
    for source in (["--model", str(merged)], ["--checkpoint-dir", str(ck)]):
        assert cli.main(["eval", *source, "--data", str(data), "--seq-len", str(SEQ)]) == 0
        figures.append(json.loads(capsys.readouterr().out))
    assert figures[1] == pytest.approx(figures[0], rel=1e-5)


def test_lora_on_bert_trains_the_adapters_and_the_head_only(task: tuple[Path, Path]) -> None:
    from trainer import loop
    from trainer.classify import encoder
    from trainer.classify.model import HeadSpec
    from trainer.lora import LoraSpec
    from trainer.model_spec import ModelSpec

    model, _ = task
    bert = encoder.load(model, seq_len=SEQ, head=HeadSpec(tuple(sorted(WORDS)), False, 0))
    loop._adapters_on(bert, ModelSpec(encoder.shape(bert.cfg), LoraSpec(2, 2.0)))
    trained = {n for n, p in bert.named_parameters() if p.requires_grad}
    layers = hf_tiny.BERT_SHAPE["num_hidden_layers"]
    assert {n for n in trained if ".lora_" in n} and len(trained) == 6 * layers * 2 + 4
    assert {n for n in trained if ".lora_" not in n} == {
        "bert.pooler.dense.weight",
        "bert.pooler.dense.bias",
        "classifier.weight",
        "classifier.bias",
    }


def test_bert_layers_are_checkpointed_and_the_head_stays_fp32(task: tuple[Path, Path]) -> None:
    """Activation checkpointing wraps BERT's layers (the loss and gradients unchanged, the
    state-dict names too), and under BF16 autocast the pooler and classifier still compute in
    FP32 from the encoder's output."""
    import torch.nn.functional as F

    from trainer import parallel
    from trainer.classify import encoder
    from trainer.classify.model import HeadSpec

    model, _ = task
    head = HeadSpec(tuple(sorted(WORDS)), False, 0)
    plain, wrapped = (encoder.load(model, seq_len=SEQ, head=head) for _ in range(2))
    wrapped.load_state_dict(plain.state_dict())
    assert parallel.checkpoint_blocks(wrapped) == hf_tiny.BERT_SHAPE["num_hidden_layers"]
    assert wrapped.state_dict().keys() == plain.state_dict().keys()
    rows = torch.randint(5, 256, (4, SEQ), generator=torch.Generator().manual_seed(2))
    rows[:, 0], rows[:2, 7:] = 2, 0
    labels, real = torch.tensor([0, 1, 2, 1]), torch.ones(4, dtype=torch.bool)
    losses = [m(rows, labels, real) for m in (plain, wrapped)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0])
    for (name, a), b in zip(plain.named_parameters(), wrapped.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, msg=name)

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = plain.scores(rows)
        first = plain.hidden(rows)[:, 0]
    pooler, classifier = plain.bert.pooler.dense, plain.classifier
    pooled = torch.tanh(F.linear(first.float(), pooler.weight, pooler.bias))
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, F.linear(pooled, classifier.weight, classifier.bias))


def _multi_label_documents(count: int) -> list[dict[str, object]]:
    """``count`` documents of words of one or two classes each, labelled with those classes
    (every combination, none empty)."""
    import random

    rng = random.Random(3)
    names = sorted(WORDS)
    out = []
    for _ in range(count):
        labels = rng.sample(names, rng.choice((1, 2)))
        words = [f"w{rng.choice(WORDS[n])}" for n in labels for _ in range(rng.randint(2, 4))]
        rng.shuffle(words)
        out.append({"text": " ".join(words), "labels": sorted(labels)})
    return out


def test_a_multi_label_bert_learns_which_classes_a_text_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = hf_tiny.bert_dir(tmp_path)
    source = write_jsonl(tmp_path / "docs.jsonl", _multi_label_documents(300))
    data, ck, out = tmp_path / "data", tmp_path / "ck", tmp_path / "export"
    prepare = ["prepare-data", "--format", "classify", "--tokenizer", str(model)]
    split = ["--seq-len", str(SEQ), "--eval-fraction", "0.1"]
    assert cli.main([*prepare, "--input", str(source), "--out", str(data), *split]) == 0
    args = _run(model, data, ck, "--epochs", "6", "--class-weights", "auto", "--lr", "2e-3")
    assert cli.main(args) == 0
    assert cli.main(["export", "--checkpoint-dir", str(ck), "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["problem_type"] == (
        "multi_label_classification"
    )
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(out), "--data", str(data), "--seq-len", str(SEQ)]) == 0
    line = json.loads(capsys.readouterr().out)
    assert set(line) == {"loss", "micro_f1", "macro_f1", "examples"}
    assert line["micro_f1"] >= 0.9, line

    lines = write_jsonl(tmp_path / "new.jsonl", [{"text": "w21 w45 w22 w50"}])
    scored = tmp_path / "scored.jsonl"
    assert (
        cli.main(["predict", "--model", str(out), "--input", str(lines), "--out", str(scored)]) == 0
    )
    (record,) = [json.loads(r) for r in scored.read_text().splitlines()]
    # Each class above probability 0.5 (sigmoids: they need not add up to 1).
    assert record["labels"] == [n for n, p in sorted(record["scores"].items()) if p > 0.5]
    assert set(record["scores"]) == set(WORDS) and "finance" in record["labels"], record


def test_a_long_document_keeps_its_sep_as_transformers_truncation_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows cut to the sequence length end with BERT's [SEP], as a tokenizer's
    ``truncation=True`` makes them: training, eval and predict see what transformers' pipeline
    serves; a decoder's tokenizer appends nothing, so its rows are the first tokens."""
    from transformers import AutoTokenizer, pipeline

    from trainer import tokenizing
    from trainer.classify.data import ClassifySampler, open_labels, tail_tokens
    from trainer.data import open_dataset

    model = hf_tiny.bert_dir(tmp_path)
    texts = [" ".join(f"w{j}" for j in range(i, i + 3 * SEQ)) for i in range(1, 6)]
    texts += [f"w{i} w{i + 1}" for i in range(1, 6)]  # and shorter ones, untouched
    docs = [{"text": t, "label": "long" if len(t.split()) > 2 else "short"} for t in texts]
    source, data = write_jsonl(tmp_path / "docs.jsonl", docs), tmp_path / "data"
    prepare = ["prepare-data", "--format", "classify", "--tokenizer", str(model), "--input"]
    split = ["--seq-len", str(SEQ), "--eval-fraction", "0"]
    assert cli.main([*prepare, str(source), "--out", str(data), *split]) == 0
    labels = open_labels(data)
    assert labels.tail == 1
    sampler = ClassifySampler(
        open_dataset(data), labels.train, pad_token_id=0, seq_len=SEQ, micro_batch=10, seed=0,
        shuffle=False, tail=labels.tail,
    )  # fmt: skip
    rows, _, _ = sampler.batch(0)
    tok = AutoTokenizer.from_pretrained(model)
    truncated = tok(texts, truncation=True, max_length=SEQ, padding="max_length")["input_ids"]
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, truncated))
    assert tail_tokens(tokenizing.HfTokenizer(hf_tiny.model_dir(tmp_path, "llama"))) == 0

    config = json.loads((model / "config.json").read_text())
    names = {"id2label": {"0": "long", "1": "short"}, "label2id": {"long": 0, "short": 1}}
    (model / "config.json").write_text(json.dumps({**config, **names}))
    lines, scored = write_jsonl(tmp_path / "new.jsonl", [{"text": texts[0]}]), tmp_path / "s.jsonl"
    args = ["predict", "--model", str(model), "--input", str(lines), "--out", str(scored)]
    assert cli.main([*args, "--seq-len", str(SEQ)]) == 0
    (record,) = [json.loads(r) for r in scored.read_text().splitlines()]
    served = pipeline("text-classification", model=str(model), top_k=None)
    (theirs,) = served([texts[0]], truncation=True, max_length=SEQ)
    assert record["scores"] == pytest.approx({s["label"]: s["score"] for s in theirs}, rel=1e-4)
