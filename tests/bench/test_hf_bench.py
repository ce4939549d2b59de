"""The fine-tuning benchmark's paired figure times what it says: a step of each loop in turn."""

from pathlib import Path
from typing import Any

import pytest
import torch

from bench import hf_bench
from trainer import hf

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


def test_paired_steps_alternate_one_step_of_each_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hf_bench, "LLAMA", TINY)
    monkeypatch.setattr(hf_bench, "SEQ_LEN", 16)
    monkeypatch.setattr(hf_bench, "BATCH", 2)
    model = hf_bench.make_model(tmp_path, TINY, dtype=torch.float32, max_shard_bytes=1 << 20)
    steps: list[str] = []
    load_pretrained, transformers_step = hf.load_pretrained, hf_bench.transformers_step

    def loaded(*args: Any) -> torch.nn.Module:
        ours: torch.nn.Module = load_pretrained(*args)
        ours.register_forward_hook(lambda *_: steps.append("ours"))
        return ours

    def counted(*args: Any) -> None:
        steps.append("transformers")
        transformers_step(*args)

    monkeypatch.setattr(hf, "load_pretrained", loaded)
    monkeypatch.setattr(hf_bench, "transformers_step", counted)

    paired = hf_bench.paired_steps(model, pairs=3)

    # Two warm-up pairs, then the three timed; which loop goes first alternates.
    assert hf_bench.WARMUP == 2
    pair = ["ours", "transformers"]
    assert steps == [*pair, *pair[::-1], *pair, *pair[::-1], *pair]
    assert {name: len(s) for name, s in paired["seconds"].items()} == {"ours": 3, "transformers": 3}
    seconds = paired["seconds"]
    low, middle, high = sorted(
        t / o for o, t in zip(seconds["ours"], seconds["transformers"], strict=True)
    )
    assert paired["ratio"] == pytest.approx(middle)
    assert paired["quartiles"] == pytest.approx([(low + middle) / 2, (middle + high) / 2])
