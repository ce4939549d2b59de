"""Hugging Face Llama-family models: ``config.json`` to :class:`ModelConfig`, safetensors weights
in and out, and the model directory's files carried through checkpoints.

Four architectures are read (``architectures`` in ``config.json``, or ``model_type`` without
it): ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` and
``MistralForCausalLM``, as transformers 5.23.0 defines them. What this trainer does not implement
(an active sliding window, mixture-of-experts fields, RoPE types other than the default and
Llama 3's, partial rotary dimensions, MLP biases, activations other than SiLU, quantized weights)
fails with :class:`HFConfigError` naming the field, its value and what is allowed.

All name mapping between transformers' parameters and ours is :func:`weight_names`: our
attention has one fused ``qkv`` projection ([q; k; v] rows) and our MLP one fused ``up``
([gate; up] rows), concatenated on load and split on export.

Loading (:func:`load_pretrained`) builds the model on the meta device and assigns the tensors
read from the safetensors files (memory-mapped by the library) as FP32 parameters: no random
initialization, and one FP32 copy of the weights in the process that reads, converted on one
intra-op thread (see :func:`_one_intra_op_thread`). A run on several
FSDP2 ranks reads on rank 0 alone and broadcasts into the other ranks' shards (see
:func:`trainer.loop.build_model`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from trainer import tokenizing
from trainer.config import MODEL_SEQ_LEN, ModelConfig, RopeScaling
from trainer.model import GPT
from trn_catalog import hf_models

CONFIG = hf_models.CONFIG_FILE
SINGLE = hf_models.WEIGHTS_FILE
INDEX = hf_models.WEIGHTS_INDEX_FILE
# A PEFT adapter directory's config (peft/utils/constants.py CONFIG_NAME at 0.21.2).
ADAPTER_CONFIG = "adapter_config.json"
# Files of a model directory that a checkpoint carries so that export needs nothing else: the
# config and generation defaults, and the tokenizer's files.
CARRIED = (CONFIG, "generation_config.json", *tokenizing.TOKENIZER_FILES)
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
# Set, read_weights appends a JSON line (RANK, the files read) to the file it names at each
# read: a debug record of which ranks read the safetensors files (the tests check it).
READ_LOG_ENV = "TRN_WEIGHTS_READ_LOG"
# Tensors some checkpoints carry that are not weights (RoPE tables saved by old versions).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class HFConfigError(ValueError):
    """``config.json`` is missing or describes a model this trainer does not implement; the
    message names the file, the field, its value and what is allowed."""


class HFWeightsError(ValueError):
    """The safetensors files do not hold the model ``config.json`` describes; the message names
    the file or tensor."""


class ScoreInputError(ValueError):
    """The token file for ``trn-train score`` is not a list of equal-length lists of token ids."""


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
    defaults = DEFAULTS[arch]

    def get(field: str) -> Any:
        return raw[field] if field in raw else defaults.get(field)

    def positive(field: str) -> int:
        value = get(field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise HFConfigError(f"{source}: {field} must be a positive integer, got {value!r}")
        return value

    _check_unsupported(raw, arch, get, source)
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
    return float(theta), RopeScaling(
        factor=values["factor"],
        low_freq_factor=values["low_freq_factor"],
        high_freq_factor=values["high_freq_factor"],
        original_max_position_embeddings=original,
    )


def weight_names(cfg: ModelConfig) -> dict[str, tuple[tuple[str, int], ...]]:
    """The one mapping between our parameters and transformers': each of ours to the Hugging
    Face tensors (name, rows) concatenated along dim 0 to make it. A tied output head maps to
    the embedding (and is not written on export)."""
    q, kv, ff = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.ffn_width
    names: dict[str, tuple[tuple[str, int], ...]] = {
        "tok.weight": (("model.embed_tokens.weight", cfg.vocab_size),)
    }
    for i in range(cfg.n_layer):
        ours, hf = f"blocks.{i}.", f"model.layers.{i}."
        attn = hf + "self_attn."
        names[ours + "norm1.weight"] = ((hf + "input_layernorm.weight", cfg.d_model),)
        for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            names[ours + f"attn.qkv.{kind}"] = (
                (attn + f"q_proj.{kind}", q),
                (attn + f"k_proj.{kind}", kv),
                (attn + f"v_proj.{kind}", kv),
            )
        names[ours + "attn.proj.weight"] = ((attn + "o_proj.weight", cfg.d_model),)
        if cfg.out_bias:
            names[ours + "attn.proj.bias"] = ((attn + "o_proj.bias", cfg.d_model),)
        if cfg.qk_norm:
            names[ours + "attn.q_norm.weight"] = ((attn + "q_norm.weight", cfg.head_dim),)
            names[ours + "attn.k_norm.weight"] = ((attn + "k_norm.weight", cfg.head_dim),)
        names[ours + "norm2.weight"] = ((hf + "post_attention_layernorm.weight", cfg.d_model),)
        names[ours + "mlp.up.weight"] = (
            (hf + "mlp.gate_proj.weight", ff),
            (hf + "mlp.up_proj.weight", ff),
        )
        names[ours + "mlp.down.weight"] = ((hf + "mlp.down_proj.weight", cfg.d_model),)
    names["norm.weight"] = (("model.norm.weight", cfg.d_model),)
    head = "model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"
    names["head.weight"] = ((head, cfg.vocab_size),)
    return names


def tensor_files(model_dir: str | Path) -> dict[str, Path]:
    """Each tensor name of ``model_dir``'s weights and the safetensors file that holds it:
    from ``model.safetensors.index.json`` when there is one, else ``model.safetensors``.

    Raises:
        HFWeightsError: neither file exists, the index is unreadable or names a missing shard.
    """
    root = Path(model_dir)
    if (root / INDEX).is_file():
        try:
            weight_map = json.loads((root / INDEX).read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise HFWeightsError(f"{root / INDEX}: unreadable weight_map ({e})") from e
        files = {str(name): root / str(file) for name, file in weight_map.items()}
        for path in sorted(set(files.values())):
            if not path.is_file():
                raise HFWeightsError(f"{root / INDEX}: names {path.name}, which is missing")
        return files
    if (root / SINGLE).is_file():
        with safe_open(str(root / SINGLE), framework="pt") as f:
            return dict.fromkeys(f.keys(), root / SINGLE)
    raise HFWeightsError(
        f"{root}: holds neither {SINGLE} nor {INDEX} (only safetensors weights are read; "
        "convert pytorch_model.bin files with transformers' save_pretrained first)"
    )


def read_weights(model_dir: str | Path, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """``model_dir``'s weights under our names, as FP32 CPU tensors (fused where ours are).
    One process reads the files; a later multi-rank loader can call this on one rank per node
    and broadcast or shard the result.

    Raises:
        HFWeightsError: a tensor is missing, unexpected or of the wrong shape (see
            :func:`tensor_files` for the files themselves).
    """
    with torch.device("meta"):
        model = GPT(cfg)
    return _read_weights(model_dir, cfg, _shapes(model))


def _read_weights(
    model_dir: str | Path, cfg: ModelConfig, expected: Mapping[str, tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    """:func:`read_weights` given the shapes of our parameters (``expected``)."""
    files = tensor_files(model_dir)
    names = weight_names(cfg)
    wanted = {hf for parts in names.values() for hf, _ in parts}
    extra = sorted(
        n
        for n in set(files) - wanted
        if not n.endswith(IGNORED_SUFFIXES) and not (cfg.tie_embeddings and n == "lm_head.weight")
    )
    if extra:
        raise HFWeightsError(
            f"{model_dir}: tensors not part of the model config.json describes: "
            f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}"
        )
    missing = sorted(wanted - set(files))
    if missing:
        raise HFWeightsError(
            f"{model_dir}: tensors missing from the safetensors files: "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
        )
    state: dict[str, torch.Tensor] = {}
    _record_read(sorted(set(files.values())))
    with _opened(sorted(set(files.values()))) as handles, _one_intra_op_thread():
        for ours, parts in names.items():
            if ours == "head.weight" and cfg.tie_embeddings:
                state[ours] = state["tok.weight"]
                continue
            # One FP32 tensor per parameter, each piece converted as it is copied into its rows:
            # no FP32 copy of a piece and no concatenation after.
            fused = torch.empty(expected[ours], dtype=torch.float32)
            start = 0
            for hf, rows in parts:
                piece = handles[files[hf]].get_tensor(hf)
                want = (rows, *expected[ours][1:])
                if tuple(piece.shape) != want:
                    raise HFWeightsError(
                        f"{files[hf]}: tensor {hf} has shape {tuple(piece.shape)}, "
                        f"config.json implies {want}"
                    )
                fused[start : start + rows].copy_(piece)
                start += rows
            state[ours] = fused
    return state


def _record_read(paths: Sequence[Path]) -> None:
    log = os.environ.get(READ_LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            record = {"rank": int(os.environ.get("RANK", "0")), "files": [p.name for p in paths]}
            f.write(json.dumps(record) + "\n")


@contextlib.contextmanager
def _opened(paths: Sequence[Path]) -> Iterator[dict[Path, Any]]:
    with contextlib.ExitStack() as stack:
        yield {p: stack.enter_context(safe_open(str(p), framework="pt")) for p in paths}


def _shapes(model: GPT) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@contextlib.contextmanager
def _one_intra_op_thread() -> Iterator[None]:
    """torch's intra-op threads set to one, then restored. Each tensor's copy into its FP32
    parameter is a short, memory-bound parallel region that ends at a barrier waiting for its
    slowest thread; with other work on the cores every barrier can cost a scheduler time slice.
    On the project's 2-core machine at load 7-8, loading bench/hf_bench.py's ~155M BF16
    parameters took a median 0.21 to 0.30 s on one thread, 1.2 s on two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def load_pretrained(model_dir: str | Path, cfg: ModelConfig) -> GPT:
    """Our model with ``model_dir``'s weights (FP32, CPU): built on the meta device, then the
    tensors of :func:`read_weights` assigned as its parameters and the RoPE tables computed.

    Raises:
        HFWeightsError: see :func:`read_weights`.
    """
    with torch.device("meta"):
        model = GPT(cfg)
    model.load_state_dict(_read_weights(model_dir, cfg, _shapes(model)), assign=True)
    model.tie_weights()
    model.init_rope()
    return model


def carried_files(model_dir: str | Path) -> tuple[Path, ...]:
    """The files of :data:`CARRIED` that ``model_dir`` holds (``config.json`` always)."""
    root = Path(model_dir)
    return tuple(root / name for name in CARRIED if (root / name).is_file())


def fingerprint(model_dir: str | Path) -> str:
    """An identity of ``model_dir``'s model for the resume check, cheap for any size: the SHA-256
    of ``config.json`` and, for each safetensors file, its name, size, header (tensor names,
    dtypes, shapes) and first and last MiB. Two fine-tunes of one base differ in those bytes
    unless their first and last tensors' edges are equal; it is not a full content hash."""
    root = Path(model_dir)
    digest = hashlib.sha256((root / CONFIG).read_bytes())
    for path in sorted(set(tensor_files(root).values())):
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with path.open("rb") as f:
            header = int.from_bytes(f.read(8), "little")
            digest.update(f.read(min(header, size)))
            digest.update(f.read(1 << 20))
            f.seek(max(0, size - (1 << 20)))
            digest.update(f.read())
    return digest.hexdigest()


def check_empty_out(out: str | Path) -> Path:
    """``out`` as a path, when it is a new or empty directory to export into.

    Raises:
        ValueError: ``out`` is a file or a directory that holds something.
    """
    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ValueError(f"export directory {root} is not empty; choose a new or empty one")
    return root


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export_dtype(raw: Mapping[str, Any], choice: str) -> str:
    """The dtype to write: ``choice``, or with ``auto`` the config's own (``dtype``, or the older
    ``torch_dtype``; float32 when neither names one of :data:`DTYPES`)."""
    if choice != "auto":
        return choice
    named = raw.get("dtype", raw.get("torch_dtype"))
    return named if named in DTYPES else "float32"


def save_pretrained(
    state: Mapping[str, torch.Tensor],
    raw_config: Mapping[str, Any],
    out: str | Path,
    *,
    dtype: str = "auto",
    max_shard_bytes: int = 5 << 30,
) -> list[str]:
    """Writes our model ``state`` as a Hugging Face model directory ``out`` (created; it must
    not exist or be empty): ``config.json`` (``raw_config`` with the written dtype), and the
    weights in transformers' names and layout, in ``model.safetensors`` or, above
    ``max_shard_bytes`` (default 5 GiB), ``model-0000i-of-0000n.safetensors`` shards with
    ``model.safetensors.index.json``. ``dtype``: ``auto`` (see :func:`export_dtype`) or a key of
    :data:`DTYPES`. Returns the names of the files written.

    Raises:
        HFConfigError: ``raw_config`` is not a supported model (see :func:`parse_config`).
        ValueError: ``out`` is not empty, ``dtype`` or ``max_shard_bytes`` is invalid, or
            ``state`` lacks a parameter of the model.
    """
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
    name = export_dtype(raw_config, dtype)
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; allowed: auto, {', '.join(DTYPES)}")
    cfg = parse_config(raw_config, seq_len=1)
    tensors = _to_hf(state, cfg, DTYPES[name])
    root = check_empty_out(out)
    root.mkdir(parents=True, exist_ok=True)
    shards = _shard(tensors, max_shard_bytes)
    written = []
    files = (
        [SINGLE]
        if len(shards) == 1
        else [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    )
    for file, shard in zip(files, shards, strict=True):
        save_file(shard, str(root / file), metadata={"format": "pt"})
        written.append(file)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
            "weight_map": {n: f for f, shard in zip(files, shards, strict=True) for n in shard},
        }
        (root / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        written.append(INDEX)
    config = dict(raw_config)
    config["dtype"] = name
    if "torch_dtype" in config:
        config["torch_dtype"] = name
    (root / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    written.append(CONFIG)
    return written


def _to_hf(
    state: Mapping[str, torch.Tensor], cfg: ModelConfig, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for ours, parts in weight_names(cfg).items():
        if ours == "head.weight" and cfg.tie_embeddings:
            continue  # transformers ties lm_head to the embedding it loads
        if ours not in state:
            raise ValueError(f"the checkpoint's model state lacks {ours}")
        pieces = torch.split(state[ours], [rows for _, rows in parts])
        for (hf, _), piece in zip(parts, pieces, strict=True):
            # Copies: safetensors refuses views that share storage.
            tensors[hf] = piece.to(dtype=dtype, copy=True).contiguous()
    return tensors


def _shard(tensors: Mapping[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    """Tensors in order, a new shard started where the next would pass ``limit`` bytes (a
    tensor larger than the limit gets a shard of its own)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        if shards[-1] and size + tensor.nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += tensor.nbytes
    return shards


def read_token_file(path: str | Path) -> torch.Tensor:
    """The sequences of a JSON file holding a list of equal-length lists of token ids (at least
    two tokens each), as an int64 ``(sequences, length)`` tensor.

    Raises:
        ScoreInputError: the file is unreadable or not of that form; the message says where.
    """
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ScoreInputError(f"{path}: unreadable token file ({e})") from e
    if not isinstance(rows, list) or not rows:
        raise ScoreInputError(f"{path}: must hold a non-empty JSON list of lists of token ids")
    length = len(rows[0]) if isinstance(rows[0], list) else -1
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != length:
            raise ScoreInputError(
                f"{path}: sequence {i} must be a list of {length} token ids like sequence 0"
            )
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in row):
            raise ScoreInputError(f"{path}: sequence {i} holds a value that is not a token id >= 0")
    if length < 2:
        raise ScoreInputError(f"{path}: sequences need at least 2 tokens, got {length}")
    return torch.tensor(rows, dtype=torch.int64)


def score(
    model_dir: str | Path,
    tokens_file: str | Path,
    *,
    batch: int = 8,
    adapt: Callable[[GPT, ModelConfig], GPT] | None = None,
) -> tuple[float, int]:
    """The mean next-token cross-entropy (FP32, CPU) of ``model_dir``'s model over the sequences
    in ``tokens_file`` (see :func:`read_token_file`), and the number of tokens it averages:
    every position but each sequence's first is predicted from those before it, so a file of
    S sequences of L tokens counts S * (L - 1). This is the loss transformers' causal LMs return
    with ``labels=input_ids``. Sequences go through ``batch`` (default 8) at a time. ``adapt``
    (default none) changes the loaded model before it scores, e.g. adds a LoRA adapter
    (:meth:`trainer.lora.PeftAdapter.apply_to`).

    Raises:
        ScoreInputError: the token file is malformed or holds an id outside the vocabulary.
        HFConfigError: the model is unsupported, or its sequences are longer than
            ``max_position_embeddings`` + 1.
        HFWeightsError: see :func:`read_weights`.
    """
    tokens = read_token_file(tokens_file)
    cfg = model_config(model_dir, seq_len=tokens.shape[1] - 1)
    if int(tokens.max()) >= cfg.vocab_size:
        raise ScoreInputError(
            f"{tokens_file}: token id {int(tokens.max())} is outside the model's vocabulary "
            f"(vocab_size {cfg.vocab_size})"
        )
    model = load_pretrained(model_dir, cfg)
    model = (model if adapt is None else adapt(model, cfg)).eval()
    total = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for chunk in torch.split(tokens, batch):
            loss = model(chunk[:, :-1], chunk[:, 1:])
            total += loss.double() * chunk[:, 1:].numel()
    count = tokens[:, 1:].numel()
    return float(total / count), count
