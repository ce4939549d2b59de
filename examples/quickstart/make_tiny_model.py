"""A tiny random Llama and two hundred made-up conversations, for fine-tuning on CPU offline.

Writes a Hugging Face model directory (``config.json``, ``model.safetensors``, a byte-level
``tokenizer.json`` with a chat template whose ``{% generation %}`` blocks mark the assistant's
replies) built with transformers' own classes, nothing from the hub, and a JSON-lines file of
conversations (one ``{"messages": [...]}`` per line) whose replies the model can learn: the sum
of two small numbers. The README's quickstart fine-tunes the one on the other with ``trn-train``.

Usage: python examples/quickstart/make_tiny_model.py OUT_DIR --chats CHATS.jsonl [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

# Before transformers and huggingface_hub read it: nothing here reaches the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM

SPECIAL = ["<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
# Each turn is its role marker, the content and <|end|>, the EOS token; the assistant's content
# and end marker sit in a {% generation %} block, which says which tokens to train.
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "<|assistant|>{% generation %}{{ m['content'] }}<|end|>{% endgeneration %}"
    "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def byte_tokenizer() -> Tokenizer:
    """A byte-level BPE tokenizer without merges: one token per byte (any text encodes), then
    the special tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL)
    return tokenizer


def write_model(out: Path, seed: int) -> None:
    """The model and its tokenizer, saved to ``out`` (created)."""
    tokenizer = byte_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.token_to_id("<|end|>"),
    )
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|end|>",
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def write_chats(path: Path, seed: int, count: int = 200) -> None:
    """``count`` conversations asking for the sum of two numbers under 50."""
    rng = random.Random(seed)
    with path.open("w") as out:
        for _ in range(count):
            a, b = rng.randrange(50), rng.randrange(50)
            messages = [
                {"role": "system", "content": "Answer with the number only."},
                {"role": "user", "content": f"What is {a} plus {b}?"},
                {"role": "assistant", "content": str(a + b)},
            ]
            out.write(json.dumps({"messages": messages}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the model directory to write (new or empty)")
    parser.add_argument("--chats", type=Path, required=True, help="the conversations to write")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"{args.out}: not empty; give a new or empty directory")
    write_model(args.out, args.seed)
    write_chats(args.chats, args.seed)
    print(f"model: {args.out}, conversations: {args.chats}")


if __name__ == "__main__":
    main()
