"""``hf.read_weights`` on checkpoints of every floating-point dtype: each tensor becomes the FP32
tensor ``Tensor.to`` makes of safetensors' own, parameters of 2 MiB or more in huge-page mappings
of their own, and torch's thread count (lowered to one while the weights are converted) is left as
it was, also when loading fails."""

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


def _mapping_flags(address: int) -> list[str] | None:
    """The VmFlags of this process's mapping that holds ``address`` (/proc/self/smaps), or None
    where no mapping does."""
    holds = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        span = line.split(maxsplit=1)[0]
        if "-" in span and not span.endswith(":"):
            low, high = (int(end, 16) for end in span.split("-"))
            holds = low <= address < high
        elif holds and line.startswith("VmFlags:"):
            return line.split()[1:]
    return None


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="reads Linux's /proc/self/smaps")
def test_large_parameters_load_exactly_into_huge_page_mappings_of_their_own(
    tmp_path: Path,
) -> None:
    theirs = hf_tiny.build("llama", vocab_size=16384, intermediate_size=8192)
    torch.nn.Module.to(theirs, torch.bfloat16)
    source = hf_tiny.save(theirs, tmp_path / "bf16")
    weights = load_file(source / hf.SINGLE)
    cfg = hf_config.model_config(source, seq_len=SEQ)
    ours = hf.read_weights(source, cfg)
    for name, parts in hf_llama.names(cfg).items():
        assert torch.equal(ours[name], torch.cat([weights[p].float() for p, _ in parts])), name
    # 2 MiB each: the embedding, the head and the fused gate and up rows; the rest is smaller.
    large = {name: t for name, t in ours.items() if t.numel() * 4 >= hf.HUGE_PAGE}
    assert {"tok.weight", "head.weight", "blocks.1.mlp.up.weight"} <= set(large)
    addresses = []
    for name, tensor in large.items():
        # The storage is the tensor alone, so a checkpoint of it writes no more bytes.
        assert tensor.untyped_storage().nbytes() == tensor.numel() * 4, name
        assert tensor.data_ptr() % hf.HUGE_PAGE == 0, name
        assert "hg" in (_mapping_flags(tensor.data_ptr()) or []), name
        addresses.append(tensor.data_ptr())
    del ours, large, tensor
    # Each mapping lives as long as its tensor.
    assert all("hg" not in (_mapping_flags(a) or []) for a in addresses)
