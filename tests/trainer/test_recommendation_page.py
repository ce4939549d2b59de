"""docs/recommendation.md states commands that exist: every `trn-train` line of its shell blocks
parses with the trainer's own parser, and every `trnctl` line names commands and flags the CLI
has (checked as tests/trainer/test_classification_page.py checks the classification page)."""

from __future__ import annotations

import pytest
from test_classification_page import commands
from typer.testing import CliRunner

from tests.conftest import ROOT
from trainer import cli
from trnctl.cli import app

PAGE = ROOT / "docs" / "recommendation.md"


def test_the_page_runs_every_step_of_the_trainer() -> None:
    steps = {words[0] for words in commands("trn-train", PAGE)}
    assert steps == {"prepare-data", "run", "eval", "export", "predict"}


@pytest.mark.parametrize("words", commands("trn-train", PAGE), ids=" ".join)
def test_each_trn_train_line_parses(words: list[str]) -> None:
    args = cli._parser().parse_args(words)
    assert args.command == words[0]


@pytest.mark.parametrize("words", commands("trnctl", PAGE), ids=" ".join)
def test_each_trnctl_line_names_commands_and_flags_that_exist(words: list[str]) -> None:
    # What follows `--` is the job's own command, not trnctl's: --help goes before it.
    own = words.index("--") if "--" in words else len(words)
    result = CliRunner().invoke(app, [*words[:own], "--help"])
    assert result.exit_code == 0, result.output
