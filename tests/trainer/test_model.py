import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

from trainer import model as model_module
from trainer.config import PRESETS, ModelConfig, preset
from trainer.model import GPT


def test_small_preset_is_about_11m_parameters() -> None:
    model = GPT(PRESETS["small"].model)
    assert 10.5e6 < model.num_params() < 11.5e6


def test_flops_per_token_is_6n_plus_attention() -> None:
    cfg = PRESETS["small"].model
    model = GPT(cfg)
    n = model.num_params() - cfg.seq_len * cfg.d_model  # learned positions are a lookup
    assert model.flops_per_token() == 6 * n + 12 * cfg.n_layer * cfg.d_model * cfg.seq_len


def test_1b_preset_has_the_llama_3_2_1b_shape() -> None:
    with torch.device("meta"):
        model = GPT(PRESETS["1b"].model)
    # Llama-3.2-1B: 1.24B parameters with tied embeddings.
    assert 1.23e9 < model.num_params() < 1.25e9
    assert PRESETS["1b"].parallel == "fsdp"


def test_llama_style_forward_and_tied_head() -> None:
    cfg = ModelConfig(
        n_layer=1, n_head=4, n_kv_head=2, d_model=32, seq_len=16, vocab_size=64, llama_style=True
    )
    model = GPT(cfg)
    assert model.head.weight is model.tok.weight
    idx = torch.randint(0, 64, (2, 16))
    loss = model(idx, idx)
    loss.backward()
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_invalid_shapes_and_unknown_preset_are_named() -> None:
    with pytest.raises(ValueError, match="d_model 30 must be divisible by n_head 4"):
        ModelConfig(n_layer=1, n_head=4, d_model=30, seq_len=8, vocab_size=8)
    with pytest.raises(ValueError, match="preset 'huge' is unknown; known: tiny, small, 125m, 1b"):
        preset("huge")


LLAMA = ModelConfig(
    n_layer=1, n_head=4, n_kv_head=2, d_model=32, seq_len=16, vocab_size=64, llama_style=True
)


def _bf16_parameters(model: GPT) -> GPT:
    """What FSDP2's mixed precision gathers: BF16 parameters, buffers left as they are."""
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    return model


@pytest.mark.parametrize(
    "setup",
    [
        # FSDP2's mixed precision gathers BF16 parameters; autocast computes matmuls in BF16.
        lambda m: (_bf16_parameters(m), contextlib.nullcontext()),
        lambda m: (m, torch.autocast("cpu", dtype=torch.bfloat16)),
    ],
    ids=["bf16-parameters", "bf16-autocast"],
)
def test_rope_keeps_queries_and_keys_in_the_activation_dtype(
    setup: Callable[[GPT], tuple[GPT, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rotary tables are FP32 buffers; multiplied in as they are, they would promote q and k
    to FP32 while v stays BF16."""
    seen: list[tuple[torch.dtype, ...]] = []
    real = model_module.F.scaled_dot_product_attention

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
        seen.append((q.dtype, k.dtype, v.dtype))
        return real(q, k, v, **kw)

    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention", attention)
    model, context = setup(GPT(LLAMA))
    idx = torch.randint(0, 64, (2, 16))
    with context:
        loss = model(idx, idx)
    assert torch.isfinite(loss)
    assert seen == [(torch.bfloat16,) * 3]
