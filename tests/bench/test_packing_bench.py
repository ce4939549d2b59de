"""The packing benchmark counts what it says: example tokens of packed rows, every token of the
stream, on conversations of varied lengths."""

import importlib
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from tests.conftest import ROOT
from trainer import data, packing


def _tiny_model(packing_bench: ModuleType, root: Path) -> Path:
    hf_bench = packing_bench.hf_bench
    tiny = {
        **hf_bench.LLAMA,
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
    }
    path: Path = hf_bench.make_model(root, tiny, dtype=torch.float32, max_shard_bytes=1 << 20)
    return path


def test_useful_tokens_are_the_rows_non_padding_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As `make bench` runs it: a script beside hf_bench.py, which it imports as a sibling.
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    packing_bench = importlib.import_module("packing_bench")
    monkeypatch.setattr(packing_bench.hf_bench, "SEQ_LEN", 128)
    monkeypatch.setattr(packing_bench.hf_bench, "BATCH", 2)
    examples = packing_bench.conversations(60, vocab=64)
    lengths = [tokens.size for tokens, _ in examples]
    assert min(lengths) < 64 and max(lengths) > 128  # varied: some rows hold several, some cut
    model = _tiny_model(packing_bench, tmp_path)
    packed, stream = packing_bench.write_both(tmp_path, examples, vocab=64, model_dir=model)
    steps = range(2, 5)
    assert packing_bench.useful_tokens(stream, steps) == 3 * 2 * 128
    rows = packing.PackedSampler(data.open_dataset(packed), seq_len=128, micro_batch=2, seed=0)
    padding = sum(
        int(np.count_nonzero(np.asarray(x) == 0)) for x in (rows.batch(s)[0] for s in steps)
    )
    assert packing_bench.useful_tokens(packed, steps) == 3 * 2 * 128 - padding
    assert 0.5 < packing_bench.fill(packed) <= 1.0


def test_paired_steps_time_each_side_once_per_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    packing_bench = importlib.import_module("packing_bench")
    monkeypatch.setattr(packing_bench.hf_bench, "SEQ_LEN", 64)
    monkeypatch.setattr(packing_bench.hf_bench, "BATCH", 2)
    model = _tiny_model(packing_bench, tmp_path)
    packed, stream = packing_bench.write_both(
        tmp_path, packing_bench.conversations(80, vocab=64), vocab=64, model_dir=model
    )
    paired = packing_bench.paired_steps(model, packed, stream, pairs=3)
    assert {name: len(s) for name, s in paired["seconds"].items()} == {"packed": 3, "stream": 3}
    low, high = paired["quartiles"]
    assert 0 < low <= paired["ratio"] <= high


def test_a_round_trains_the_model_on_both_datasets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each round is a `trn-train run --model` on the bench's data, which must be recorded as
    tokenized with the model's tokenizer (the trainer refuses other data)."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    packing_bench = importlib.import_module("packing_bench")
    monkeypatch.setattr(packing_bench.hf_bench, "SEQ_LEN", 64)
    monkeypatch.setattr(packing_bench.hf_bench, "BATCH", 2)
    model = _tiny_model(packing_bench, tmp_path)
    packed, stream = packing_bench.write_both(
        tmp_path, packing_bench.conversations(80, vocab=64), vocab=64, model_dir=model
    )

    for data_dir in (packed, stream):
        assert packing_bench.run_round(model, data_dir, tmp_path) > 0
