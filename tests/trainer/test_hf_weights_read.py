"""``hf.read_weights`` on checkpoints of every floating-point dtype: each tensor becomes the FP32
tensor ``Tensor.to`` makes of safetensors' own, and torch's thread count (lowered to one while the
weights are converted) is left as it was, also when loading fails."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import hf_tiny
import pytest
import torch
from safetensors.torch import load_file, save_file

from trainer import hf, hf_config, hf_llama

SEQ = 16
DTYPES = (torch.bfloat16, torch.float16, torch.float64, torch.float32, torch.float8_e4m3fn)


@pytest.fixture
def two_threads() -> Iterator[None]:
    """Two intra-op threads for the test (the suite runs on one), then the suite's count."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_each_dtype_loads_as_its_fp32_conversion(tmp_path: Path, two_threads: None) -> None:
    source = hf_tiny.model_dir(tmp_path)
    weights = load_file(source / hf.SINGLE)
    mixed = {
        name: tensor.to(dtype)
        for (name, tensor), dtype in zip(weights.items(), itertools.cycle(DTYPES), strict=False)
    }
    save_file(mixed, source / hf.SINGLE)
    cfg = hf_config.model_config(source, seq_len=SEQ)
    ours = hf.read_weights(source, cfg)
    for name, parts in hf_llama.names(cfg).items():
        want = torch.cat([mixed[part].to(torch.float32) for part, _ in parts])
        assert ours[name].dtype == torch.float32
        assert torch.equal(ours[name], want), name
    assert torch.get_num_threads() == 2


def test_thread_count_is_restored_when_loading_fails(tmp_path: Path, two_threads: None) -> None:
    source = hf_tiny.model_dir(tmp_path)
    weights = load_file(source / hf.SINGLE)
    save_file({**weights, "model.norm.weight": torch.ones(3)}, source / hf.SINGLE)
    with pytest.raises(hf.HFWeightsError, match=r"model\.norm\.weight has shape \(3,\)"):
        hf.load_pretrained(source, hf_config.model_config(source, seq_len=SEQ))
    assert torch.get_num_threads() == 2
