"""Multi-turn chat under templates that behave like Qwen3's, Llama 3's and Mistral's
(tests/trainer/chat_templates.py): every assistant turn is trained, exactly the tokens the
template renders for it in the full conversation; where no rule finds them all, the last turn
alone, with a warning that counts the conversations."""

from __future__ import annotations

import json
from pathlib import Path

import chat_templates
import numpy as np
import pytest
import tiny_tokenizer

from trainer import chat_masks, tokenizing

CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello there"},
    {"role": "assistant", "content": "<think>why</think>hi friend"},
    {"role": "user", "content": "bye"},
    {"role": "assistant", "content": "<think>because so</think>bye now"},
]
# The same without reasoning, for templates that render an assistant's content as it is.
PLAIN = [{**m, "content": m["content"].split("</think>")[-1]} for m in CONVERSATION]


def _trained(template: str, tmp_path: Path, messages: list[dict[str, str]], **kw: str) -> list[str]:
    """The tokens ``prepare-data`` trains of ``messages`` under ``template``, by name."""
    tok = tokenizing.HfTokenizer(tiny_tokenizer.build(tmp_path / "tok", template=template, **kw))
    doc = tok.chat(messages, "line 1")
    assert doc.mask is not None
    names = {i: t for t, i in tiny_tokenizer.VOCAB.items()}
    return [names[int(t)] for t in doc.tokens[doc.mask.astype(bool)]]


def test_qwen3_like_trains_each_turn_as_the_full_conversation_renders_it(tmp_path: Path) -> None:
    """The earlier turn without its reasoning (the template drops it there), the last with its
    think block; each through its <|im_end|>."""
    assert _trained(chat_templates.QWEN3_LIKE, tmp_path, CONVERSATION) == (
        [
            "hi",
            "friend",
            "<|im_end|>",
            "<think>",
            "because",
            "so",
            "</think>",
            "bye",
            "now",
            "<|im_end|>",
        ]
    )


def test_llama3_like_trains_each_turn_through_eot(tmp_path: Path) -> None:
    trained = _trained(chat_templates.LLAMA3_LIKE, tmp_path, PLAIN, bos="<|begin_of_text|>")
    assert trained == ["hi", "friend", "<|eot_id|>", "bye", "now", "<|eot_id|>"]


def test_mistral_like_trains_each_turn_with_its_eos(tmp_path: Path) -> None:
    """The system message goes into the last user message only: no prefix of the conversation
    renders as the start of the whole."""
    assert _trained(chat_templates.MISTRAL_LIKE, tmp_path, PLAIN) == (
        ["hi", "friend", "</s>", "bye", "now", "</s>"]
    )


@pytest.mark.parametrize(
    ("template", "trained"),
    [
        (chat_templates.DEEPSEEK_LIKE, ["hi", "friend", "</s>", "bye", "now", "</s>"]),
        (
            chat_templates.NEMOTRON3_LIKE,
            ["</think>", "hi", "friend", "<|im_end|>", "</think>", "bye", "now", "<|im_end|>"],
        ),
    ],
    ids=["deepseek-v3-like", "nemotron-3-like"],
)
def test_a_generation_prompt_that_opens_a_think_block_trains_each_turn_after_its_header(
    template: str, trained: list[str], tmp_path: Path
) -> None:
    """The generation prompt ends with a think opener that no turn renders there: each turn is
    trained from where its rendering departs from the prompt, its role header left out (before
    rule 3, prepare-data refused every such conversation)."""
    assert _trained(template, tmp_path, PLAIN) == trained


@pytest.mark.parametrize(
    "template", [chat_templates.QWEN3_LIKE, chat_templates.LLAMA3_LIKE, chat_templates.MISTRAL_LIKE]
)
def test_the_mask_marks_whole_assistant_turns_only(template: str, tmp_path: Path) -> None:
    """One run of trained tokens per assistant turn, each ending on the turn's end marker, and
    no token of a system or user message trained: what truncation by turns relies on."""
    tok = tokenizing.HfTokenizer(
        tiny_tokenizer.build(tmp_path / "tok", template=template, bos="<|begin_of_text|>")
    )
    doc = tok.chat(PLAIN + PLAIN[1:], "line 1")
    assert doc.mask is not None
    edges = np.flatnonzero(np.diff(np.concatenate([[0], doc.mask, [0]])))
    runs = list(zip(edges[::2], edges[1::2], strict=True))
    assert len(runs) == 4
    ends = {tiny_tokenizer.VOCAB[t] for t in ("<|im_end|>", "<|eot_id|>", "</s>")}
    assert all(int(doc.tokens[end - 1]) in ends for _, end in runs)
    user_words = {tiny_tokenizer.VOCAB[w] for w in ("hello", "there", "be", "brief")}
    assert not user_words & set(doc.tokens[doc.mask.astype(bool)].tolist())


def test_without_a_rule_for_every_turn_the_last_is_trained_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A template that renders only the last two messages: the earlier turn is not in the
    rendering at all, so only the last one is trained; prepare-data says so once, counted."""
    tok_dir = tiny_tokenizer.build(tmp_path / "tok", template=tiny_tokenizer.TEMPLATE_LAST_TWO)
    lines = [json.dumps({"messages": PLAIN}), json.dumps({"messages": PLAIN[:3]})]
    (tmp_path / "chat.jsonl").write_text("\n".join(lines * 2) + "\n")
    tokenizing.prepare(tmp_path / "out", tok_dir, tmp_path / "chat.jsonl", "chat", eval_fraction=0)
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "2 of 4 conversations" in err and "only their last assistant turn is trained" in err
    tok = tokenizing.HfTokenizer(tok_dir)
    doc = tok.chat(PLAIN, "line 1")
    assert doc.mask is not None
    names = {i: t for t, i in tiny_tokenizer.VOCAB.items()}
    assert [names[int(t)] for t in doc.tokens[doc.mask.astype(bool)]] == ["bye", "now", "<|end|>"]


def test_a_template_no_rule_fits_is_refused_by_line(tmp_path: Path) -> None:
    """A generation prompt that is not how the template renders an assistant turn (a user
    marker): neither the prefixes nor the hand-over to the assistant are in the rendering."""
    template = tiny_tokenizer.TEMPLATE_PLAIN.replace(
        "{% if add_generation_prompt %}<|assistant|> ", "{% if add_generation_prompt %}<|user|> "
    )
    tok_dir = tiny_tokenizer.build(tmp_path / "tok", template=template)
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": PLAIN}) + "\n")
    with pytest.raises(tokenizing.InputError, match=r"chat.jsonl:1: no rule finds the assistant"):
        tokenizing.prepare(tmp_path / "out", tok_dir, tmp_path / "chat.jsonl", "chat")


def test_a_template_that_refuses_the_conversation_is_named(tmp_path: Path) -> None:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok", template=chat_templates.MISTRAL_LIKE)
    bad = [{"role": "user", "content": "hi"}, {"role": "user", "content": "bye"}]
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": bad}) + "\n")
    with pytest.raises(tokenizing.InputError, match=r"chat.jsonl:1: the chat template refuses"):
        tokenizing.prepare(tmp_path / "out", tok_dir, tmp_path / "chat.jsonl", "chat")


def test_the_location_rule_leaves_out_a_head_only_the_last_turn_gets() -> None:
    """The rule at the level of text: a turn rendered with a head when it is last ('[H]') is
    found without it where the full rendering leaves it out."""

    def render(messages: object, prompt: bool) -> str:
        turns = list(messages)  # type: ignore[call-overload]
        out = ""
        for k, m in enumerate(turns):
            if m["role"] == "assistant":
                head = "[H]" if k == len(turns) - 1 else ""
                out += f"A: {head}{m['content']}<e>\n"
            else:
                out += f"U: {m['content']}<e>\n"
        return out + ("A: " if prompt else "")

    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}] * 2
    full, spans = chat_masks.assistant_turns(messages, render)  # type: ignore[misc]
    assert [full[a:b] for a, b in spans] == ["y<e>", "[H]y<e>"]
