"""`trn-train prepare-data --tokenizer`: text, JSONL and chat with a tokenizer built here, the chat
loss mask against hand-computed positions, the held-out split, the manifest, and every error."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import tiny_tokenizer
from tiny_tokenizer import ids

from trainer import data, tokenizing
from trainer.cli import main

CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello there"},
    {"role": "assistant", "content": "hi friend"},
    {"role": "user", "content": "bye"},
    {"role": "assistant", "content": "bye now"},
]
# The rendering, token by token (the template in tiny_tokenizer), then the EOS that ends the
# document: only the assistants' words and their end markers are trained.
RENDERED = (
    "<|system|> be brief <|end|> <|user|> hello there <|end|> "
    "<|assistant|> hi friend <|end|> <|user|> bye <|end|> <|assistant|> bye now <|end|> </s>"
)
TRAINED = [9, 10, 11, 16, 17, 18]


def _write_lines(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    "template", [tiny_tokenizer.TEMPLATE_GENERATION, tiny_tokenizer.TEMPLATE_PLAIN]
)
def test_chat_trains_only_assistant_tokens(tmp_path: Path, template: str) -> None:
    """With {% generation %} blocks (transformers' assistant mask) and without (prefix
    renderings): the same hand-computed positions."""
    tok = tokenizing.HfTokenizer(tiny_tokenizer.build(tmp_path / "tok", template=template))
    doc = tok.chat(CONVERSATION, "line 1")
    assert doc.tokens.tolist() == ids(RENDERED)
    assert doc.mask is not None
    assert np.flatnonzero(doc.mask).tolist() == TRAINED


def test_chat_dataset_carries_masks_eval_split_and_tokenizer_identity(tmp_path: Path) -> None:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    chat = _write_lines(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}] * 10)
    manifest = tokenizing.prepare(
        tmp_path / "out", tok_dir, chat, "chat", eval_fraction=0.1, shard_tokens=64
    )
    assert manifest["format_version"] == data.EXAMPLES_VERSION
    assert manifest["tokenizer"] == "hf:tok"
    assert (
        manifest["tokenizer_sha256"] == tokenizing.HfTokenizer(tok_dir).identity["tokenizer_sha256"]
    )
    assert manifest["vocab_size"] == len(tiny_tokenizer.VOCAB)
    assert manifest["eos_token_id"] == tiny_tokenizer.VOCAB["</s>"]
    assert manifest["masked"] is True
    # 10 conversations of 20 tokens, ceil(10%) = 1 held out; whole examples, at most 64 tokens
    # a shard: three conversations each.
    assert manifest["examples"] == {"train": 9, "eval": 1}
    assert [s["tokens"] for s in manifest["shards"]] == [60, 60, 60]  # type: ignore[index]
    assert [s["index"]["examples"] for s in manifest["shards"]] == [3, 3, 3]  # type: ignore[index]
    assert [s["tokens"] for s in manifest["eval_shards"]] == [20]  # type: ignore[index]

    dataset = data.open_dataset(tmp_path / "out")
    assert dataset.masks is not None and dataset.eval_split is not None
    assert dataset.num_examples == 9 and dataset.eval_split.num_examples == 1
    assert [np.asarray(i).tolist() for i in dataset.index or ()] == [[0, 20, 40, 60]] * 3
    stream = np.concatenate([np.asarray(s) for s in dataset.shards])
    masks = np.concatenate([np.asarray(m) for m in dataset.masks])
    assert stream.tolist() == ids(RENDERED) * 9
    assert np.flatnonzero(masks).tolist() == [t + 20 * i for i in range(9) for t in TRAINED]
    assert dataset.eval_split.masks is not None
    assert np.asarray(dataset.eval_split.shards[0]).tolist() == ids(RENDERED)
    assert np.flatnonzero(np.asarray(dataset.eval_split.masks[0])).tolist() == TRAINED
    # Every file the manifest names, with its hash, for whatever uploads the directory.
    names = {name for name, _ in data.dataset_files(manifest)}
    assert names == {p.name for p in (tmp_path / "out").iterdir()} - {"manifest.json"}
    assert any(name.endswith(".idx") for name in names)


def test_prepare_is_deterministic(tmp_path: Path) -> None:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    chat = _write_lines(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}] * 3)
    for out in ("a", "b"):
        tokenizing.prepare(tmp_path / out, tok_dir, chat, "chat", eval_fraction=0.2)
    for path in (tmp_path / "a").iterdir():
        assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes(), path.name


def test_jsonl_documents_are_separated_by_eos(tmp_path: Path) -> None:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    lines = _write_lines(
        tmp_path / "docs.jsonl", [{"text": "the cat sat"}, {"text": "a dog ran", "id": 7}]
    )
    (tmp_path / "docs.jsonl").write_text(lines.read_text() + "\n")  # a blank line is skipped
    manifest = tokenizing.prepare(tmp_path / "out", tok_dir, lines, "jsonl", eval_fraction=0)
    assert manifest["masked"] is False and manifest["eval_shards"] == []
    dataset = data.open_dataset(tmp_path / "out")
    assert dataset.masks is None and dataset.eval_split is None
    assert np.asarray(dataset.shards[0]).tolist() == ids("the cat sat </s> a dog ran </s>")


def test_text_is_one_document_split_at_the_tail(tmp_path: Path) -> None:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    words = "the cat sat on a mat and the dog ran far away and back " * 10
    (tmp_path / "t.txt").write_text(words)
    manifest = tokenizing.prepare(
        tmp_path / "out", tok_dir, tmp_path / "t.txt", "text", eval_fraction=0.05, seq_len=6
    )
    total = len(words.split()) + 1
    held_out = math.ceil(0.05 * total)
    assert [s["tokens"] for s in manifest["eval_shards"]] == [held_out]  # type: ignore[index]
    dataset = data.open_dataset(tmp_path / "out")
    assert dataset.eval_split is not None
    joined = [*np.asarray(dataset.shards[0]).tolist(), *np.asarray(dataset.eval_split.shards[0])]
    assert joined == ids(words + " </s>")


def test_cli_prepares_chat_and_says_what_it_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    chat = _write_lines(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}] * 4)
    out = tmp_path / "out"
    argv = ["prepare-data", "--tokenizer", str(tok_dir), "--input", str(chat)]
    argv += ["--format", "chat", "--eval-fraction", "0.25", "--seq-len", "16"]
    assert main([*argv, "--out", str(out)]) == 0
    # 4 conversations of 20 tokens, each cut after its first reply (token 12) at seq_len 16.
    assert capsys.readouterr().out.strip() == (
        f"wrote 1 shards, 3 examples (60 tokens), to {out}; held out 1 examples (20 tokens) "
        "for eval; at seq_len 16: 3 cut and 0 dropped of train, 1 cut and 0 dropped of eval"
    )
    assert data.open_dataset(out).masks is not None


def test_byte_corpus_without_tokenizer_is_unchanged(tmp_path: Path) -> None:
    """The byte path still writes a format-1 manifest with exactly its old fields."""
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_bytes(b"hello")
    assert (
        main(["prepare-data", "--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "o")]) == 0
    )
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert set(manifest) == {"format_version", "tokenizer", "vocab_size", "dtype", "shards"}
    assert manifest["format_version"] == 1 and manifest["tokenizer"] == data.BYTE_TOKENIZER
    assert manifest["shards"][0]["name"] == "shard_00000.bin"


def _chat_error(tmp_path: Path, line: str) -> str:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    (tmp_path / "in.jsonl").write_text(json.dumps({"messages": CONVERSATION}) + "\n" + line + "\n")
    with pytest.raises(tokenizing.InputError) as caught:
        tokenizing.prepare(tmp_path / "out", tok_dir, tmp_path / "in.jsonl", "chat")
    return str(caught.value)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"messages": [', r"in.jsonl:2: not valid JSON"),
        ("[1, 2]", r"in.jsonl:2: expected a JSON object, got list"),
        ('{"text": "hi"}', r"in.jsonl:2: field 'messages' must be a non-empty list"),
        ('{"messages": []}', r"in.jsonl:2: field 'messages' must be a non-empty list"),
        ('{"messages": ["hi"]}', r"in.jsonl:2: messages\[0\] must be an object"),
        (
            '{"messages": [{"role": "robot", "content": "hi"}]}',
            r"in.jsonl:2: messages\[0\].role 'robot' is unknown; allowed: system, user, "
            r"assistant, tool",
        ),
        ('{"messages": [{"role": "user"}]}', r"in.jsonl:2: messages\[0\].content must be a string"),
    ],
)
def test_bad_chat_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    assert re.search(message, _chat_error(tmp_path, line))


def test_missing_text_field_is_named(tmp_path: Path) -> None:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    docs = _write_lines(tmp_path / "d.jsonl", [{"text": "hi"}, {"body": "hi"}])
    with pytest.raises(tokenizing.InputError, match=r"d.jsonl:2: field 'text' must be a string"):
        tokenizing.prepare(tmp_path / "out", tok_dir, docs, "jsonl")


@pytest.mark.parametrize(("fmt", "content"), [("text", " \n"), ("jsonl", "\n\n"), ("chat", "")])
def test_empty_input_is_refused(tmp_path: Path, fmt: str, content: str) -> None:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    (tmp_path / "in").write_text(content)
    with pytest.raises(tokenizing.InputError, match=r"--input '.*in' is empty"):
        tokenizing.prepare(tmp_path / "out", tok_dir, tmp_path / "in", fmt)


def test_tokenizer_without_eos_is_refused(tmp_path: Path) -> None:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok", eos=False)
    with pytest.raises(tokenizing.InputError, match=r"--tokenizer '.*tok' has no EOS token"):
        tokenizing.HfTokenizer(tok_dir)


def test_tokenizer_without_chat_template_is_refused_for_chat(tmp_path: Path) -> None:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok", template=None)
    chat = _write_lines(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}])
    with pytest.raises(
        tokenizing.InputError, match=r"chat.jsonl:1: --tokenizer .* no chat template"
    ):
        tokenizing.prepare(tmp_path / "out", tok_dir, chat, "chat")


def test_missing_tokenizer_and_input_are_named(tmp_path: Path) -> None:
    with pytest.raises(tokenizing.InputError, match=r"--tokenizer '.*nothing' is not a directory"):
        tokenizing.HfTokenizer(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(tokenizing.InputError, match=r"--tokenizer '.*empty': no tokenizer loads"):
        tokenizing.HfTokenizer(tmp_path / "empty")
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    with pytest.raises(tokenizing.InputError, match=r"--input '.*absent.txt' is not a file"):
        tokenizing.prepare(tmp_path / "out", tok_dir, tmp_path / "absent.txt", "text")
    with pytest.raises(
        tokenizing.InputError, match=r"--format 'csv' is unknown; allowed: auto, text"
    ):
        list(tokenizing.documents(tokenizing.HfTokenizer(tok_dir), tmp_path / "x", "csv"))


@pytest.mark.parametrize("fraction", [-0.1, 0.6])
def test_eval_fraction_out_of_range_is_refused(tmp_path: Path, fraction: float) -> None:
    with pytest.raises(
        ValueError, match=rf"--eval-fraction must be between 0 and 0.5, got {fraction}"
    ):
        tokenizing.prepare(
            tmp_path / "out", tmp_path, tmp_path / "x", "text", eval_fraction=fraction
        )


def test_cli_refuses_mixed_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prepare-data", "--input", "x.txt", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "trn-train: error: --input needs --tokenizer (the byte corpus is --corpus)\n"
    )
    tok_dir = str(tiny_tokenizer.build(tmp_path / "tok"))
    assert main(["prepare-data", "--tokenizer", tok_dir, "--out", str(tmp_path / "o")]) == 2
    assert "trn-train: error: --tokenizer takes --input FILE" in capsys.readouterr().err
    bad = _write_lines(tmp_path / "bad.jsonl", [{"messages": [{"role": "bot", "content": ""}]}])
    argv = ["prepare-data", "--tokenizer", tok_dir, "--input", str(bad), "--format", "chat"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert "bad.jsonl:1: messages[0].role 'bot' is unknown" in capsys.readouterr().err


def test_the_held_out_split_falls_between_documents(tmp_path: Path) -> None:
    """30% of 200 tokens is 60, which would cut the last document (80 tokens); the split moves to
    the nearest boundary and holds that document out whole."""
    sizes = [30, 50, 40, 80]
    documents = [(np.full(n, i + 1, dtype=np.uint32), None) for i, n in enumerate(sizes)]
    identity = {"tokenizer": "t", "tokenizer_sha256": "0" * 64, "eos_token_id": 0}
    data.write_split_dataset(
        tmp_path, documents, vocab_size=10, identity=identity, eval_fraction=0.3
    )
    dataset = data.open_dataset(tmp_path)
    assert dataset.eval_split is not None
    assert np.asarray(dataset.eval_split.shards[0]).tolist() == [4] * 80
    assert np.asarray(dataset.shards[0]).tolist() == [1] * 30 + [2] * 50 + [3] * 40
    # The nearest boundary, the earlier one on a tie; one document is cut, as nothing else
    # leaves both sides tokens; a split that would hold out everything keeps the first document.
    assert data.split_point([20] * 10, 0.125) == 180
    assert data.split_point([400] * 5, 0.1) == 1600
    assert data.split_point([300], 0.5) == 150
    assert data.split_point([1000, 10], 0.5) == 1000
    assert data.split_point([5, 5], 0) == 10


def _chat(*replies: str, system: str = "be brief") -> dict[str, object]:
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    for reply in replies:
        messages += [{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply}]
    return {"messages": messages}


def test_prepare_reports_the_examples_cut_and_dropped_at_the_sequence_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """At seq_len 16 a conversation of two replies (19 tokens) keeps its first turn (11), one
    whose first reply ends past 16 is dropped, one that fits is kept whole; the counts come
    back in the manifest and the summary line."""
    rows = [_chat("bye now", "good night"), _chat("a " * 12), _chat("thanks")] * 2
    chat = _write_lines(tmp_path / "chat.jsonl", [*rows, _chat("thanks", "you are welcome")])
    argv = ["prepare-data", "--tokenizer", str(tiny_tokenizer.build(tmp_path / "tok"))]
    argv += ["--input", str(chat), "--format", "chat", "--seq-len", "16"]
    assert main([*argv, "--eval-fraction", "0", "--out", str(tmp_path / "out")]) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["cut_at_seq_len"] == {
        "seq_len": 16,
        "train": {"examples": 7, "cut": 3, "dropped": 2},
        "eval": {"examples": 0, "cut": 0, "dropped": 0},
    }
    assert capsys.readouterr().out.strip().endswith("at seq_len 16: 3 cut and 2 dropped of train")


@pytest.mark.parametrize(
    ("fmt", "lines", "held_out", "message"),
    [
        # The held-out conversation's first reply ends past seq_len 16.
        ("chat", [_chat("hi")] * 3, [_chat("a " * 12)], r"no eval example fits a row of"),
        ("chat", [_chat("a " * 12)] * 3, None, r"no train example fits a row of --seq-len 16"),
        ("text", None, None, r"the held-out split has \d+ tokens .* fewer than a window of"),
    ],
)
def test_a_split_too_small_for_a_row_is_refused_by_prepare_data(
    tmp_path: Path,
    fmt: str,
    lines: list[object] | None,
    held_out: list[object] | None,
    message: str,
) -> None:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    source = tmp_path / "in"
    if lines is None:
        source.write_text("the cat sat on a mat " * 5)
    else:
        _write_lines(source, lines)
    options: dict[str, object] = {"eval_fraction": 0.1}
    if held_out is not None:
        options = {"eval_input": _write_lines(tmp_path / "held", held_out)}
    with pytest.raises(ValueError, match=message):
        tokenizing.prepare(tmp_path / "out", tok_dir, source, fmt, seq_len=16, **options)  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def test_the_held_out_examples_are_chosen_by_content_not_by_place(tmp_path: Path) -> None:
    """The same examples in another order hold out the same ones; --eval-input holds out its
    own file's examples instead."""
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    docs = [{"text": " ".join(tiny_tokenizer.WORDS[i : i + 3])} for i in range(20)]
    held = []
    for name, order in (("a", docs), ("b", docs[::-1])):
        lines = _write_lines(tmp_path / f"{name}.jsonl", order)
        tokenizing.prepare(tmp_path / name, tok_dir, lines, "jsonl", eval_fraction=0.2)
        split = data.open_dataset(tmp_path / name).eval_split
        assert split is not None and split.num_examples == 4
        held.append(sorted(np.split(np.asarray(split.shards[0]), 4), key=list))
    assert [h.tolist() for h in held[0]] == [h.tolist() for h in held[1]]

    extra = _write_lines(tmp_path / "eval.jsonl", [{"text": "good morning sun"}])
    tokenizing.prepare(
        tmp_path / "c", tok_dir, tmp_path / "a.jsonl", "jsonl", eval_input=extra, seq_len=16
    )
    dataset = data.open_dataset(tmp_path / "c")
    assert dataset.num_examples == 20 and dataset.eval_split is not None
    assert np.asarray(dataset.eval_split.shards[0]).tolist() == ids("good morning sun </s>")
    with pytest.raises(tokenizing.InputError, match=r"--eval-input takes --format jsonl or chat"):
        tokenizing.prepare(
            tmp_path / "d",
            tok_dir,
            tmp_path / "a.jsonl",
            "jsonl",
            eval_input=extra,
            eval_fraction=0.1,
        )
    with pytest.raises(ValueError, match=r"--eval-fraction 0.5 of 1 examples holds out 1"):
        lone = _write_lines(tmp_path / "lone.jsonl", docs[:1])
        tokenizing.prepare(tmp_path / "e", tok_dir, lone, "jsonl", eval_fraction=0.5)


def test_the_default_sequence_length_is_the_models(tmp_path: Path) -> None:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    assert tokenizing.default_seq_len(tok_dir) == 2048
    (tok_dir / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    assert tokenizing.default_seq_len(tok_dir) == 512
