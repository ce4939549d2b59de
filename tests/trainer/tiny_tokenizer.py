"""A tiny word-level tokenizer built locally with ``tokenizers`` (nothing from the hub), saved as a
model directory: ``tokenizer.json`` plus a ``tokenizer_config.json`` that names the EOS token and
carries a chat template written here."""

from __future__ import annotations

import json
import os
from pathlib import Path

# Before transformers and huggingface_hub read it: a test never reaches the hub.
os.environ["HF_HUB_OFFLINE"] = "1"

from tokenizers import Tokenizer, models, pre_tokenizers

SPECIAL = ["[UNK]", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
_WORDS = (
    "be brief hello there hi friend bye now the cat sat on a mat dog ran far away and back "
    "what is two plus four six thanks you are welcome good morning night sun moon star"
)
WORDS = _WORDS.split()
# Markers of the templates in chat_templates.py (Qwen3's, Llama 3's and Mistral's), and the
# role names they write out; after the rest, so that the ids above stay as they are.
CHAT_SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "[INST]",
    "[/INST]",
]
CHAT_WORDS = ["system", "user", "assistant", "why", "because", "so"]
VOCAB = {token: i for i, token in enumerate([*SPECIAL, *WORDS, *CHAT_SPECIAL, *CHAT_WORDS])}

# Each turn: its role marker, the content, an end marker. The assistant's content and end marker
# inside {% generation %} (transformers' return_assistant_tokens_mask).
_TURN = "<|{{ m['role'] }}|> {{ m['content'] }} <|end|> "
_ASSISTANT_GENERATION = (
    "<|assistant|> {% generation %}{{ m['content'] }} <|end|>{% endgeneration %} "
)
_PROMPT = "{% if add_generation_prompt %}<|assistant|> {% endif %}"
TEMPLATE_GENERATION = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}"
    + _ASSISTANT_GENERATION
    + "{% else %}"
    + _TURN
    + "{% endif %}{% endfor %}"
    + _PROMPT
)
TEMPLATE_PLAIN = "{% for m in messages %}" + _TURN + "{% endfor %}" + _PROMPT
# Renders only the last two messages: a conversation is not a continuation of its prefixes.
TEMPLATE_LAST_TWO = "{% for m in messages[-2:] %}" + _TURN + "{% endfor %}" + _PROMPT


def ids(text: str) -> list[int]:
    """The ids of whitespace-separated tokens, by hand: what the tests expect."""
    return [VOCAB[t] for t in text.split()]


def build(
    directory: Path,
    *,
    template: str | None = TEMPLATE_GENERATION,
    eos: bool = True,
    bos: str = "<s>",
) -> Path:
    """Writes the tokenizer into ``directory`` (created) and returns it; ``template`` None: no
    chat template; ``eos`` False: no EOS token; ``bos`` the BOS token (default ``<s>``)."""
    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([*SPECIAL, *CHAT_SPECIAL])
    tok.save(str(directory / "tokenizer.json"))
    config: dict[str, object] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "[UNK]",
        "bos_token": bos,
    }
    if eos:
        config["eos_token"] = "</s>"
    if template is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return directory
