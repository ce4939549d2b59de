"""Tiny random Hugging Face models for the tests, built locally with transformers' own config and
model classes (nothing from the hub), saved with ``save_pretrained`` and a small tokenizer."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Before transformers and huggingface_hub read it: a test never reaches the hub.
os.environ["HF_HUB_OFFLINE"] = "1"

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertTokenizerFast,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

CLASSES: dict[str, tuple[Any, Any]] = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
}
SHAPE = {
    "vocab_size": 256,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
# Llama 3.1's RoPE scaling, with a pre-training context short enough that at head_dim 8 the
# four frequencies fall in all three bands (kept, blended, stretched).
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {{ eos_token }} {% endfor %}"
)


def build(arch: str, seed: int = 0, **overrides: Any) -> PreTrainedModel:
    """A transformers model of ``arch`` in FP32 with the tiny shape (``overrides`` on top),
    its weights drawn and then shifted by noise so that norms and biases are not all 1 or 0."""
    config_class, model_class = CLASSES[arch]
    torch.manual_seed(seed)
    model = model_class(config_class(**{**SHAPE, **overrides}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def save(model: PreTrainedModel, out: Path, **kwargs: Any) -> Path:
    """``model`` saved to ``out`` (``kwargs`` to save_pretrained) with a word-level tokenizer over
    the model's vocabulary ("w0" ... ) and a chat template."""
    model.save_pretrained(out, **kwargs)
    return save_tokenizer(out, model.config.vocab_size)


def save_tokenizer(out: Path, vocab_size: int = SHAPE["vocab_size"]) -> Path:
    """The tiny models' word-level tokenizer ("w0" ... "w<vocab_size - 1>", EOS "w1", a chat
    template) saved into ``out``; the same files for every model of one vocabulary size."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = {f"w{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "w1",
                "unk_token": "w0",
                "chat_template": CHAT_TEMPLATE,
            }
        )
    )
    return out


# BERT's special tokens, in the order of its vocab.txt: [PAD] is 0, [CLS] 2, [SEP] 3.
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BERT_SHAPE = {k: v for k, v in SHAPE.items() if k != "num_key_value_heads"}


def save_bert_tokenizer(out: Path, vocab_size: int = SHAPE["vocab_size"]) -> Path:
    """A WordPiece tokenizer as BERT's ([CLS] text [SEP], pad [PAD], no EOS) over BERT's special
    tokens and "w0" ... up to ``vocab_size`` ids, saved into ``out``."""
    vocab = {t: i for i, t in enumerate(BERT_SPECIALS)}
    vocab.update({f"w{i}": len(BERT_SPECIALS) + i for i in range(vocab_size - len(vocab))})
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    specials = dict(zip(("pad", "unk", "cls", "sep", "mask"), BERT_SPECIALS, strict=True))
    BertTokenizerFast(
        tokenizer_object=tok, **{f"{k}_token": v for k, v in specials.items()}
    ).save_pretrained(out)
    return out


def bert_dir(tmp_path: Path, seed: int = 0) -> Path:
    """A tiny BertForSequenceClassification (two classes, its weights drawn with ``seed`` and
    shifted by noise) with :func:`save_bert_tokenizer`'s tokenizer, in a new folder."""
    torch.manual_seed(seed)
    model = BertForSequenceClassification(BertConfig(**BERT_SHAPE, pad_token_id=0))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    out = tmp_path / f"bert-{seed}-{len(list(tmp_path.iterdir()))}"
    model.save_pretrained(out)
    return save_bert_tokenizer(out, model.config.vocab_size)


def model_dir(tmp_path: Path, arch: str = "llama", seed: int = 0, **overrides: Any) -> Path:
    """A saved tiny model of ``arch`` in a new folder of ``tmp_path``."""
    out = tmp_path / f"{arch}-{seed}-{len(list(tmp_path.iterdir()))}"
    return save(build(arch, seed, **overrides), out)


def hf_loss(model: PreTrainedModel, tokens: torch.Tensor) -> float:
    """transformers' own loss with ``labels=input_ids``."""
    with torch.no_grad():
        return float(model(input_ids=tokens, labels=tokens).loss)


SEQ_LEN = 16


def run_args(model: Path, data: Path, ck: Path, *extra: str, lr: str, max_steps: str) -> list[str]:
    """A CPU, eager ``trn-train run --model`` command line of ``SEQ_LEN`` tokens, micro batch 2,
    checkpointing into ``ck``; ``extra`` flags last (a repeated flag overrides)."""
    return [
        "run",
        "--model",
        str(model),
        "--data",
        str(data),
        "--device",
        "cpu",
        "--compile",
        "none",
        "--seq-len",
        str(SEQ_LEN),
        "--micro-batch",
        "2",
        "--lr",
        lr,
        "--max-steps",
        max_steps,
        "--checkpoint-dir",
        str(ck),
        "--no-progress",
        *extra,
    ]


def checkpoint_state(ck: Path, step: int) -> dict[str, object]:
    """The state of the checkpoint of ``step`` in ``ck``."""
    from trainer import checkpoint

    return checkpoint.Checkpointer(checkpoint.LocalStore(ck)).load(checkpoint.name_for(step))


def assert_resume_is_exact(
    command: Callable[[Path], list[str]], tmp_path: Path, last: int, killed_at: int
) -> None:
    """``command(ck)`` (a ``trn-train run`` checkpointing into ``ck``) run to step ``last``
    straight, and again as if killed after step ``killed_at``'s checkpoint and resumed: the
    model and optimizer states of step ``last`` are bit-identical."""
    from trainer import checkpoint, cli

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for ck in (straight, resumed):
        assert cli.main(command(ck)) == 0
    for step in range(killed_at + 1, last + 1):
        shutil.rmtree(resumed / checkpoint.name_for(step), ignore_errors=True)
    assert cli.main(command(resumed)) == 0

    a, b = checkpoint_state(straight, last), checkpoint_state(resumed, last)
    for key in ("model", "optimizer"):
        flat_a = torch.utils._pytree.tree_leaves(a[key])
        flat_b = torch.utils._pytree.tree_leaves(b[key])
        assert len(flat_a) == len(flat_b)
        for x, y in zip(flat_a, flat_b, strict=True):
            assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
