"""The classification benchmark runs both loops on one model and data, a Llama and a BERT: the
trainer as a classifier (its records have examples/s) and transformers' classifier, every row
whole."""

import importlib
import json
from pathlib import Path

import pytest

from bench import hf_bench
from tests.conftest import ROOT
from trainer import data
from trainer.classify import data as classify_data

TINY = {
    **hf_bench.LLAMA,
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 16,
}


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_one_round_of_each_loop_on_whole_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str
) -> None:
    # As `make bench` runs it: a script beside hf_bench.py, which it imports as a sibling.
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    classify_bench = importlib.import_module("classify_bench")
    monkeypatch.setattr(classify_bench, "SEQ_LEN", 16)
    monkeypatch.setattr(classify_bench, "BATCH", 2)
    monkeypatch.setattr(classify_bench, "DOCUMENTS", 12)
    shape = TINY if arch == "llama" else classify_bench.bert_shape(TINY)
    model = classify_bench.make_model(tmp_path, shape, arch)
    assert json.loads((model / "config.json").read_text())["model_type"] == arch
    prepared = classify_bench.make_data(tmp_path, model, TINY["vocab_size"])
    ds, labels = data.open_dataset(prepared), classify_data.open_labels(prepared)
    assert labels.names == classify_bench.CLASSES
    assert ds.index is not None and all(
        int(b - a) > 16 for a, b in zip(ds.index[0][:-1], ds.index[0][1:], strict=True)
    )
    found = classify_bench.rounds(model, prepared, tmp_path, 1, TINY["vocab_size"])
    assert found["ours"][0] > 0 and found["theirs"][0] > 0
    assert found["ratio"] == pytest.approx(found["ours"][0] / found["theirs"][0])
