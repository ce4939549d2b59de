import pytest
import torch

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
