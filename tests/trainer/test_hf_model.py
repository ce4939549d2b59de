"""Hugging Face config.json to our model: parity with transformers (FP32 logits and loss) for the
four architectures and their variants, and every config validation message."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import hf_tiny
import pytest
import torch

from trainer import hf, hf_config
from trainer.config import PRESETS, ModelConfig, RopeScaling
from trainer.model import GPT

SEQ = 24
# (architecture, overrides): each variant the issue names is in at least one case.
CASES = {
    "llama-untied": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama3-rope-scaling": ("llama", {"rope_parameters": hf_tiny.LLAMA3_ROPE}),
    "llama-attention-bias": ("llama", {"attention_bias": True}),
    "llama-head-dim-12": ("llama", {"head_dim": 12}),
    "qwen2-biases": ("qwen2", {}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3-qk-norm": ("qwen3", {"head_dim": 12}),
    "qwen3-attention-bias": ("qwen3", {"head_dim": 12, "attention_bias": True}),
    "qwen3-tied-mha": (
        "qwen3",
        {"head_dim": 8, "num_key_value_heads": 4, "tie_word_embeddings": True},
    ),
    "mistral-head-dim-16": ("mistral", {"head_dim": 16, "sliding_window": None}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_loss_match_transformers(case: str, tmp_path: Path) -> None:
    arch, overrides = CASES[case]
    theirs = hf_tiny.build(arch, **overrides)
    path = hf_tiny.save(theirs, tmp_path / case)
    tokens = torch.randint(0, 256, (3, SEQ + 1), generator=torch.Generator().manual_seed(1))
    ours = hf.load_pretrained(path, hf_config.model_config(path, seq_len=SEQ)).eval()

    with torch.no_grad():
        their_logits = theirs(input_ids=tokens[:, :-1]).logits
        our_logits = ours.logits(tokens[:, :-1])
        our_loss = float(ours(tokens[:, :-1], tokens[:, 1:]))
    their_loss = hf_tiny.hf_loss(theirs, tokens)
    relative = abs(our_loss - their_loss) / their_loss
    # The parity figures, a JSON line per case: pytest -s -k logits_and_loss test_hf_model.py
    largest = float((our_logits - their_logits).abs().max())
    print(json.dumps({"case": case, "relative_loss_diff": relative, "max_logit_diff": largest}))
    torch.testing.assert_close(our_logits, their_logits, rtol=1e-4, atol=1e-4)
    assert relative <= 1e-4


def test_parity_cases_exercise_what_they_name(tmp_path: Path) -> None:
    """The variants change the model: without them the parity above would not test them."""
    cfgs = {
        case: hf_config.parse_config(hf_tiny.build(arch, **o).config.to_dict(), seq_len=SEQ)
        for case, (arch, o) in CASES.items()
    }
    assert cfgs["llama-tied"].tie_embeddings and not cfgs["llama-untied"].tie_embeddings
    assert cfgs["llama3-rope-scaling"].rope_scaling == RopeScaling(8.0, 1.0, 4.0, 16)
    assert cfgs["qwen2-biases"].qkv_bias and not cfgs["qwen2-biases"].out_bias
    assert cfgs["llama-attention-bias"].qkv_bias and cfgs["llama-attention-bias"].out_bias
    assert cfgs["qwen3-qk-norm"].qk_norm and cfgs["qwen3-qk-norm"].head_dim == 12
    assert cfgs["mistral-head-dim-16"].head_dim * 4 != 32
    assert cfgs["llama-untied"].kv_heads == 2 and cfgs["llama-untied"].n_head == 4
    # RoPE scaling moves the tables: the scaled and unscaled models differ.
    scaled = GPT(cfgs["llama3-rope-scaling"])
    plain = GPT(ModelConfig(**{**cfgs["llama3-rope-scaling"].__dict__, "rope_scaling": None}))
    assert not torch.equal(scaled.rope_cos, plain.rope_cos)


def test_presets_keep_their_shapes_and_norm() -> None:
    """The new fields default to what the presets had: same parameters, eps 1e-5, no q/k norm."""
    model = GPT(PRESETS["small"].model)
    assert model.num_params() == 10_844_160
    with torch.device("meta"):
        big = GPT(PRESETS["1b"].model)
    assert big.num_params() == 1_235_814_400
    assert big.blocks[0].attn.qkv.bias is None and big.blocks[0].attn.q_norm is None
    assert big.norm.eps == 1e-5


def test_loading_builds_on_meta_and_draws_no_random_init(tmp_path: Path) -> None:
    path = hf_tiny.model_dir(tmp_path)
    cfg = hf_config.model_config(path, seq_len=SEQ)
    before = torch.get_rng_state()
    model = hf.load_pretrained(path, cfg)
    assert torch.equal(torch.get_rng_state(), before)
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters())
    assert model.rope_cos.device.type == "cpu"


def test_bf16_checkpoint_loads_as_fp32(tmp_path: Path) -> None:
    theirs = hf_tiny.build("qwen2").to(torch.bfloat16)
    path = hf_tiny.save(theirs, tmp_path / "bf16")
    model = hf.load_pretrained(path, hf_config.model_config(path, seq_len=SEQ))
    assert model.tok.weight.dtype == torch.float32
    assert torch.equal(model.tok.weight, theirs.model.embed_tokens.weight.float())


def test_seq_len_defaults_to_2048_capped_at_max_positions(tmp_path: Path) -> None:
    raw = hf_tiny.build("llama").config.to_dict()
    assert hf_config.parse_config(raw).seq_len == 64
    assert hf_config.parse_config({**raw, "max_position_embeddings": 8192}).seq_len == 2048


def test_fields_left_out_take_the_architectures_defaults() -> None:
    """transformers' config classes' defaults: e.g. Qwen3's head_dim 128, Llama's eps 1e-6."""
    shape = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
    qwen3 = hf_config.parse_config({"architectures": ["Qwen3ForCausalLM"], **shape}, seq_len=8)
    assert (qwen3.head_dim, qwen3.vocab_size, qwen3.rope_theta) == (128, 151936, 10000.0)
    llama = hf_config.parse_config({"model_type": "llama", **shape}, seq_len=8)
    assert (llama.head_dim, llama.norm_eps, llama.tie_embeddings) == (16, 1e-6, False)
    # Older files: rope_scaling and a top-level rope_theta.
    old = {
        "model_type": "llama",
        **shape,
        "rope_theta": 500000.0,
        "rope_scaling": {k: v for k, v in hf_tiny.LLAMA3_ROPE.items() if k != "rope_theta"},
    }
    parsed = hf_config.parse_config(old, seq_len=8)
    assert parsed.rope_theta == 500000.0 and parsed.rope_scaling is not None


BASE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}
BAD = [
    (
        {"architectures": ["GPT2LMHeadModel"]},
        "architectures ['GPT2LMHeadModel'] is not supported; allowed: one of LlamaForCausalLM",
    ),
    ({"architectures": None, "model_type": "gemma"}, "model_type 'gemma' is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported; allowed: 'silu'"),
    ({"mlp_bias": True}, "mlp_bias True is not supported; allowed: false"),
    ({"num_experts": 8}, "num_experts 8: mixture-of-experts models are not supported"),
    ({"num_local_experts": 8}, "num_local_experts 8: mixture-of-experts"),
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quantization_config is set"),
    ({"attention_bias": "yes"}, "attention_bias must be true or false, got 'yes'"),
    (
        {"num_key_value_heads": 3},
        "num_attention_heads 4 must be a multiple of num_key_value_heads 3",
    ),
    (
        {"hidden_size": 30},
        "hidden_size 30 must be a multiple of num_attention_heads 4 when head_dim",
    ),
    ({"head_dim": 7}, "head_dim 7 must be even"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer, got 0"),
    ({"vocab_size": "many"}, "vocab_size must be a positive integer, got 'many'"),
    ({"rms_norm_eps": -1}, "rms_norm_eps must be a positive number, got -1"),
    (
        {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
        "rope_parameters.rope_type 'yarn' is not supported; allowed: 'default', 'llama3'",
    ),
    (
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
        "rope_scaling.rope_type 'linear' is not supported",
    ),
    (
        {"rope_parameters": {"rope_type": "llama3", "factor": 8.0}},
        "rope_parameters.low_freq_factor must be a positive number for rope_type 'llama3', "
        "got None",
    ),
    (
        {"rope_parameters": {**hf_tiny.LLAMA3_ROPE, "high_freq_factor": 1.0}},
        "high_freq_factor 1.0 must exceed low_freq_factor 1.0",
    ),
    (
        {"rope_parameters": {**hf_tiny.LLAMA3_ROPE, "original_max_position_embeddings": "8k"}},
        "original_max_position_embeddings must be a positive integer, got '8k'",
    ),
    (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 0}},
        "rope_theta must be a positive number, got 0",
    ),
    (
        {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
        "partial_rotary_factor 0.5 is not supported; allowed: 1.0",
    ),
    ({"rope_parameters": "default"}, "rope_parameters must be an object, got 'default'"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default"}}}, "nested per layer type"),
    (
        {"architectures": ["MistralForCausalLM"], "sliding_window": 16},
        "sliding_window 16 is active for seq_len 32: sliding-window attention is not "
        "supported; allowed: null, or at least seq_len (32)",
    ),
    (
        {
            "architectures": ["Qwen2ForCausalLM"],
            "use_sliding_window": True,
            "sliding_window": 16,
            "max_window_layers": 1,
            "num_hidden_layers": 2,
        },
        "sliding_window 16 is active for seq_len 32",
    ),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_unsupported_config_fields_are_named(change: dict[str, Any], message: str) -> None:
    with pytest.raises(hf_config.HFConfigError, match=re.escape(message)):
        hf_config.parse_config({**BASE, **change}, seq_len=32, source="m/config.json")


def test_bias_fields_count_only_where_transformers_reads_them() -> None:
    """Qwen2's and Mistral's attention and all but Llama's MLP ignore these fields."""
    qwen2 = hf_config.parse_config(
        {**BASE, "architectures": ["Qwen2ForCausalLM"], "attention_bias": False, "mlp_bias": True},
        seq_len=8,
    )
    assert (qwen2.qkv_bias, qwen2.out_bias) == (True, False)
    mistral = hf_config.parse_config(
        {**BASE, "architectures": ["MistralForCausalLM"], "attention_bias": True}, seq_len=8
    )
    assert (mistral.qkv_bias, mistral.out_bias) == (False, False)
    qwen3 = hf_config.parse_config(
        {**BASE, "architectures": ["Qwen3ForCausalLM"], "attention_bias": True}, seq_len=8
    )
    assert (qwen3.qkv_bias, qwen3.out_bias) == (True, True)


_MISTRAL = {**BASE, "architectures": ["MistralForCausalLM"]}
_QWEN2 = {**BASE, "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2}
_QWEN_WINDOW = {"sliding_window": 16, "use_sliding_window": True}


@pytest.mark.parametrize(
    ("plain", "inactive", "active"),
    [
        # A window at least as long as the sequence masks nothing; one shorter does.
        (_MISTRAL, {"sliding_window": 32}, {"sliding_window": 31}),
        (_MISTRAL, {"sliding_window": None}, {"sliding_window": 16}),
        # Qwen's window applies only with use_sliding_window...
        (_QWEN2, {"sliding_window": 16}, _QWEN_WINDOW | {"max_window_layers": 1}),
        # ...and only to layers from max_window_layers on, or those layer_types marks sliding.
        (_QWEN2, _QWEN_WINDOW | {"max_window_layers": 28}, _QWEN_WINDOW | {"max_window_layers": 1}),
        (
            _QWEN2,
            _QWEN_WINDOW | {"layer_types": ["full_attention", "full_attention"]},
            _QWEN_WINDOW | {"layer_types": ["full_attention", "sliding_attention"]},
        ),
    ],
)
def test_inactive_sliding_windows_are_accepted(
    plain: dict[str, Any], inactive: dict[str, Any], active: dict[str, Any]
) -> None:
    """An inactive window parses to the very model of the config without it; its active twin
    is refused."""
    assert hf_config.parse_config({**plain, **inactive}, seq_len=32) == hf_config.parse_config(
        plain, seq_len=32
    )
    with pytest.raises(
        hf_config.HFConfigError, match=r"sliding_window \d+ is active for seq_len 32"
    ):
        hf_config.parse_config({**plain, **active}, seq_len=32)


def test_seq_len_beyond_max_positions_and_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(
        hf_config.HFConfigError,
        match="seq_len 129 must be between 1 and max_position_embeddings 128",
    ):
        hf_config.parse_config(BASE, seq_len=129)
    with pytest.raises(hf_config.HFConfigError, match=r"model directory .*/absent does not exist"):
        hf_config.model_config(tmp_path / "absent")
    with pytest.raises(
        hf_config.HFConfigError, match=r"holds no config.json: not a Hugging Face model"
    ):
        hf_config.model_config(tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(
        hf_config.HFConfigError, match=r"is a PEFT adapter \(adapter_config.json, no"
    ):
        hf_config.model_config(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(
        hf_config.HFConfigError,
        match=re.escape("config.json: cannot read a Hugging Face model config"),
    ):
        hf_config.model_config(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(hf_config.HFConfigError, match="must hold a JSON object, got list"):
        hf_config.model_config(tmp_path)


def test_config_json_written_by_transformers_parses(tmp_path: Path) -> None:
    path = hf_tiny.model_dir(tmp_path, "qwen3", head_dim=12)
    raw = json.loads((path / "config.json").read_text())
    assert "rope_parameters" in raw  # transformers 5's layout, which the parser reads
    cfg = hf_config.model_config(path, seq_len=SEQ)
    assert (cfg.n_layer, cfg.d_model, cfg.d_ff, cfg.vocab_size) == (2, 32, 48, 256)
