"""Documents tokenized with a model's own tokenizer, for ``trn-train prepare-data --tokenizer``.

The tokenizer is loaded from a local model directory with ``transformers.AutoTokenizer`` (the
``tokenizer.json`` of the ``tokenizers`` library, with ``tokenizer_config.json`` for the special
tokens and the chat template). Three input formats:

- ``text``: the whole file is one document.
- ``jsonl``: one document per line, its ``text`` field.
- ``chat``: one conversation per line, its ``messages`` list (``role`` and ``content``), rendered
  with the tokenizer's chat template; only assistant tokens are trained (the loss mask).

Documents are tokenized as the tokenizer does by default (``add_special_tokens=True``: a BOS
where the model's tokenizer adds one) and each is followed by the EOS token; a chat rendering
holds the template's own special tokens, and gets the EOS only when it does not already end
with it.

Finding the assistant tokens of a conversation: a template with ``{% generation %}`` blocks is
asked directly (``apply_chat_template(..., return_assistant_tokens_mask=True)``). Otherwise
:mod:`trainer.chat_masks` finds each assistant turn in the rendering of the whole conversation
(what the template renders for that message there, through its end-of-turn marker), also under
templates that render a turn differently when more follows it (Qwen3's drops earlier turns'
reasoning); the tokens whose characters start inside a turn are trained (character offsets, so
a merge across the boundary cannot shift the span). Where no rule finds every turn, the last one
alone is trained and ``prepare-data`` prints one warning with the count of such conversations;
where not even that is found, the line is refused.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer import chat_masks
from trainer.config import MODEL_SEQ_LEN
from trainer.packing import CutReport, cut_report, kept_length

FORMATS = ("auto", "text", "jsonl", "chat")
# A JSON object's field that marks a JSON-lines file as chat, and as documents.
SHAPES = {"messages": "chat", "text": "jsonl"}
ROLES = ("system", "user", "assistant", "tool")
_GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")


# The files of a model directory that make its tokenizer, in the formats transformers reads
# (the fast tokenizer, its config and special tokens, SentencePiece, BPE and WordPiece (BERT's
# vocab.txt) vocabularies, the chat template): their bytes are the tokenizer's identity.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.txt",
)


class InputError(ValueError):
    """Input that cannot be tokenized; the message names the file, the line and the field."""


def tokenizer_sha256(directory: str | Path) -> str | None:
    """The SHA-256 over the name and bytes of each of :data:`TOKENIZER_FILES` that
    ``directory`` holds, in that order; None when it holds none of them."""
    h = hashlib.sha256()
    found = False
    for name in TOKENIZER_FILES:
        path = Path(directory) / name
        if path.is_file():
            h.update(name.encode() + b"\0" + path.read_bytes())
            found = True
    return h.hexdigest() if found else None


def check_data_for_model(data_dir: str | Path, model_dir: str | Path) -> None:
    """Refuses data that ``model_dir``'s model cannot train on: the byte corpus, data made
    with another tokenizer (another :func:`tokenizer_sha256`), or a model directory without
    tokenizer files to check against.

    Raises:
        ValueError: naming the data's tokenizer and the model's.
    """
    from trainer import data

    manifest = json.loads((Path(data_dir) / data.MANIFEST).read_text())
    name = manifest.get("tokenizer")
    prepare = f"prepare it with `trn-train prepare-data --tokenizer {model_dir} --input FILE`"
    if name == data.BYTE_TOKENIZER:
        raise ValueError(
            f"--data {data_dir} is the byte corpus (tokenizer {name}, prepare-data without "
            f"--tokenizer): --model {model_dir} reads its own tokenizer's ids; {prepare}"
        )
    theirs = tokenizer_sha256(model_dir)
    if theirs is None:
        raise ValueError(
            f"--model {model_dir} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, "
            f"...): the tokenizer of --data {data_dir} ({name}) cannot be checked against it"
        )
    ours = manifest.get("tokenizer_sha256")
    if ours != theirs:
        raise ValueError(
            f"--data {data_dir} was tokenized with {name} (tokenizer files sha256 "
            f"{str(ours)[:12]}), --model {model_dir} has another tokenizer (sha256 "
            f"{theirs[:12]}): {prepare}"
        )


@dataclass(frozen=True)
class Document:
    """One document's token ids and, for chat, its loss mask (1: trained); ``mask`` is None
    when every token is trained."""

    tokens: np.ndarray
    mask: np.ndarray | None = None


class HfTokenizer:
    """A model directory's tokenizer: ids, EOS, vocabulary size and an identity for manifests.
    ``needs_eos`` (default True): documents are separated by EOS, so the tokenizer must have
    one; classification (one document a row) reads no EOS, and an encoder's tokenizer (BERT's)
    has none, so its :attr:`eos_id` may be None.

    Raises:
        InputError: the directory holds no loadable tokenizer, or the tokenizer has no EOS token
            and ``needs_eos``.
    """

    def __init__(self, directory: str | Path, *, needs_eos: bool = True) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise InputError(f"--tokenizer {str(directory)!r} is not a directory")
        from transformers import AutoTokenizer  # seconds to import: after the cheap check

        try:
            self.tok: Any = AutoTokenizer.from_pretrained(
                str(self.directory), local_files_only=True
            )
        except (OSError, ValueError) as error:
            raise InputError(
                f"--tokenizer {str(directory)!r}: no tokenizer loads from it ({error})"
            ) from error
        eos = self.tok.eos_token_id
        if eos is None and needs_eos:
            raise InputError(
                f"--tokenizer {str(directory)!r} has no EOS token (eos_token in "
                "tokenizer_config.json); documents are separated by it"
            )
        self.eos_id: int | None = None if eos is None else int(eos)
        self.vocab_size = len(self.tok)
        # Conversations of which only the last assistant turn was found (see :meth:`chat`).
        self.last_turn_only = 0

    @property
    def identity(self) -> dict[str, object]:
        """What the manifest records of the tokenizer: ``tokenizer`` (``hf:<directory name>``),
        ``tokenizer_sha256`` (:func:`tokenizer_sha256` of its directory) and
        ``special_tokens`` (transformers' ``special_tokens_map``: BOS, EOS, PAD ... by name);
        the vocabulary size is recorded beside them."""
        return {
            "tokenizer": f"hf:{self.directory.name}",
            "tokenizer_sha256": tokenizer_sha256(self.directory),
            "special_tokens": dict(self.tok.special_tokens_map),
        }

    @property
    def eos(self) -> int:
        """The EOS id, which a tokenizer opened with ``needs_eos`` (the default) has."""
        assert self.eos_id is not None, "a tokenizer opened with needs_eos=False has no EOS"
        return self.eos_id

    def text(self, text: str) -> Document:
        ids = self.tok(text)["input_ids"]
        return Document(np.asarray([*ids, self.eos], dtype=np.int64))

    def chat(self, messages: list[dict[str, str]], where: str) -> Document:
        """The conversation rendered with the chat template, its assistant turns trained: as
        the template's ``{% generation %}`` blocks mark them, else as
        :mod:`trainer.chat_masks` finds them (counting in :attr:`last_turn_only` the
        conversations of which it finds only the last turn).

        Raises:
            InputError: no chat template, a template that refuses the conversation, or one under
                which no rule finds even the last assistant turn; the message names ``where``.
        """
        template = self.tok.get_chat_template() if self.tok.chat_template else None
        if template is None:
            raise InputError(f"{where}: --tokenizer {self.directory} has no chat template")
        if _GENERATION_BLOCK.search(template):
            out = self.tok.apply_chat_template(
                messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        else:
            ids, mask = self._masked(*self._turns(messages, where))
        if not ids or ids[-1] != self.eos:
            ids, mask = [*ids, self.eos], [*mask, 0]
        return Document(np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.uint8))

    def _render(self, messages: Sequence[dict[str, Any]], prompt: bool) -> str:
        from jinja2.exceptions import TemplateError

        try:
            text: str = self.tok.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=prompt
            )
        except TemplateError as error:
            raise chat_masks.TemplateFailure(str(error)) from error
        return text

    def _turns(
        self, messages: list[dict[str, str]], where: str
    ) -> tuple[str, list[chat_masks.Span]]:
        try:
            found = chat_masks.assistant_turns(messages, self._render)
            if found is None:
                found = chat_masks.last_turn(messages, self._render)
                self.last_turn_only += found is not None
        except chat_masks.TemplateFailure as error:
            raise InputError(
                f"{where}: the chat template refuses the conversation ({error})"
            ) from None
        if found is None:
            raise InputError(
                f"{where}: no rule finds the assistant turns under this chat template, not even "
                "the last: it has no {% generation %} blocks, and neither its renderings of the "
                "conversation's prefixes nor its own rendering of the turns locate them"
            )
        return found

    def _masked(self, text: str, spans: list[chat_masks.Span]) -> tuple[list[int], list[int]]:
        """``text``'s token ids, and 1 for each token that starts inside a span."""
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = [
            int(any(lo <= start < hi for lo, hi in spans) and end > start)
            for start, end in enc["offset_mapping"]
        ]
        return list(enc["input_ids"]), mask


def _json_lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputError(f"{where}: not valid JSON ({error.msg})") from error
            if not isinstance(record, dict):
                raise InputError(f"{where}: expected a JSON object, got {type(record).__name__}")
            yield where, record


def _messages(where: str, record: dict[str, Any]) -> list[dict[str, str]]:
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InputError(f"{where}: field 'messages' must be a non-empty list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InputError(f"{where}: messages[{i}] must be an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise InputError(
                f"{where}: messages[{i}].role {role!r} is unknown; allowed: {', '.join(ROLES)}"
            )
        if not isinstance(message.get("content"), str):
            raise InputError(f"{where}: messages[{i}].content must be a string")
    return messages


def _shape(path: Path) -> tuple[str, str] | None:
    """The format the first non-blank line of ``path`` shows when it is a JSON object with a
    field of :data:`SHAPES` (``chat`` before ``jsonl``), and where; None otherwise."""
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                return None
            for field, shape in SHAPES.items():
                if isinstance(record, dict) and field in record:
                    return shape, f"line {number} is a JSON object with {field!r}"
            return None
    return None


def input_format(path: Path, fmt: str) -> tuple[str, str]:
    """The format to read ``path`` in and why: ``fmt``, or for ``auto`` ``chat`` when its first
    line is a JSON object with ``messages``, ``jsonl`` with ``text``, else ``text``.

    Raises:
        InputError: an unknown format, a missing file, or ``text`` for a file whose first line
            is such a JSON object (JSON lines tokenized as prose: the fields, quotes and escapes
            would be trained on).
    """
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r} is unknown; allowed: {', '.join(FORMATS)}")
    if not path.is_file():
        raise InputError(f"--input {str(path)!r} is not a file")
    shape = _shape(path)
    if fmt == "auto":
        return shape or ("text", "its first line is not a JSON object with 'messages' or 'text'")
    if fmt == "text" and shape is not None:
        raise InputError(
            f"--input {str(path)!r} looks like {shape[0]} JSON lines ({shape[1]}): give "
            f"--format {shape[0]} (or auto), not --format text"
        )
    return fmt, "--format"


def documents(tokenizer: HfTokenizer, path: Path, fmt: str) -> Iterator[Document]:
    """The documents of ``path`` in ``fmt`` (one of :data:`FORMATS`, see :func:`input_format`),
    tokenized.

    Raises:
        InputError: see :func:`input_format`; an empty file, a line that is not a JSON object,
            a missing ``text``/``messages`` field, an unknown role; the message names the line.
    """
    fmt, _ = input_format(path, fmt)
    if fmt == "text":
        text = path.read_text(encoding="utf-8")
        if not text.strip():
            raise InputError(f"--input {str(path)!r} is empty")
        yield tokenizer.text(text)
        return
    count = 0
    for where, record in _json_lines(path):
        count += 1
        if fmt == "jsonl":
            value = record.get("text")
            if not isinstance(value, str):
                raise InputError(f"{where}: field 'text' must be a string, got {value!r:.40}")
            yield tokenizer.text(value)
        else:
            yield tokenizer.chat(_messages(where, record), where)
    if not count:
        raise InputError(f"--input {str(path)!r} is empty (no JSON lines)")


def default_seq_len(tokenizer_dir: str | Path) -> int:
    """The sequence length `trn-train run --model` takes without ``--seq-len`` for the model
    whose tokenizer is in ``tokenizer_dir``: :data:`trainer.config.MODEL_SEQ_LEN`, capped at
    its ``config.json``'s ``max_position_embeddings`` where the directory has one."""
    path = Path(tokenizer_dir) / "config.json"
    try:
        limit = json.loads(path.read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        limit = None
    return min(MODEL_SEQ_LEN, limit) if isinstance(limit, int) and limit > 0 else MODEL_SEQ_LEN


def prepare(
    out: Path,
    tokenizer_dir: str | Path,
    input_path: Path,
    fmt: str,
    *,
    eval_fraction: float | None = None,
    eval_input: Path | None = None,
    seq_len: int = 0,
    shard_tokens: int = 1 << 24,
) -> dict[str, object]:
    """``trn-train prepare-data --tokenizer``: tokenizes ``input_path`` in ``fmt`` (``auto``:
    as :func:`input_format` finds it, said on stdout) with the tokenizer of ``tokenizer_dir``
    and writes the dataset under ``out`` (shards of ``shard_tokens``, default 16M); returns the
    manifest.

    ``text``: a token stream (format 2) whose held-out split is its tail, ``eval_fraction``
    (default 0.01) of the tokens. ``jsonl`` and ``chat``: whole examples (format 3); the
    held-out split is ``eval_input``'s examples, or else ``eval_fraction`` (default 0.01) of
    the examples (at least one; see :func:`trainer.data.split_examples`). Each split is checked
    at ``seq_len`` (default :func:`default_seq_len`): it must fill a row (a window of
    ``seq_len + 1`` tokens of a stream; one example kept by the cutting rule of
    :mod:`trainer.packing`), and the manifest records how many examples the rule cuts and drops
    (``cut_at_seq_len``).

    Raises:
        InputError: see :class:`HfTokenizer` and :func:`documents`; ``eval_input`` with
            ``text`` or with ``eval_fraction``.
        ValueError: ``eval_fraction`` outside [0, 0.5]; ``seq_len`` below 1; a split too
            small for a row at ``seq_len``.
    """
    from trainer import data

    found = input_format(input_path, fmt) if fmt == "auto" else None
    fmt = fmt if found is None else found[0]
    fraction = _checked_options(fmt, eval_input, eval_fraction, seq_len)
    tokenizer = HfTokenizer(tokenizer_dir)
    seq_len = seq_len or default_seq_len(tokenizer_dir)
    identity = {**tokenizer.identity, "eos_token_id": tokenizer.eos_id}
    if found is not None:
        print(f"prepare-data: --format auto: {input_path} is {found[0]} ({found[1]})")
    docs = _examples(tokenizer, input_path, fmt)
    if fmt == "text":
        _check_stream(docs, fraction, seq_len, shard_tokens)
        return data.write_split_dataset(
            out,
            docs,
            vocab_size=tokenizer.vocab_size,
            identity=identity,
            eval_fraction=fraction,
            shard_tokens=shard_tokens,
        )
    return _write_examples(
        out, docs, tokenizer, (eval_input, fmt), fraction, seq_len, shard_tokens, identity
    )


def _checked_options(
    fmt: str, eval_input: Path | None, eval_fraction: float | None, seq_len: int
) -> float:
    """The held-out fraction :func:`prepare` takes (``eval_fraction``, default 0.01), once its
    options are checked, before any tokenizing.

    Raises:
        InputError: ``eval_input`` with ``text`` or with ``eval_fraction``.
        ValueError: ``eval_fraction`` outside [0, 0.5]; ``seq_len`` below 0.
    """
    from trainer import data

    if eval_input is not None and (eval_fraction is not None or fmt == "text"):
        raise InputError(
            "--eval-input takes --format jsonl or chat, without --eval-fraction (its examples "
            "are the held-out split)"
        )
    fraction = 0.01 if eval_fraction is None else eval_fraction
    data.eval_tokens_for(0, fraction)
    if seq_len < 0:
        raise ValueError(f"--seq-len must be >= 1 (0: the model's default), got {seq_len}")
    return fraction


def _examples(
    tokenizer: HfTokenizer, path: Path, fmt: str
) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """The documents of ``path`` (see :func:`documents`), held in memory at the shards' dtype:
    the held-out split depends on every example."""
    from trainer import data

    dtype = data.dtype_for_vocab(tokenizer.vocab_size)
    return [(d.tokens.astype(dtype), d.mask) for d in documents(tokenizer, path, fmt)]


def _write_examples(
    out: Path,
    docs: list[tuple[np.ndarray, np.ndarray | None]],
    tokenizer: HfTokenizer,
    eval_source: tuple[Path | None, str],
    eval_fraction: float,
    seq_len: int,
    shard_tokens: int,
    identity: dict[str, object],
) -> dict[str, object]:
    """:func:`prepare` of examples: the held-out split (``eval_source``'s file of examples in
    its format, or else ``eval_fraction`` of ``docs``), each split checked at ``seq_len``, and
    the dataset written (see :func:`trainer.data.write_examples_dataset`).

    Raises:
        ValueError: every example of a split is dropped at ``seq_len``.
    """
    from trainer import data

    eval_input, fmt = eval_source
    if eval_input is None:
        train, held_out = data.split_examples(docs, eval_fraction)
    else:
        train, held_out = docs, _examples(tokenizer, eval_input, fmt)
    if tokenizer.last_turn_only:
        print(
            f"prepare-data: warning: {tokenizer.last_turn_only} of "
            f"{len(train) + len(held_out)} conversations: no rule finds each assistant turn "
            "under the chat template, only their last assistant turn is trained",
            file=sys.stderr,
        )
    reports = _checked_reports({"train": train, "eval": held_out}, seq_len)
    return data.write_examples_dataset(
        out,
        train,
        held_out,
        vocab_size=tokenizer.vocab_size,
        identity=identity,
        shard_tokens=shard_tokens,
        extra={
            "cut_at_seq_len": {
                "seq_len": seq_len,
                **{split: report.as_dict() for split, report in reports.items()},
            }
        },
    )


def _checked_reports(
    splits: dict[str, list[tuple[np.ndarray, np.ndarray | None]]], seq_len: int
) -> dict[str, CutReport]:
    """Each split's :class:`~trainer.packing.CutReport` at ``seq_len``.

    Raises:
        ValueError: every example of a split is dropped.
    """
    reports = {split: _cut_report(examples, seq_len) for split, examples in splits.items()}
    for split, report in reports.items():
        if report.examples and report.dropped == report.examples:
            raise ValueError(
                f"no {split} example fits a row of --seq-len {seq_len}: all {report.examples} "
                "are dropped (a conversation whose first reply ends past seq_len is dropped); "
                "give a longer --seq-len or more examples"
            )
    return reports


def _cut_report(examples: list[tuple[np.ndarray, np.ndarray | None]], seq_len: int) -> CutReport:
    lengths = np.asarray([tokens.size for tokens, _ in examples], dtype=np.int64)
    kept = np.asarray(
        [kept_length(tokens.size, mask, seq_len) for tokens, mask in examples], dtype=np.int64
    )
    return cut_report(lengths, kept, seq_len)


def _check_stream(
    docs: list[tuple[np.ndarray, np.ndarray | None]],
    eval_fraction: float,
    seq_len: int,
    shard_tokens: int,
) -> None:
    """Refuses a stream whose training split, or held-out split when there is one, has no
    shard of a window (``seq_len + 1`` tokens)."""
    from trainer import data

    total = sum(tokens.size for tokens, _ in docs)
    train = data.split_point([tokens.size for tokens, _ in docs], eval_fraction)
    window = seq_len + 1
    for split, tokens in (("training", train), ("held-out", total - train)):
        if (tokens or split == "training") and min(tokens, shard_tokens) < window:
            raise ValueError(
                f"the {split} split has {tokens} tokens in its largest shard, fewer than a "
                f"window of --seq-len {seq_len} + 1 = {window}; give more text, a shorter "
                "--seq-len, or (for the held-out split) a larger --eval-fraction"
            )
