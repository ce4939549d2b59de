"""Every input error of ``trn-train``, run as the command a user types (``python -m trainer``, a
warm subprocess): exit status 2, one line on stderr naming the problem, no traceback; with
``--debug``, the traceback."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import hf_tiny
import pytest
import tiny_tokenizer
import torch

from trainer import cli, hf, hf_config, hf_export, lora, tokenizing

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, model_data: Path) -> dict[str, Path]:
    """A tiny model, a checkpoint of one step of it, an adapter of a base that is not here, a
    model directory without config.json, models this trainer does not implement, a non-empty
    directory and a chat file with a bad line."""
    root = tmp_path_factory.mktemp("errors")
    model = hf_tiny.model_dir(root)
    ck = root / "ck"
    argv = hf_tiny.run_args(model, model_data, ck, lr="1e-3", max_steps="1")
    assert cli.main(argv) == 0
    cfg = hf_config.model_config(model, seq_len=hf_tiny.SEQ_LEN)
    spec = lora.LoraSpec(2, 2.0)
    gpt = lora.apply(hf.load_pretrained(model, cfg), cfg, spec)
    adapter = root / "adapter"
    raw = hf_config.read_config(model)
    hf_export.save_adapter(gpt.state_dict(), raw, spec, adapter, base_model="org/not-here")
    (root / "bare").mkdir()
    (root / "bare" / "tokenizer.json").write_text("{}")
    changes: dict[str, dict[str, object]] = {
        "gpt2": {"architectures": ["GPT2LMHeadModel"]},
        "gelu": {"hidden_act": "gelu"},
    }
    for name, change in changes.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps({**raw, **change}))
    (root / "full").mkdir()
    (root / "full" / "kept.txt").write_text("x")
    chat = root / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "robot", "content": "hi"}]}) + "\n")
    tok = tiny_tokenizer.build(root / "tok")
    (root / "words.txt").write_text("the cat sat on a mat " * 100)
    tokenizing.prepare(root / "other", tok, root / "words.txt", "text", eval_fraction=0, seq_len=16)
    return {"root": root, "model": model, "ck": ck, "adapter": adapter, "chat": chat}


RUN = "run --data {data} --device cpu --compile none"
# (the command line, its {placeholders} filled from the files fixture; what the one line says)
CASES = [
    (RUN + " --model {root}/absent", "model directory .*/absent does not exist"),
    (RUN + " --model {root}/bare", "bare holds no config.json"),
    (RUN + " --model {root}/gpt2", r"architectures \['GPT2LMHeadModel'\]"),
    (RUN + " --model {root}/gelu", "hidden_act 'gelu' is not supported"),
    (RUN + " --model {adapter}", "adapter is a PEFT adapter"),
    (RUN + " --model {model} --lora-rank 0", "--lora-rank must be >= 1, got 0"),
    (RUN + " --model {model} --lora-alpha 4", "--lora-alpha 4.0 needs --lora-rank"),
    (RUN + " --model {model} --lora-rank 2 --lora-targets lm_head", "'lm_head' is not a target"),
    (RUN + " --preset tiny --model {model}", "exclude each other"),
    (RUN + " --max-steps 0", "max_steps must be >= 1, got 0"),
    (
        "run --model {model} --data {root}/other --device cpu",
        "--data .*/other was tokenized with hf:tok .*, --model .* has another tokenizer",
    ),
    ("run --model {model} --data {corpus} --device cpu", "is the byte corpus"),
    (
        "run --data {root}/nodata --device cpu",
        "nodata/manifest.json: missing: not a directory made by `trn-train prepare-data`",
    ),
    (RUN + " --model {model} --checkpoint-dir {ck} --seq-len 8", "seq_len 16 in the checkpoint"),
    ("export --checkpoint-dir {ck} --out {root}/full", "full is not empty"),
    ("export --checkpoint-dir {root}/nock --out {root}/o", "nock does not exist"),
    ("export --checkpoint-dir {ck} --out {root}/o --merge-lora", "is not of a LoRA run"),
    (
        "score --model {adapter} --tokens {root}/t.json",
        "is a PEFT adapter, and its base model 'org/not-here' is not a directory here: give "
        "the base model's directory with --base-model DIR",
    ),
    ("score --model {model} --tokens {root}/absent.json", "unreadable token file"),
    (
        "prepare-data --tokenizer {root}/tok --input {chat} --format chat --out {root}/p",
        r"chat.jsonl:1: messages\[0\].role 'robot' is unknown",
    ),
    (
        "prepare-data --tokenizer {root}/absent --input {chat} --out {root}/p",
        "--tokenizer '.*absent' is not a directory",
    ),
    ("prepare-data --input x.txt --out {root}/p", "--input needs --tokenizer"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("command", "message"), CASES, ids=[c.split(" --")[0] for c, _ in CASES])
def test_each_input_error_is_one_line_and_exit_status_2(
    command: str,
    message: str,
    files: dict[str, Path],
    model_data: Path,
    corpus_dir: Path,
    run_trainer: Run,
) -> None:
    done = run_trainer(*command.format(data=model_data, corpus=corpus_dir, **files).split())
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("trn-train: error: "), done.stderr
    assert re.search(message, done.stderr), done.stderr


@pytest.mark.slow
def test_debug_shows_the_traceback(files: dict[str, Path], run_trainer: Run) -> None:
    done = run_trainer("run", "--data", "d", "--model", str(files["root"] / "absent"), "--debug")
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "HFConfigError: model directory" in done.stderr


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error that is not an input error (here a KeyError) is raised as it is."""

    def broken(args: object) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr(cli, "_report", broken)
    with pytest.raises(KeyError, match="a bug"):
        cli.main(["report", "m.jsonl", "--out", "p.png"])
    assert cli.input_error(ValueError("x")) and not cli.input_error(KeyError("x"))
    assert not cli.input_error(torch.cuda.OutOfMemoryError("x"))
