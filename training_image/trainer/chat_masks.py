"""Where a chat template puts each assistant turn, for templates without ``{% generation %}``
blocks: the character spans of a conversation's rendering that ``prepare-data`` trains.

A turn's span is what the template renders for that assistant message in the full
conversation, from just after the generation prompt (the role header that
``add_generation_prompt`` adds) through its end-of-turn marker, without the whitespace after
the marker. Three rules find it, the first that holds for every assistant turn wins:

1. Prefixes. Rendered up to the turn's prompt (``P``, with the generation prompt) and up to the
   turn itself (``U``), the conversation continues ``P`` with ``U`` and ``U`` with the full
   rendering: the span is ``U`` less ``P``. Llama 3's and Mistral's templates without a system
   message hold to it, as do most.
2. Location, for templates whose rendering of a turn depends on what follows it (Qwen3's drops
   the think block of every assistant turn before the last user message; Mistral's puts the
   system message into the last user message only). The turn starts where the hand-over from
   the message before it ends: that message's text followed by what the template renders
   between it and the assistant's output (read from ``P``), found in the full rendering after
   the previous turn. The turn is the longest end of its rendering in ``U`` (from the same
   hand-over) that the full rendering holds at that start, and at least the template's
   end-of-turn marker and one more character: a head that only the last turn gets (Qwen3's
   think block) is left out where the full rendering leaves it out.
3. Generation prompt head, for templates whose generation prompt opens more than an assistant
   turn renders (DeepSeek-V3's and R1's: their assistant marker then ``<think>\\n``, Nemotron 3's
   ``assistant\\n<think>\\n`` before a turn rendered ``<think></think>answer``) and whose turns are
   otherwise rendered as rule 1 has them. The turn starts where its rendering ``U`` departs from
   the generation prompt ``P``: the span is ``U`` less the longest common start of ``U`` and
   ``P``, which must hold more than the earlier messages' rendering and end with whitespace or a
   marker's closing ``>`` or ``]``, so that no role header is trained in part.

Where no rule finds every turn, :func:`last_turn` finds the last one alone (a conversation
of one turn needs no more); the caller says how many conversations it trained that way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Message = dict[str, Any]
Span = tuple[int, int]
# Renders messages (with the generation prompt when the flag is set) to text; raises
# TemplateFailure where the template refuses them.
Render = Callable[[Sequence[Message], bool], str]
# How many characters of the message before a turn identify it in a rendering: its last ones,
# which a template keeps where it changes a message's head (a system prompt put in front).
ANCHOR_CHARS = 32
# A conversation whose assistant text is found again in its rendering: what follows it there is
# the template's end-of-turn marker.
_PROBE_TEXT = "q7Zx"
_PROBE = [{"role": "user", "content": "p"}, {"role": "assistant", "content": _PROBE_TEXT}]
# Where a generation prompt's head may end for rule 3: whitespace, or a marker's closing bracket.
_SEAMS = (">", "]", " ", "\n", "\t")


class TemplateFailure(ValueError):
    """The chat template refused to render the messages (its ``raise_exception``)."""


def assistant_turns(messages: Sequence[Message], render: Render) -> tuple[str, list[Span]] | None:
    """The full rendering of ``messages`` and the span of each assistant turn in it, by the
    first rule of the module's (in their order) that finds them all; None when none does.

    Raises:
        TemplateFailure: the template refuses the conversation itself.
    """
    full = render(messages, False)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for rule in _RULES:
        spans = _all(rule, messages, render, full, turns)
        if spans is not None:
            return full, spans
    return None


def last_turn(messages: Sequence[Message], render: Render) -> tuple[str, list[Span]] | None:
    """The rendering of ``messages`` up to their last assistant turn and that turn's span, by
    the first rule that finds it; None when none does (or there is no assistant turn).

    Raises:
        TemplateFailure: the template refuses those messages.
    """
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        return None
    upto = messages[: last + 1]
    full = render(upto, False)
    for rule in _RULES:
        spans = _all(rule, upto, render, full, [last])
        if spans is not None:
            return full, spans
    return None


def _all(
    rule: Callable[[Sequence[Message], Render, str, int, int], Span | None],
    messages: Sequence[Message],
    render: Render,
    full: str,
    turns: list[int],
) -> list[Span] | None:
    spans: list[Span] = []
    for i in turns:
        try:
            span = rule(messages, render, full, i, spans[-1][1] if spans else 0)
        except TemplateFailure:
            return None
        if span is None:
            return None
        spans.append(span)
    return spans


def _by_prefixes(
    messages: Sequence[Message], render: Render, full: str, i: int, after: int
) -> Span | None:
    prompt = render(messages[:i], True) if i else ""
    upto = render(messages[: i + 1], False)
    if not (upto.startswith(prompt) and full.startswith(upto)) or len(prompt) < after:
        return None
    return len(prompt), len(upto.rstrip())


def _by_location(
    messages: Sequence[Message], render: Render, full: str, i: int, after: int
) -> Span | None:
    if i == 0:
        return None
    anchor = str(messages[i - 1].get("content") or "").rstrip()[-ANCHOR_CHARS:]
    prompt = render(messages[:i], True)
    at = prompt.rfind(anchor) if anchor else -1
    if at < 0:
        return None
    handover = anchor + prompt[at + len(anchor) :]
    upto = render(messages[: i + 1], False)
    own = upto.rfind(handover)
    if own < 0:
        return None
    turn = upto[own + len(handover) :].rstrip()
    least = min(len(turn), len(_end_marker(render)) + 1)
    found = full.find(handover, after)
    while found >= 0:
        start = found + len(handover)
        for cut in range(len(turn) - least + 1):
            if full.startswith(turn[cut:], start):
                return start, start + len(turn) - cut
        found = full.find(handover, found + 1)
    return None


def _by_prompt_head(
    messages: Sequence[Message], render: Render, full: str, i: int, after: int
) -> Span | None:
    if i == 0:
        return None
    before = render(messages[:i], False)
    prompt = render(messages[:i], True)
    upto = render(messages[: i + 1], False)
    if not (prompt.startswith(before) and upto.startswith(before) and full.startswith(upto)):
        return None
    head = prompt[: _common_start(prompt, upto)]
    start, end = len(head), len(upto.rstrip())
    # No part of the generation prompt in the turn's rendering (its header would be trained), or
    # a head that ends inside a marker or a word (``<|`` of ``<|user|>`` and ``<|assistant|>``).
    if not len(before) < start < end or start < after or not head.endswith(_SEAMS):
        return None
    return start, end


_RULES = (_by_prefixes, _by_location, _by_prompt_head)


def _common_start(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` share from their start."""
    return next(
        (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _end_marker(render: Render) -> str:
    """What the template renders after an assistant's text in a probe conversation, without
    trailing whitespace; empty where the probe cannot be rendered."""
    try:
        text = render(_PROBE, False)
    except TemplateFailure:
        return ""
    at = text.rfind(_PROBE_TEXT)
    return text[at + len(_PROBE_TEXT) :].rstrip() if at >= 0 else ""
