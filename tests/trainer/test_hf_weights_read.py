"""The safetensors reader behind ``hf.read_weights``: every dtype a checkpoint holds becomes the
FP32 tensor ``Tensor.to`` makes of safetensors' own tensor, whatever the staging buffer's size;
torch's thread count is left as it was; a file shorter than its header says is named."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import hf_tiny
import pytest
import torch
from safetensors.torch import load_file, save_file

from trainer import hf, safetensors_files

SEQ = 16
# Every dtype read with file reads, and one (FP8) that goes through safe_open's tensor.
DTYPES = (torch.bfloat16, torch.float16, torch.float64, torch.float32, torch.float8_e4m3fn)


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _mixed_dtypes(tmp_path: Path) -> Path:
    """A tiny Llama whose tensors cycle through :data:`DTYPES`."""
    source = hf_tiny.model_dir(tmp_path)
    weights = load_file(source / hf.SINGLE)
    mixed = {
        name: tensor.to(dtype)
        for (name, tensor), dtype in zip(weights.items(), itertools.cycle(DTYPES), strict=False)
    }
    save_file(mixed, source / hf.SINGLE)
    return source


@pytest.mark.parametrize("staging", [64, safetensors_files.STAGING_BYTES])
def test_each_dtype_loads_as_safetensors_tensor_converted(
    staging: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two_threads: None
) -> None:
    # 64 bytes: every tensor of the tiny model is read and converted in several steps.
    monkeypatch.setattr(safetensors_files, "STAGING_BYTES", staging)
    source = _mixed_dtypes(tmp_path)
    cfg = hf.model_config(source, seq_len=SEQ)
    theirs = load_file(source / hf.SINGLE)
    assert {t.dtype for t in theirs.values()} == set(DTYPES)
    ours = hf.read_weights(source, cfg)
    for name, parts in hf.weight_names(cfg).items():
        want = torch.cat([theirs[part].to(torch.float32) for part, _ in parts])
        assert ours[name].dtype == torch.float32
        assert torch.equal(ours[name], want), name
    assert torch.get_num_threads() == 2


def test_a_file_shorter_than_its_header_says_is_named(tmp_path: Path, two_threads: None) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.ones(4, 8, dtype=torch.bfloat16)}, path)
    entries = safetensors_files.header(path)
    assert entries["a"].end - entries["a"].begin == 64
    # Shortened after the header was read, as a file replaced while it is being loaded.
    path.write_bytes(path.read_bytes()[:-10])
    dest = torch.empty(4, 8)
    with pytest.raises(
        OSError, match=re.escape(f"{path}: ends 10 bytes before the tensor it holds")
    ):
        safetensors_files.fill(
            [safetensors_files.Piece(path, "a", dest)], {path: entries}, handles={}
        )
    assert torch.get_num_threads() == 2
