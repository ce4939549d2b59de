"""Data and model must match: ``prepare-data`` records the tokenizer, ``run --model`` refuses
data made with another (or the byte corpus); a chat-shaped JSON-lines file is read as chat
unless another format is asked for, and refused as text; an exported adapter names its base
model by id where one is known, and a merge works from any working directory."""

from __future__ import annotations

import json
import re
from pathlib import Path

import hf_tiny
import pytest
import tiny_tokenizer

from trainer import checkpoint, cli, lora, tokenizing

CHAT = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi friend"}]


def _run(model: Path, data: Path, ck: Path, *extra: str) -> list[str]:
    return [*hf_tiny.run_args(model, data, ck, lr="1e-3", max_steps="1"), *extra]


def test_the_manifest_records_the_tokenizer(tmp_path: Path) -> None:
    tok = tiny_tokenizer.build(tmp_path / "tok")
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": CHAT}) + "\n")
    manifest = tokenizing.prepare(
        tmp_path / "out", tok, tmp_path / "chat.jsonl", "chat", eval_fraction=0, seq_len=16
    )
    assert manifest["tokenizer"] == "hf:tok"
    assert manifest["tokenizer_sha256"] == tokenizing.tokenizer_sha256(tok)
    assert manifest["vocab_size"] == len(tiny_tokenizer.VOCAB)
    assert manifest["special_tokens"] == {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "[UNK]",
    }


def test_data_of_another_tokenizer_or_the_byte_corpus_is_refused(
    corpus_dir: Path, model_data: Path, tmp_path: Path
) -> None:
    model = hf_tiny.model_dir(tmp_path)
    other = tiny_tokenizer.build(tmp_path / "tok")
    (tmp_path / "t.txt").write_text("the cat sat on a mat " * 200)
    tokenizing.prepare(
        tmp_path / "other", other, tmp_path / "t.txt", "text", eval_fraction=0, seq_len=16
    )
    ours, theirs = tokenizing.tokenizer_sha256(other), tokenizing.tokenizer_sha256(model)
    assert ours is not None and theirs is not None
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"--data {tmp_path / 'other'} was tokenized with hf:tok (tokenizer files sha256 "
            f"{ours[:12]}), --model {model} has another tokenizer (sha256 {theirs[:12]}): "
            f"prepare it with `trn-train prepare-data --tokenizer {model} --input FILE`"
        ),
    ):
        cli.main([*_run(model, tmp_path / "other", tmp_path / "ck"), "--debug"])
    with pytest.raises(ValueError, match=r"--data .* is the byte corpus \(tokenizer bytes-v1"):
        cli.main([*_run(model, corpus_dir, tmp_path / "ck"), "--debug"])
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((model / name).read_bytes())
    with pytest.raises(ValueError, match=r"--model .*bare holds no tokenizer files"):
        cli.main([*_run(bare, model_data, tmp_path / "ck"), "--debug"])
    assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").glob("step_*"))


def test_chat_json_lines_are_read_as_chat_unless_asked_otherwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = tiny_tokenizer.build(tmp_path / "tok")
    (tmp_path / "c.jsonl").write_text("\n" + json.dumps({"messages": CHAT}) + "\n")
    options = {"eval_fraction": 0.0, "seq_len": 16}
    by_format = tokenizing.prepare(tmp_path / "a", tok, tmp_path / "c.jsonl", "chat", **options)
    capsys.readouterr()
    detected = tokenizing.prepare(tmp_path / "b", tok, tmp_path / "c.jsonl", "auto", **options)
    assert detected["shards"] == by_format["shards"] and detected["masked"] is True
    assert capsys.readouterr().out == (
        f"prepare-data: --format auto: {tmp_path / 'c.jsonl'} is chat (line 2 is a JSON object "
        "with 'messages')\n"
    )
    with pytest.raises(
        tokenizing.InputError,
        match=r"c.jsonl' looks like chat JSON lines \(line 2 is a JSON object with 'messages'\): "
        r"give --format chat \(or auto\), not --format text",
    ):
        tokenizing.prepare(tmp_path / "c", tok, tmp_path / "c.jsonl", "text", **options)
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "the cat"}) + "\n")
    assert tokenizing.input_format(tmp_path / "d.jsonl", "auto")[0] == "jsonl"
    (tmp_path / "p.txt").write_text("{not json\n")
    assert tokenizing.input_format(tmp_path / "p.txt", "auto")[0] == "text"


def test_help_shows_the_format_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["prepare-data", "--help"])
    assert "default auto: chat or jsonl by the first line's fields, else text" in " ".join(
        capsys.readouterr().out.split()
    )


def test_an_adapter_names_its_base_by_id_and_merges_from_anywhere(
    model_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = hf_tiny.model_dir(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert cli.main(_run(Path(model.name), model_data, Path("ck"), "--lora-rank", "2")) == 0
    meta = json.loads((tmp_path / "ck" / checkpoint.name_for(1) / checkpoint.META).read_text())
    assert meta["base_model"] == str(model)  # absolute, though typed relative

    def exported(out: str, *flags: str) -> str:
        assert cli.main(["export", "--checkpoint-dir", "ck", "--out", out, *flags]) == 0
        config = json.loads((tmp_path / out / lora.ADAPTER_CONFIG).read_text())
        return str(config["base_model_name_or_path"])

    assert exported("a") == str(model)  # the config keeps no id: the base directory
    assert exported("b", "--base-model-id", "org/tiny-llama") == "org/tiny-llama"
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "_name_or_path": "org/base"}))
    # The checkpoint carries the config the run read; a run from the changed one names it.
    assert cli.main(_run(Path(model.name), model_data, Path("ck2"), "--lora-rank", "2")) == 0
    assert cli.main(["export", "--checkpoint-dir", "ck2", "--out", "c"]) == 0
    assert (
        json.loads((tmp_path / "c" / lora.ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
        == "org/base"
    )

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    merge = ["export", "--checkpoint-dir", str(tmp_path / "ck2"), "--merge-lora", "--out", "m"]
    assert cli.main(merge) == 0
    assert (elsewhere / "m" / "model.safetensors").is_file()
