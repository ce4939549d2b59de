"""The fine-tuning benchmark's paired figure times what it says: a step of each loop in turn."""

from pathlib import Path

import pytest
import torch

from bench import hf_bench

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


def test_paired_steps_time_each_loop_once_per_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hf_bench, "LLAMA", TINY)
    monkeypatch.setattr(hf_bench, "SEQ_LEN", 16)
    monkeypatch.setattr(hf_bench, "BATCH", 2)
    model = hf_bench.make_model(tmp_path, TINY, dtype=torch.float32, max_shard_bytes=1 << 20)
    steps: list[str] = []
    transformers_step = hf_bench.transformers_step

    def counted(*args: object) -> None:
        steps.append("transformers")
        transformers_step(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(hf_bench, "transformers_step", counted)

    paired = hf_bench.paired_steps(model, pairs=3)

    assert {name: len(s) for name, s in paired["seconds"].items()} == {"ours": 3, "transformers": 3}
    assert steps == ["transformers"] * (hf_bench.WARMUP + 3)
    low, high = paired["quartiles"]
    assert low <= paired["ratio"] <= high
    ratios = [t / o for o, t in zip(*paired["seconds"].values(), strict=True)]
    assert sorted(ratios)[1] == pytest.approx(paired["ratio"])
