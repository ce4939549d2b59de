"""The README's quickstart runs as written, offline: its make targets exist, and its fine-tuning
commands (the tiny model, prepare-data, run, eval, export, report) run in a fresh folder, with the
training run cut to its first epoch, which ends at its first eval loss."""

from __future__ import annotations

import json
import math
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainer import cli

QUICKSTART = re.compile(r"^## Quickstart.*?(?=^## )", re.S | re.M)
SHELL_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
# The run as written trains two epochs of 25 steps, an eval every 25 steps; the first (the end of
# the first epoch) is the quickstart's claim.
EPOCHS_UP_TO_FIRST_EVAL = "1"
STEPS_PER_EPOCH = 25


def quickstart_blocks() -> list[list[list[str]]]:
    """Each shell block of the README's quickstart as command lines of words (comments and
    backslash continuations resolved)."""
    (section,) = QUICKSTART.findall((ROOT / "README.md").read_text())
    return [
        [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()]
        for block in SHELL_BLOCK.findall(section)
    ]


def test_the_quickstart_s_make_targets_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    first, _ = quickstart_blocks()
    targets = [words[1] for words in first]
    assert all(words[0] == "make" and len(words) == 2 for words in first), first
    assert {"synth", "train-local"} <= set(targets)
    for target in targets:
        assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.M), target


def _run(words: list[str]) -> None:
    """One quickstart command line, in this process: a script of the repository through runpy,
    ``trn-train`` through its entry point."""
    program = words[0].rsplit("/", 1)[-1]
    if program == "python":
        argv = sys.argv
        sys.argv = [str(ROOT / words[1]), *words[2:]]
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        finally:
            sys.argv = argv
    else:
        assert program == "trn-train", words
        args = list(words[1:])
        if args[0] == "run":
            args[args.index("--epochs") + 1] = EPOCHS_UP_TO_FIRST_EVAL
        assert cli.main(args) == 0, words


@pytest.mark.slow
def test_the_quickstart_fine_tunes_evaluates_exports_and_plots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    _, fine_tune = quickstart_blocks()
    commands = [words[1] for words in fine_tune[1:]]
    assert commands == ["prepare-data", "run", "eval", "export", "report"]
    assert "--epochs" in fine_tune[2] and "--max-steps" not in fine_tune[2]

    outputs = []
    for words in fine_tune:
        _run(words)
        outputs.append(capsys.readouterr().out)

    records = [json.loads(line) for line in Path("ft.jsonl").read_text().splitlines()]
    (header,) = [r for r in records if r.get("kind") == "run"]
    (evaluation,) = [r for r in records if r.get("kind") == "eval"]
    vocab = json.loads(Path("tiny-llama/config.json").read_text())["vocab_size"]
    assert math.log(vocab) == pytest.approx(5.56, abs=0.01)  # the README's uniform guess
    assert header["data"]["steps_per_epoch"] == STEPS_PER_EPOCH  # the README's 25 steps
    assert header["data"]["eval"]["examples"] == 2  # 1% of the 200 conversations, rounded up
    assert evaluation["step"] == STEPS_PER_EPOCH
    assert evaluation["eval_loss"] < math.log(vocab) - 1.5
    # `eval` of the newest checkpoint (step 25): the in-run eval's examples and number, in FP32.
    evaluated = json.loads(outputs[commands.index("eval") + 1].splitlines()[-1])
    assert (evaluated["examples"], evaluated["tokens"]) == (2, evaluation["eval_tokens"])
    assert evaluated["loss"] == pytest.approx(evaluation["eval_loss"], rel=1e-5)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in Path("tuned").iterdir()
    }
    assert Path("ft.png").stat().st_size > 0
