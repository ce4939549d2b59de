"""Safetensors weights in (single file, sharded with an index) and out (save_pretrained), checked
against transformers itself, and every weights error."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import hf_tiny
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from trainer import hf, hf_config, hf_export

SEQ = 16


def _tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (2, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def test_sharded_checkpoint_loads_like_the_single_file(tmp_path: Path) -> None:
    theirs = hf_tiny.build("qwen3", head_dim=12)
    single = hf_tiny.save(theirs, tmp_path / "single")
    sharded = hf_tiny.save(theirs, tmp_path / "sharded", max_shard_size="20KB")
    index = json.loads((sharded / hf.INDEX).read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert not (sharded / hf.SINGLE).exists()
    cfg = hf_config.model_config(single, seq_len=SEQ)
    one, many = hf.read_weights(single, cfg), hf.read_weights(sharded, cfg)
    assert one.keys() == many.keys()
    assert all(torch.equal(one[k], many[k]) for k in one)
    # The fused projections are the concatenations, in transformers' order.
    attn = theirs.model.layers[1].self_attn
    q, k, v = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight
    assert torch.equal(many["blocks.1.attn.qkv.weight"], torch.cat([q, k, v]))
    mlp = theirs.model.layers[0].mlp
    assert torch.equal(
        many["blocks.0.mlp.up.weight"], torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
    )


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("llama", {"tie_word_embeddings": True, "rope_parameters": hf_tiny.LLAMA3_ROPE}),
        ("qwen2", {}),
        ("qwen3", {"head_dim": 12}),
        ("mistral", {"head_dim": 16, "sliding_window": None}),
    ],
)
def test_saved_weights_load_in_transformers_with_our_loss(
    arch: str, overrides: dict[str, object], tmp_path: Path
) -> None:
    source = hf_tiny.save(hf_tiny.build(arch, **overrides), tmp_path / "in")
    raw = hf_config.read_config(source)
    cfg = hf_config.model_config(source, seq_len=SEQ)
    ours = hf.load_pretrained(source, cfg).eval()
    with torch.no_grad():  # a change, so that a file copied through would not pass
        for p in ours.parameters():
            p.mul_(1.01)
    written = hf_export.save_pretrained(
        ours.state_dict(), raw, tmp_path / "out", max_shard_bytes=30_000
    )
    assert hf.INDEX in written and "model-00001-of-" in written[0]
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    tokens = _tokens()
    with torch.no_grad():
        our_loss = float(ours(tokens[:, :-1], tokens[:, 1:]))
    assert abs(hf_tiny.hf_loss(theirs, tokens) - our_loss) / our_loss <= 1e-4
    # A tied head is not written (transformers ties it on load), an untied one is.
    names = json.loads((tmp_path / "out" / hf.INDEX).read_text())["weight_map"]
    assert ("lm_head.weight" in names) == (not cfg.tie_embeddings)


def test_export_dtype_follows_the_config_unless_asked(tmp_path: Path) -> None:
    source = hf_tiny.save(hf_tiny.build("llama").to(torch.bfloat16), tmp_path / "in")
    raw = hf_config.read_config(source)
    assert raw["dtype"] == "bfloat16"
    state = hf.read_weights(source, hf_config.model_config(source, seq_len=SEQ))
    hf_export.save_pretrained(state, raw, tmp_path / "auto")
    assert load_file(tmp_path / "auto" / hf.SINGLE)["lm_head.weight"].dtype == torch.bfloat16
    hf_export.save_pretrained(state, raw, tmp_path / "fp32", dtype="float32")
    assert load_file(tmp_path / "fp32" / hf.SINGLE)["lm_head.weight"].dtype == torch.float32
    assert json.loads((tmp_path / "fp32" / "config.json").read_text())["dtype"] == "float32"


def test_export_refuses_bad_arguments(tmp_path: Path) -> None:
    source = hf_tiny.model_dir(tmp_path)
    raw = hf_config.read_config(source)
    state = hf.read_weights(source, hf_config.model_config(source, seq_len=SEQ))
    with pytest.raises(ValueError, match=re.escape("max_shard_bytes must be >= 1, got 0")):
        hf_export.save_pretrained(state, raw, tmp_path / "a", max_shard_bytes=0)
    with pytest.raises(
        ValueError, match=re.escape("dtype 'int8' is not supported; allowed: auto, float32")
    ):
        hf_export.save_pretrained(state, raw, tmp_path / "a", dtype="int8")
    with pytest.raises(ValueError, match=f"export directory {re.escape(str(source))} is not empty"):
        hf_export.save_pretrained(state, raw, source)
    del state["norm.weight"]
    with pytest.raises(
        ValueError, match=re.escape("the checkpoint's model state lacks norm.weight")
    ):
        hf_export.save_pretrained(state, raw, tmp_path / "b")


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / hf.SINGLE)


def test_weight_errors_name_the_tensor_or_file(tmp_path: Path) -> None:
    source = hf_tiny.model_dir(tmp_path)
    cfg = hf_config.model_config(source, seq_len=SEQ)
    weights = _weights(source)

    extra = {**weights, "model.layers.0.mlp.extra.weight": torch.zeros(1)}
    save_file(extra, source / hf.SINGLE)
    with pytest.raises(
        hf.HFWeightsError,
        match=re.escape(
            "not part of the model config.json describes: model.layers.0.mlp.extra.weight"
        ),
    ):
        hf.read_weights(source, cfg)

    missing = {k: v for k, v in weights.items() if k != "model.norm.weight"}
    save_file(missing, source / hf.SINGLE)
    with pytest.raises(
        hf.HFWeightsError, match=re.escape("missing from the safetensors files: model.norm.weight")
    ):
        hf.read_weights(source, cfg)

    wrong = {**weights, "model.layers.1.self_attn.k_proj.weight": torch.zeros(8, 32)}
    save_file(wrong, source / hf.SINGLE)
    with pytest.raises(
        hf.HFWeightsError,
        match=re.escape(
            "tensor model.layers.1.self_attn.k_proj.weight has shape (8, 32), "
            "config.json implies (16, 32)"
        ),
    ):
        hf.read_weights(source, cfg)

    (source / hf.SINGLE).unlink()
    with pytest.raises(
        hf.HFWeightsError,
        match=re.escape("holds neither model.safetensors nor model.safetensors.index.json"),
    ):
        hf.read_weights(source, cfg)

    (source / hf.INDEX).write_text(
        json.dumps({"weight_map": {"model.norm.weight": "gone.safetensors"}})
    )
    with pytest.raises(
        hf.HFWeightsError, match=re.escape("names gone.safetensors, which is missing")
    ):
        hf.read_weights(source, cfg)
    (source / hf.INDEX).write_text("{}")
    with pytest.raises(hf.HFWeightsError, match=re.escape("unreadable weight_map")):
        hf.read_weights(source, cfg)


def test_old_rope_buffers_and_a_tied_head_copy_are_ignored(tmp_path: Path) -> None:
    source = hf_tiny.model_dir(tmp_path, tie_word_embeddings=True)
    weights = _weights(source)
    extra = {
        **weights,
        "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4),
        "lm_head.weight": weights["model.embed_tokens.weight"].clone(),
    }
    save_file(extra, source / hf.SINGLE)
    model = hf.load_pretrained(source, hf_config.model_config(source, seq_len=SEQ))
    assert model.head.weight is model.tok.weight


def test_fingerprint_tells_models_apart_and_is_stable(tmp_path: Path) -> None:
    """The same model saved twice, or copied elsewhere with new times, keeps its fingerprint (a
    resumed run finds its base wherever the directory lives); another seed, another config or
    one changed weight byte changes it."""
    a = hf_tiny.model_dir(tmp_path, seed=0)
    fingerprint = hf.fingerprint(a)
    assert re.fullmatch(r"[0-9a-f]{64}", fingerprint)
    assert hf.fingerprint(hf_tiny.model_dir(tmp_path, seed=0)) == fingerprint
    moved = shutil.copytree(a, tmp_path / "elsewhere" / "model")
    for path in moved.iterdir():
        os.utime(path, (0, 0))
    assert hf.fingerprint(moved) == fingerprint

    assert hf.fingerprint(hf_tiny.model_dir(tmp_path, seed=1)) != fingerprint
    config = json.loads((moved / "config.json").read_text())
    (moved / "config.json").write_text(json.dumps(config | {"rms_norm_eps": 1e-5}))
    assert hf.fingerprint(moved) != fingerprint
    shutil.copy(a / "config.json", moved / "config.json")
    weights = moved / hf.SINGLE
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0x01
    weights.write_bytes(bytes(raw))
    assert hf.fingerprint(moved) != fingerprint


def test_carried_files_are_the_config_and_tokenizer(tmp_path: Path) -> None:
    source = hf_tiny.model_dir(tmp_path)
    names = [p.name for p in hf.carried_files(source)]
    assert names == [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
