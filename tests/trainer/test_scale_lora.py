"""LoRA runs: MFU counts the FLOPs a frozen base does not spend, and weight decay falls on the
parameters transformers' Trainer decays."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import hf_tiny
import pytest
from peft import LoraConfig, get_peft_model
from transformers import Trainer

from trainer import cli, hf, hf_config, lora, metrics, optim
from trainer.loop import train

SEQ = hf_tiny.SEQ_LEN


def test_lora_mfu_counts_the_flops_done(model_data: Path, tmp_path: Path) -> None:
    """The tiny Llama (hidden 32, MLP 48, 2 layers, 4 heads of 8, 2 KV heads, untied 256-word
    head) with rank-4 adapters on q, k, v and o, counted by hand. Per layer: q and o 32x32, k and
    v 32x16, gate, up and down 32x48, two norms of 32: 7744; with the final norm and the head
    N_base = 2 * 7744 + 32 + 256 * 32 = 23712 (the input embedding is a lookup). Adapters per
    layer: A 4x32 for each of four, B 32x4, 16x4, 16x4, 32x4: 896, so N_t = 1792 and
    N = 25504. Attention: 12 * 2 * 32 * 16 = 12288. Forward 2N + activation gradients 2N +
    adapter gradients 2 N_t + attention = 117888 FLOPs per token (6N would be 165312)."""
    source = hf_tiny.model_dir(tmp_path, "llama")
    run = hf_tiny.run_args(source, model_data, tmp_path / "ck", lr="1e-3", max_steps="1")
    out = tmp_path / "m.jsonl"
    attention = ["--lora-targets", "q_proj,k_proj,v_proj,o_proj"]
    cfg = cli.train_config(cli._parser().parse_args([*run, "--lora-rank", "4", *attention]))
    train(dataclasses.replace(cfg, metrics=str(out), peak_flops=1e9))
    (record,) = metrics.read(out)
    assert record["mfu"] == pytest.approx(record["tokens_per_s"] * 117888 / 1e9, rel=1e-9)
    full = metrics.train_flops_per_token(
        matmul_params=23712, trained_params=23712, layers=2, width=32, seq_len=SEQ
    )
    assert full == 6 * 23712 + 12288


def test_weight_decay_falls_on_the_adapters_as_transformers_trainer_puts_it(
    tmp_path: Path,
) -> None:
    """transformers 5.23.0's Trainer decays every parameter but biases and norms; on a PEFT
    LoRA model (PEFT sets no decay of its own) that is every A and B matrix. Ours decay them too,
    and nothing else is trained."""
    theirs = hf_tiny.build("qwen2")
    peft_model = get_peft_model(theirs, LoraConfig(r=4, target_modules=list(lora.TARGETS)))
    trained = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    decayed = set(Trainer.get_decay_parameter_names(None, peft_model))  # type: ignore[arg-type]
    assert trained and trained <= decayed

    source = hf_tiny.save(hf_tiny.build("qwen2"), tmp_path / "m")
    cfg = hf_config.model_config(source, seq_len=SEQ)
    model = lora.apply(hf.load_pretrained(source, cfg), cfg, lora.LoraSpec(4, 8.0, lora.TARGETS))
    opt = optim.build(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    names = {id(p): n for n, p in model.named_parameters()}
    ours = {names[id(p)] for g in opt.param_groups if g["weight_decay"] for p in g["params"]}
    assert ours == {n for n, p in model.named_parameters() if p.requires_grad}
    assert len(ours) == len(trained) == 2 * 7 * 2
