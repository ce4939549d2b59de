"""docs/classification.md states commands that exist: every `trn-train` line of its shell
blocks parses with the trainer's own parser, and every `trnctl` line names commands and flags
the CLI has (the page is the end-to-end guide a team follows, so a renamed flag fails here)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT
from trainer import cli
from trnctl.cli import app

PAGE = ROOT / "docs" / "classification.md"


def commands(program: str, page: Path = PAGE) -> list[list[str]]:
    """The arguments of each ``program`` line of the page's ``bash`` blocks (continuation lines
    joined, comments dropped)."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == [program]:
                found.append(words[1:])
    return found


def test_the_page_runs_every_step_of_the_trainer() -> None:
    steps = {words[0] for words in commands("trn-train")}
    assert steps == {"prepare-data", "run", "eval", "export", "predict"}


@pytest.mark.parametrize("words", commands("trn-train"), ids=" ".join)
def test_each_trn_train_line_parses(words: list[str]) -> None:
    args = cli._parser().parse_args(words)
    assert args.command == words[0]


@pytest.mark.parametrize("words", commands("trnctl"), ids=" ".join)
def test_each_trnctl_line_names_commands_and_flags_that_exist(words: list[str]) -> None:
    # --help is eager: it answers after the line's options parse, before anything runs; an
    # unknown command or flag is a usage error (exit 2) instead.
    result = CliRunner().invoke(app, [*words, "--help"])
    assert result.exit_code == 0, result.output


def test_a_misspelt_flag_fails_the_check() -> None:
    result = CliRunner().invoke(app, ["job", "submit", "--best-metrik", "x", "--help"])
    assert result.exit_code == 2
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["run", "--data", "d", "--clas-weights", "auto"])
