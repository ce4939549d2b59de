"""The state-dict adapter of the Llama family: our parameters' names to transformers' and back.

Llama, Qwen2, Qwen3 and Mistral (the architectures :mod:`trainer.hf_config` reads) share
transformers' ``LlamaForCausalLM`` module names; what differs between them (attention biases,
Qwen3's per-head q and k norms, a tied output head) is a field of
:class:`~trainer.config.ModelConfig`, so one adapter serves the four. :func:`names` is the one
mapping: our attention has one fused ``qkv`` projection ([q; k; v] rows) and our MLP one fused
``up`` ([gate; up] rows), concatenated on the way in (:func:`from_hf`) and split on the way out
(:func:`to_hf`). :mod:`trainer.lora` takes its adapters' modules and PEFT names from the same
mapping. Another family (an encoder, say) gets a module of its own with these three functions,
as torchtitan keeps one ``state_dict_adapter.py`` per model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from trainer.config import ModelConfig


def names(cfg: ModelConfig) -> dict[str, tuple[tuple[str, int], ...]]:
    """The one mapping between our parameters and transformers': each of ours to the Hugging
    Face tensors (name, rows) concatenated along dim 0 to make it. A tied output head maps to
    the embedding (and is not written on export)."""
    q, kv, ff = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.ffn_width
    mapping: dict[str, tuple[tuple[str, int], ...]] = {
        "tok.weight": (("model.embed_tokens.weight", cfg.vocab_size),)
    }
    for i in range(cfg.n_layer):
        ours, hf = f"blocks.{i}.", f"model.layers.{i}."
        attn = hf + "self_attn."
        mapping[ours + "norm1.weight"] = ((hf + "input_layernorm.weight", cfg.d_model),)
        for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            mapping[ours + f"attn.qkv.{kind}"] = (
                (attn + f"q_proj.{kind}", q),
                (attn + f"k_proj.{kind}", kv),
                (attn + f"v_proj.{kind}", kv),
            )
        mapping[ours + "attn.proj.weight"] = ((attn + "o_proj.weight", cfg.d_model),)
        if cfg.out_bias:
            mapping[ours + "attn.proj.bias"] = ((attn + "o_proj.bias", cfg.d_model),)
        if cfg.qk_norm:
            mapping[ours + "attn.q_norm.weight"] = ((attn + "q_norm.weight", cfg.head_dim),)
            mapping[ours + "attn.k_norm.weight"] = ((attn + "k_norm.weight", cfg.head_dim),)
        mapping[ours + "norm2.weight"] = ((hf + "post_attention_layernorm.weight", cfg.d_model),)
        mapping[ours + "mlp.up.weight"] = (
            (hf + "mlp.gate_proj.weight", ff),
            (hf + "mlp.up_proj.weight", ff),
        )
        mapping[ours + "mlp.down.weight"] = ((hf + "mlp.down_proj.weight", cfg.d_model),)
    mapping["norm.weight"] = (("model.norm.weight", cfg.d_model),)
    head = "model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"
    mapping["head.weight"] = ((head, cfg.vocab_size),)
    return mapping


def from_hf(
    cfg: ModelConfig,
    shapes: Mapping[str, tuple[int, ...]],
    read: Callable[[str, tuple[int, ...]], torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Our state of ``cfg``'s model (parameters of ``shapes``) from the Hugging Face tensors
    that ``read(name, shape)`` gives (checked by it against the shape given): one FP32 tensor
    per parameter, each piece converted as it is copied into its rows (no FP32 copy of a piece
    and no concatenation after); a tied output head is the embedding."""
    state: dict[str, torch.Tensor] = {}
    for ours, parts in names(cfg).items():
        if ours == "head.weight" and cfg.tie_embeddings:
            state[ours] = state["tok.weight"]
            continue
        fused = torch.empty(shapes[ours], dtype=torch.float32)
        start = 0
        for hf, rows in parts:
            fused[start : start + rows].copy_(read(hf, (rows, *shapes[ours][1:])))
            start += rows
        state[ours] = fused
    return state


def to_hf(
    state: Mapping[str, torch.Tensor], cfg: ModelConfig, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """``state`` (ours, of ``cfg``'s model) as transformers' tensors in ``dtype``, each fused
    parameter split into its pieces; a tied output head is left out (transformers ties it to
    the embedding it loads).

    Raises:
        ValueError: ``state`` lacks a parameter of the model.
    """
    tensors: dict[str, torch.Tensor] = {}
    for ours, parts in names(cfg).items():
        if ours == "head.weight" and cfg.tie_embeddings:
            continue  # transformers ties lm_head to the embedding it loads
        if ours not in state:
            raise ValueError(f"the checkpoint's model state lacks {ours}")
        pieces = torch.split(state[ours], [rows for _, rows in parts])
        for (hf, _), piece in zip(parts, pieces, strict=True):
            # Copies: safetensors refuses views that share storage.
            tensors[hf] = piece.to(dtype=dtype, copy=True).contiguous()
    return tensors
