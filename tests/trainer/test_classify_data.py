"""``prepare-data --format classify``: labels.json and stable ids, class counts, the stratified
held-out split, --eval-input, multi-label, the label files' checks and staging list, and the
rows the sampler makes of them."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import hf_tiny
import numpy as np
import pytest
import torch

from trainer import cli, data
from trainer.classify import data as cdata
from trainer.tokenizing import InputError

# Each class's words: a document's label is the class whose words it holds. None starts with
# "w1": the tiny tokenizer's EOS, a special token, which it splits out of such words.
WORDS = {"sports": range(20, 40), "finance": range(40, 70), "law": range(70, 100)}


def documents(
    count: int, seed: int = 0, *, skew: tuple[int, ...] = (1, 1, 1)
) -> list[dict[str, Any]]:
    """``count`` documents of 3-9 words of one class each, classes drawn with weights
    ``skew``."""
    rng = random.Random(seed)
    names = list(WORDS)
    out = []
    for _ in range(count):
        label = rng.choices(names, weights=skew)[0]
        words = [f"w{rng.choice(WORDS[label])}" for _ in range(rng.randint(3, 9))]
        out.append({"text": " ".join(words), "label": label})
    return out


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_tiny.save_tokenizer(tmp_path_factory.mktemp("tok"))


def _prepare(tokenizer: Path, source: Path, out: Path, *extra: str) -> int:
    return cli.main(
        [
            "prepare-data",
            "--format",
            "classify",
            "--tokenizer",
            str(tokenizer),
            "--input",
            str(source),
            "--out",
            str(out),
            "--seq-len",
            "8",
            *extra,
        ]
    )


def test_labels_sorted_counts_reported_and_split_stratified(
    tokenizer: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = documents(90, skew=(6, 2, 1))
    source = write_jsonl(tmp_path / "in.jsonl", records)
    assert _prepare(tokenizer, source, tmp_path / "ds", "--eval-fraction", "0.1") == 0
    out = capsys.readouterr().out
    counts = {n: sum(r["label"] == n for r in records) for n in WORDS}
    held = {n: min(math.ceil(0.1 * c), c - 1) for n, c in counts.items()}
    assert json.loads((tmp_path / "ds" / cdata.LABELS_FILE).read_text()) == sorted(WORDS)
    line = "classes (3) (train/eval): " + ", ".join(
        f"{n} {counts[n] - held[n]}/{held[n]}" for n in sorted(WORDS)
    )
    assert line in out
    labels = cdata.open_labels(tmp_path / "ds")
    assert labels.eval is not None
    assert np.bincount(labels.eval, minlength=3).tolist() == [held[n] for n in sorted(WORDS)]
    manifest = json.loads((tmp_path / "ds" / data.MANIFEST).read_text())
    assert manifest["examples"] == {"train": 90 - sum(held.values()), "eval": sum(held.values())}
    staged = {name for name, _ in data.dataset_files(manifest)}
    assert {cdata.LABELS_FILE, *cdata.LABEL_ARRAYS.values()} <= staged


def test_the_order_of_the_lines_changes_neither_ids_nor_split(
    tokenizer: Path, tmp_path: Path
) -> None:
    records = documents(60, seed=3)
    shuffled = records[:]
    random.Random(1).shuffle(shuffled)
    held_out = []
    for name, recs in (("a", records), ("b", shuffled)):
        assert (
            _prepare(
                tokenizer,
                write_jsonl(tmp_path / f"{name}.jsonl", recs),
                tmp_path / name,
                "--eval-fraction",
                "0.2",
            )
            == 0
        )
        ds, labels = data.open_dataset(tmp_path / name), cdata.open_labels(tmp_path / name)
        assert ds.eval_split is not None and labels.eval is not None
        sampler = cdata.ClassifySampler(
            ds.eval_split,
            labels.eval,
            pad_token_id=0,
            seq_len=9,
            micro_batch=64,
            seed=0,
            shuffle=False,
        )
        x, y, rows = sampler.batch(0)
        held_out.append(
            sorted(
                (tuple(r[:9].tolist()), int(label))
                for r, label, real in zip(x, y, rows, strict=True)
                if real
            )
        )
    assert held_out[0] == held_out[1]


def test_eval_input_and_multi_label(
    tokenizer: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train = [
        {"text": "w10 w30", "labels": ["sports", "finance"]},
        {"text": "w50", "labels": ["law"]},
        {"text": "w11", "labels": []},
    ]
    held = [{"text": "w31 w51", "labels": ["finance", "law"]}]
    source, other = (
        write_jsonl(tmp_path / "t.jsonl", train),
        write_jsonl(tmp_path / "e.jsonl", held),
    )
    assert _prepare(tokenizer, source, tmp_path / "ds", "--eval-input", str(other)) == 0
    assert (
        "classes (multi-label, 3) (train/eval): finance 1/1, law 1/1, sports 1/0"
        in capsys.readouterr().out
    )
    labels = cdata.open_labels(tmp_path / "ds")
    assert labels.multi_label and labels.names == ("finance", "law", "sports")
    assert labels.train.tolist() == [[1, 0, 1], [0, 1, 0], [0, 0, 0]]
    assert labels.eval is not None and labels.eval.tolist() == [[1, 1, 0]]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            [{"text": "w1", "label": "a"}, {"text": "w2", "labels": ["b"]}],
            "mixes 'label' and 'labels'",
        ),
        ([{"text": "w1", "label": "a"}, {"text": "w2", "label": "a"}], "1 class"),
        ([{"text": "w1"}], "exactly one of 'label'"),
        ([{"text": "w1", "label": ""}], "non-empty string"),
        ([{"text": "w1", "labels": ["a", "a"]}], "names a class twice"),
        ([{"text": 3, "label": "a"}], "field 'text' must be a string"),
    ],
)
def test_bad_input_is_named(
    tokenizer: Path, tmp_path: Path, lines: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(InputError, match=message):
        cdata.prepare(tmp_path / "ds", tokenizer, write_jsonl(tmp_path / "in.jsonl", lines))


def test_a_split_that_holds_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="holds out no example"):
        cdata.stratified_split(["a", "b", "c"], [b"1", b"2", b"3"], 0.1)


def test_label_files_are_checked(tokenizer: Path, tmp_path: Path) -> None:
    assert (
        _prepare(tokenizer, write_jsonl(tmp_path / "in.jsonl", documents(30)), tmp_path / "ds") == 0
    )
    array = tmp_path / "ds" / cdata.LABEL_ARRAYS["train"]
    np.save(array, np.zeros(3, dtype=np.int32), allow_pickle=False)
    with pytest.raises(cdata.LabelsError, match="checksum mismatch"):
        cdata.open_labels(tmp_path / "ds")
    with pytest.raises(cdata.LabelsError, match="does not fit"):
        cdata.open_labels(tmp_path / "ds", verify=False)


def test_sampler_visits_each_example_once_an_epoch_in_static_rows(
    tokenizer: Path, tmp_path: Path
) -> None:
    assert (
        _prepare(
            tokenizer,
            write_jsonl(tmp_path / "in.jsonl", documents(23)),
            tmp_path / "ds",
            "--eval-fraction",
            "0",
        )
        == 0
    )
    ds, labels = data.open_dataset(tmp_path / "ds"), cdata.open_labels(tmp_path / "ds")
    options: dict[str, Any] = {"pad_token_id": 0, "seq_len": 6, "micro_batch": 2, "seed": 5}
    whole = cdata.ClassifySampler(ds, labels.train, grad_accum=2, world_size=2, **options)
    assert whole.steps_in(0) == math.ceil(23 / 8)
    seen: list[tuple[int, ...]] = []
    for step in range(whole.steps_in(0)):
        parts = [
            cdata.ClassifySampler(
                ds, labels.train, grad_accum=2, world_size=2, rank=r, **options
            ).batch(step, m)
            for m in range(2)
            for r in range(2)
        ]
        assert whole.trained_targets(step) == sum(int(rows.sum()) for _, _, rows in parts)
        for x, _, rows in parts:
            assert x.shape == (2, 6) and x.dtype == torch.int64
            seen += [tuple(row.tolist()) for row, real in zip(x, rows, strict=True) if real]
    assert ds.index is not None
    offsets = ds.index[0].tolist()
    stored = [
        tuple(
            np.pad(
                np.asarray(ds.shards[0][a:b][:6], dtype=np.int64), (0, max(0, 6 - (b - a)))
            ).tolist()
        )
        for a, b in itertools.pairwise(offsets)
    ]
    assert sorted(seen) == sorted(stored)
    shuffled = [tuple(r.tolist()) for r in whole.batch(whole.steps_in(0))[0]]
    assert shuffled != [tuple(r.tolist()) for r in whole.batch(0)[0]]


def _hf_classifier(tokenizer: Path, out: Path) -> Any:
    """A tiny transformers Llama classifier over the three classes, saved to ``out`` with the
    tokenizer (pad token: its EOS, id 1)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    names = sorted(WORDS)
    shape: dict[str, Any] = dict(hf_tiny.SHAPE)
    config = LlamaConfig(
        **shape,
        id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)},
        pad_token_id=1,
    )
    torch.manual_seed(0)
    classifier: Any = LlamaForSequenceClassification
    model = classifier(config)
    model.eval()
    model.save_pretrained(out)
    for file in tokenizer.iterdir():
        (out / file.name).write_bytes(file.read_bytes())
    return model


def test_eval_and_predict_of_a_classifier_agree_with_transformers(
    tokenizer: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoTokenizer

    records = documents(40, seed=7)
    assert (
        _prepare(
            tokenizer,
            write_jsonl(tmp_path / "in.jsonl", records),
            tmp_path / "ds",
            "--eval-fraction",
            "0.5",
        )
        == 0
    )
    theirs = _hf_classifier(tokenizer, tmp_path / "clf")
    capsys.readouterr()
    assert (
        cli.main(
            [
                "eval",
                "--model",
                str(tmp_path / "clf"),
                "--data",
                str(tmp_path / "ds"),
                "--seq-len",
                "8",
                "--micro-batch",
                "3",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    line = json.loads(capsys.readouterr().out)
    assert set(line) == {"loss", "accuracy", "macro_f1", "examples"}

    ds, labels = data.open_dataset(tmp_path / "ds"), cdata.open_labels(tmp_path / "ds")
    assert ds.eval_split is not None and labels.eval is not None
    rows = cdata.ClassifySampler(
        ds.eval_split, labels.eval, pad_token_id=1, seq_len=8, micro_batch=64, seed=0, shuffle=False
    )
    x, y, real = rows.batch(0)
    with torch.no_grad():
        logits = theirs(input_ids=x[real]).logits
    expected = torch.nn.functional.cross_entropy(logits, y[real]).item()
    assert line["examples"] == int(real.sum())
    assert line["loss"] == pytest.approx(expected, rel=1e-4)
    assert line["accuracy"] == pytest.approx(float((logits.argmax(-1) == y[real]).float().mean()))

    write_jsonl(
        tmp_path / "new.jsonl", [{"id": i, "text": r["text"]} for i, r in enumerate(records[:5])]
    )
    assert (
        cli.main(
            [
                "predict",
                "--model",
                str(tmp_path / "clf"),
                "--input",
                str(tmp_path / "new.jsonl"),
                "--out",
                str(tmp_path / "out.jsonl"),
                "--seq-len",
                "8",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    predicted = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    tok = AutoTokenizer.from_pretrained(tmp_path / "clf")
    for record, got in zip(records[:5], predicted, strict=True):
        ids = torch.tensor([tok(record["text"])["input_ids"][:8]])
        with torch.no_grad():
            probs = torch.softmax(theirs(input_ids=ids).logits[0], -1)
        assert got["text"] == record["text"] and "id" in got
        assert got["label"] == sorted(WORDS)[int(probs.argmax())]
        assert [got["scores"][n] for n in sorted(WORDS)] == pytest.approx(probs.tolist(), rel=1e-4)


def test_a_cut_row_keeps_its_tail_where_there_is_room() -> None:
    tokens = np.arange(10)
    assert cdata.cut_row(tokens, 4, 1).tolist() == [0, 1, 2, 9]
    assert cdata.cut_row(tokens, 4, 0).tolist() == [0, 1, 2, 3]
    assert cdata.cut_row(tokens, 1, 1).tolist() == [0]  # no room for a text token: the first
    assert cdata.cut_row(tokens, 12, 1).tolist() == tokens.tolist()  # short enough: whole
