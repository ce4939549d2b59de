"""Hugging Face ``config.json`` to :class:`~trainer.config.ModelConfig`: the architectures this
trainer reads and the fields it implements.

Four architectures are read (``architectures`` in ``config.json``, or ``model_type`` without
it): ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` and
``MistralForCausalLM``, as transformers 5.23.0 defines them. What this trainer does not implement
(an active sliding window, mixture-of-experts fields, RoPE types other than the default and
Llama 3's, partial rotary dimensions, MLP biases, activations other than SiLU, quantized weights)
fails with :class:`HFConfigError` naming the field, its value and what is allowed. Their
weights' names are :mod:`trainer.hf_llama`'s; reading them :mod:`trainer.hf`, writing them
:mod:`trainer.hf_export`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config import MODEL_SEQ_LEN, ModelConfig, RopeScaling
from trn_catalog import hf_models

CONFIG = hf_models.CONFIG_FILE
# A PEFT adapter directory's config (peft/utils/constants.py CONFIG_NAME at 0.21.2).
ADAPTER_CONFIG = "adapter_config.json"
# The one list of architectures, shared with `trnctl model stage`.
ARCHITECTURES = hf_models.MODEL_TYPES
# The defaults of transformers 5.23.0's config classes (configuration_<arch>.py) for the fields
# read here, used where config.json leaves one out. None: derived (head_dim: hidden_size //
# num_attention_heads; num_key_value_heads: num_attention_heads).
_COMMON = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "hidden_size": 4096,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "head_dim": None,
}
DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "llama": {
        **_COMMON,
        "vocab_size": 32000,
        "intermediate_size": 11008,
        "num_key_value_heads": None,
        "max_position_embeddings": 2048,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "qwen2": {
        **_COMMON,
        "vocab_size": 151936,
        "intermediate_size": 22016,
        "num_key_value_heads": 32,
        "max_position_embeddings": 32768,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    "qwen3": {
        **_COMMON,
        "vocab_size": 151936,
        "intermediate_size": 22016,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    "mistral": {
        **_COMMON,
        "vocab_size": 32000,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32,
        "sliding_window": 4096,
    },
}
# The architectures whose modeling code reads attention_bias (Llama's also reads mlp_bias).
BIAS_FIELDS = ("llama", "qwen3")
DEFAULT_ROPE_THETA = 10_000.0  # transformers' default_theta; none of the four overrides it
ROPE_TYPES = ("default", "llama3")
# Fields of mixture-of-experts configs: set (and not 0), the model is not one of the four.
MOE_FIELDS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
)


class HFConfigError(ValueError):
    """``config.json`` is missing or describes a model this trainer does not implement; the
    message names the file, the field, its value and what is allowed."""


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """``config.json`` of ``model_dir`` as a dict.

    Raises:
        HFConfigError: the directory does not exist, holds no ``config.json`` (a PEFT adapter
            directory is named as such), or the file is not a JSON object.
    """
    root = Path(model_dir)
    path = root / CONFIG
    if not root.is_dir():
        raise HFConfigError(f"model directory {root} does not exist")
    if not path.is_file() and (root / ADAPTER_CONFIG).is_file():
        raise HFConfigError(
            f"{root} is a PEFT adapter ({ADAPTER_CONFIG}, no {CONFIG}), not a model: give its "
            "base model's directory (base_model_name_or_path in its adapter_config.json), or a "
            "model with the adapter merged (trn-train export --merge-lora)"
        )
    if not path.is_file():
        raise HFConfigError(
            f"{root} holds no {CONFIG}: not a Hugging Face model directory (config.json, "
            "safetensors weights, tokenizer files)"
        )
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise HFConfigError(f"{path}: cannot read a Hugging Face model config ({e})") from e
    if not isinstance(raw, dict):
        raise HFConfigError(f"{path}: must hold a JSON object, got {type(raw).__name__}")
    return raw


def model_config(model_dir: str | Path, *, seq_len: int | None = None) -> ModelConfig:
    """The :class:`ModelConfig` of ``model_dir``'s ``config.json`` (see :func:`parse_config`).

    Raises:
        HFConfigError: see :func:`read_config` and :func:`parse_config`.
    """
    return parse_config(read_config(model_dir), seq_len=seq_len, source=Path(model_dir) / CONFIG)


def architecture(raw: Mapping[str, Any], source: str | Path = CONFIG) -> str:
    """The architecture (``llama``, ``qwen2``, ``qwen3`` or ``mistral``) of a config dict.

    Raises:
        HFConfigError: ``architectures`` (or, without it, ``model_type``) names another one.
    """
    archs = raw.get("architectures")
    if archs is not None:
        if isinstance(archs, list) and len(archs) == 1 and archs[0] in ARCHITECTURES:
            return ARCHITECTURES[archs[0]]
        raise HFConfigError(
            f"{source}: architectures {archs!r} is not supported; allowed: one of "
            f"{', '.join(ARCHITECTURES)}"
        )
    model_type = raw.get("model_type")
    if model_type in DEFAULTS:
        return str(model_type)
    raise HFConfigError(
        f"{source}: model_type {model_type!r} is not supported (and architectures is absent); "
        f"allowed: {', '.join(DEFAULTS)}"
    )


def parse_config(
    raw: Mapping[str, Any], *, seq_len: int | None = None, source: str | Path = CONFIG
) -> ModelConfig:
    """A :class:`ModelConfig` for a Hugging Face config dict: fields absent from it take the
    architecture's defaults (:data:`DEFAULTS`); ``seq_len`` None takes :data:`MODEL_SEQ_LEN`
    capped at ``max_position_embeddings``.

    Raises:
        HFConfigError: an unsupported architecture or field value, an invalid shape, or a
            ``seq_len`` outside 1..``max_position_embeddings``; the message names the field.
    """
    arch = architecture(raw, source)
    fields = _Fields(raw, DEFAULTS[arch], source)
    get, positive = fields.get, fields.positive
    _check_unsupported(raw, arch, get, source)
    heads, hidden, kv_heads, head_dim = _attention_shape(fields)
    max_positions = positive("max_position_embeddings")
    length = min(MODEL_SEQ_LEN, max_positions) if seq_len is None else seq_len
    if not 1 <= length <= max_positions:
        raise HFConfigError(
            f"{source}: seq_len {length} must be between 1 and max_position_embeddings "
            f"{max_positions}"
        )
    _check_sliding_window(arch, get, length, positive("num_hidden_layers"), source)
    theta, scaling = _rope(raw, max_positions, source)
    eps = get("rms_norm_eps")
    if isinstance(eps, bool) or not isinstance(eps, int | float) or eps <= 0:
        raise HFConfigError(f"{source}: rms_norm_eps must be a positive number, got {eps!r}")
    # Only Llama and Qwen3 read attention_bias (all four projections); Qwen2 always has q, k
    # and v biases and no output bias, Mistral none, whatever the file says.
    attention_bias = arch in BIAS_FIELDS and bool(get("attention_bias"))
    return ModelConfig(
        n_layer=positive("num_hidden_layers"),
        n_head=heads,
        d_model=hidden,
        seq_len=length,
        vocab_size=positive("vocab_size"),
        d_ff=positive("intermediate_size"),
        n_kv_head=kv_heads,
        llama_style=True,
        tie_embeddings=bool(get("tie_word_embeddings")),
        rope_theta=theta,
        d_head=head_dim,
        norm_eps=float(eps),
        rope_scaling=scaling,
        qkv_bias=arch == "qwen2" or attention_bias,
        out_bias=arch != "qwen2" and attention_bias,
        qk_norm=arch == "qwen3",
    )


@dataclass(frozen=True)
class _Fields:
    """A config dict's fields, an absent one taking the architecture's default; errors name
    ``source``."""

    raw: Mapping[str, Any]
    defaults: Mapping[str, Any]
    source: str | Path

    def get(self, field: str) -> Any:
        return self.raw[field] if field in self.raw else self.defaults.get(field)

    def positive(self, field: str) -> int:
        value = self.get(field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise HFConfigError(f"{self.source}: {field} must be a positive integer, got {value!r}")
        return value


def _attention_shape(fields: _Fields) -> tuple[int, int, int, int]:
    """Attention heads, hidden size, key-value heads and head dimension.

    Raises:
        HFConfigError: a field is not a positive integer, or the shape does not divide.
    """
    get, positive, source = fields.get, fields.positive, fields.source
    heads = positive("num_attention_heads")
    hidden = positive("hidden_size")
    kv_heads = positive("num_key_value_heads") if get("num_key_value_heads") is not None else heads
    if heads % kv_heads:
        raise HFConfigError(
            f"{source}: num_attention_heads {heads} must be a multiple of num_key_value_heads "
            f"{kv_heads}"
        )
    if get("head_dim") is not None:
        head_dim = positive("head_dim")
    elif hidden % heads:
        raise HFConfigError(
            f"{source}: hidden_size {hidden} must be a multiple of num_attention_heads {heads} "
            "when head_dim is not given"
        )
    else:
        head_dim = hidden // heads
    if head_dim % 2:
        raise HFConfigError(f"{source}: head_dim {head_dim} must be even (RoPE rotates pairs)")
    return heads, hidden, kv_heads, head_dim


def _check_unsupported(
    raw: Mapping[str, Any], arch: str, get: Callable[[str], Any], source: str | Path
) -> None:
    act = get("hidden_act")
    if act != "silu":
        raise HFConfigError(f"{source}: hidden_act {act!r} is not supported; allowed: 'silu'")
    if arch == "llama" and get("mlp_bias"):
        raise HFConfigError(
            f"{source}: mlp_bias {get('mlp_bias')!r} is not supported; allowed: false"
        )
    for field in MOE_FIELDS:
        if raw.get(field):
            raise HFConfigError(
                f"{source}: {field} {raw[field]!r}: mixture-of-experts models are not supported; "
                "allowed: absent or 0"
            )
    if raw.get("quantization_config"):
        raise HFConfigError(
            f"{source}: quantization_config is set: quantized weights are not supported; "
            "allowed: absent (full-precision weights)"
        )
    if (
        arch in BIAS_FIELDS
        and "attention_bias" in raw
        and not isinstance(raw["attention_bias"], bool)
    ):
        raise HFConfigError(
            f"{source}: attention_bias must be true or false, got {raw['attention_bias']!r}"
        )


def _check_sliding_window(
    arch: str, get: Callable[[str], Any], seq_len: int, layers: int, source: str | Path
) -> None:
    """Refuses a sliding window that would mask positions within ``seq_len``: Mistral applies
    ``sliding_window`` to every layer; Qwen2 and Qwen3 only with ``use_sliding_window``, to the
    layers ``layer_types`` marks ``sliding_attention`` (by default those from
    ``max_window_layers`` on). A window of at least ``seq_len`` positions masks nothing."""
    window = get("sliding_window")
    if arch in ("qwen2", "qwen3"):
        if not get("use_sliding_window"):
            return
        types = get("layer_types") or [
            "sliding_attention" if i >= get("max_window_layers") else "full_attention"
            for i in range(layers)
        ]
        if "sliding_attention" not in types:
            return
    elif arch != "mistral":
        return
    if window is not None and window < seq_len:
        raise HFConfigError(
            f"{source}: sliding_window {window} is active for seq_len {seq_len}: sliding-window "
            f"attention is not supported; allowed: null, or at least seq_len ({seq_len})"
        )


def _rope(
    raw: Mapping[str, Any], max_positions: int, source: str | Path
) -> tuple[float, RopeScaling | None]:
    """RoPE theta and scaling. transformers 5 keeps them in ``rope_parameters``; older files
    in ``rope_scaling`` (which wins when both are set) and a top-level ``rope_theta``."""
    key = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
    params = raw.get(key) or {}
    if not isinstance(params, dict):
        raise HFConfigError(f"{source}: {key} must be an object, got {params!r}")
    if any(isinstance(v, dict) for v in params.values()):
        raise HFConfigError(
            f"{source}: {key} is nested per layer type: per-layer RoPE is not supported; "
            "allowed: one flat object"
        )
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", raw.get("rope_theta", DEFAULT_ROPE_THETA))
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise HFConfigError(
            f"{source}: partial_rotary_factor {partial!r} is not supported; allowed: 1.0"
        )
    if isinstance(theta, bool) or not isinstance(theta, int | float) or theta <= 0:
        raise HFConfigError(f"{source}: rope_theta must be a positive number, got {theta!r}")
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise HFConfigError(
            f"{source}: {key}.rope_type {rope_type!r} is not supported; allowed: "
            f"{', '.join(repr(t) for t in ROPE_TYPES)}"
        )
    return float(theta), _llama3_scaling(raw, key, params, max_positions, source)


def _llama3_scaling(
    raw: Mapping[str, Any],
    key: str,
    params: Mapping[str, Any],
    max_positions: int,
    source: str | Path,
) -> RopeScaling:
    """Llama 3's RoPE scaling from ``params`` (``raw``'s ``key``).

    Raises:
        HFConfigError: a factor is not a positive number, high_freq_factor does not exceed
            low_freq_factor, or original_max_position_embeddings is not a positive integer.
    """
    values = {}
    for field in ("factor", "low_freq_factor", "high_freq_factor"):
        value = params.get(field)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise HFConfigError(
                f"{source}: {key}.{field} must be a positive number for rope_type 'llama3', "
                f"got {value!r}"
            )
        values[field] = float(value)
    if values["high_freq_factor"] <= values["low_freq_factor"]:
        raise HFConfigError(
            f"{source}: {key}.high_freq_factor {values['high_freq_factor']} must exceed "
            f"low_freq_factor {values['low_freq_factor']}"
        )
    # As transformers: a top-level original_max_position_embeddings wins, then the one in the
    # RoPE parameters, then max_position_embeddings.
    original = raw.get(
        "original_max_position_embeddings",
        params.get("original_max_position_embeddings", max_positions),
    )
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise HFConfigError(
            f"{source}: original_max_position_embeddings must be a positive integer, "
            f"got {original!r}"
        )
    return RopeScaling(
        factor=values["factor"],
        low_freq_factor=values["low_freq_factor"],
        high_freq_factor=values["high_freq_factor"],
        original_max_position_embeddings=original,
    )
