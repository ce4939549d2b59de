"""Every `trnctl` and `trn-train` command line in the shell blocks of the documentation (README.md,
the pages under docs/, the library's README) names a command the CLI has, with options that
command takes: the documented walks cannot drift from the CLIs unnoticed."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main

from trainer import cli as trn_train_cli
from trnctl.cli import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "constructs_lib" / "README.md",
]
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|console)\n(.*?)^```", re.DOTALL | re.MULTILINE)
# Where one command ends and the next begins on a shell line.
SEPARATORS = {"&&", "||", ";", "|"}
PROGRAMS = ("trnctl", "trn-train")


def shell_lines(text: str) -> list[str]:
    """The logical lines of the page's shell blocks (backslash continuations joined)."""
    lines = []
    for block in SHELL_BLOCK.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    return lines


def program_of(word: str) -> str | None:
    """``trnctl`` or ``trn-train`` where ``word`` runs one (also by a path, .venv/bin/trnctl)."""
    name = word.rsplit("/", 1)[-1]
    return name if name in PROGRAMS else None


def commands(text: str, program: str = "trnctl") -> list[list[str]]:
    """Each ``program ...`` invocation's words after the program's name (comments left out)."""
    found = []
    for line in shell_lines(text):
        words = shlex.split(line, comments=True)
        current: list[str] | None = None
        for word in words:
            if word in SEPARATORS:
                current = None
            elif current is None and program_of(word) == program:
                current = []
                found.append(current)
            elif current is not None:
                current.append(word)
    return found


def unknown_flags(path: list[str], rest: list[str], options: set[str]) -> list[str]:
    """The flags of ``rest`` not in ``options``, as problems of command ``path``. Usage brackets
    (``[--nodes N]``) are read as the option inside; nothing after ``--`` is looked at (it is
    the job's own command)."""
    found = []
    for word in rest:
        if word == "--":
            break
        flag = word.lstrip("[").rstrip("]").split("=", 1)[0]
        if flag.startswith("-") and flag != "-" and flag not in options | {"--help"}:
            found.append(f"{' '.join(path)} takes no {flag}")
    return found


def problems(words: list[str], root: Any) -> list[str]:
    """Why ``trnctl WORDS`` is not a command line of ``root`` (typer's click command): an
    unknown command or an option the command does not take."""
    command, path = root, ["trnctl"]
    rest = list(words)
    while hasattr(command, "commands"):  # a group (typer's own click)
        if not rest or rest[0].startswith("-"):
            return [f"{' '.join(path)}: no command named"]
        name = rest.pop(0)
        sub = command.commands.get(name)
        if sub is None:
            return [f"{' '.join(path)} has no command {name!r}"]
        command, path = sub, [*path, name]
    options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    return unknown_flags(path, rest, options)


def trn_train_problems(words: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """Why ``trn-train WORDS`` is not a command line of ``parser``: an unknown command or an
    option the command does not take."""
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not words or words[0].startswith("-"):
        return ["trn-train: no command named"]
    sub = subparsers.choices.get(words[0])
    if sub is None:
        return [f"trn-train has no command {words[0]!r}"]
    options = {opt for action in sub._actions for opt in action.option_strings}
    return unknown_flags(["trn-train", words[0]], words[1:], options)


ROOT_COMMAND = typer.main.get_command(app)


def documented(program: str) -> list[tuple[str, list[str]]]:
    """(page, words) of each documented ``program`` command line."""
    return [
        (str(page.relative_to(ROOT)), words)
        for page in PAGES
        for words in commands(page.read_text(encoding="utf-8"), program)
    ]


TRNCTL = documented("trnctl")
TRN_TRAIN = documented("trn-train")


def _ids(found: list[tuple[str, list[str]]]) -> list[str]:
    return [f"{page}: {' '.join(words)[:60]}" for page, words in found]


def test_the_docs_have_trnctl_commands_including_the_trn_vs_gpu_walk() -> None:
    lines = [" ".join(words) for _, words in TRNCTL]
    assert len(lines) > 20
    assert any("--target gpu" in line for line in lines)
    assert any("--target trn" in line for line in lines)
    assert any(line.startswith("compare ") and "--out report.html" in line for line in lines)


def test_the_docs_have_trn_train_commands_of_every_kind_a_user_types() -> None:
    kinds = {words[0] for _, words in TRN_TRAIN if words}
    assert {"prepare-data", "run", "export", "report", "score"} <= kinds


@pytest.mark.parametrize(("page", "words"), TRNCTL, ids=_ids(TRNCTL))
def test_every_documented_trnctl_command_exists_with_its_options(
    page: str, words: list[str]
) -> None:
    assert problems(words, ROOT_COMMAND) == []


@pytest.mark.parametrize(("page", "words"), TRN_TRAIN, ids=_ids(TRN_TRAIN))
def test_every_documented_trn_train_command_exists_with_its_options(
    page: str, words: list[str]
) -> None:
    assert trn_train_problems(words, trn_train_cli._parser()) == []


@pytest.mark.parametrize(
    ("line", "found"),
    [
        ("trnctl job submit --env e --targt gpu -- torchrun x.py --bogus", [
            "trnctl job submit takes no --targt"
        ]),
        ("trnctl job sumbit --env e", ["trnctl job has no command 'sumbit'"]),
        ("trnctl compare a b [--outfile x]", ["trnctl compare takes no --outfile"]),
        ("trnctl job", ["trnctl job: no command named"]),
    ],
)  # fmt: skip
def test_the_check_finds_a_wrong_command_or_option(line: str, found: list[str]) -> None:
    (words,) = commands(f"```bash\n{line}\n```\n")

    assert problems(words, ROOT_COMMAND) == found


@pytest.mark.parametrize(
    ("line", "found"),
    [
        (".venv/bin/trn-train run --data d --lora-rnk 8", ["trn-train run takes no --lora-rnk"]),
        ("trn-train exprot --out x", ["trn-train has no command 'exprot'"]),
        ("trn-train --help", ["trn-train: no command named"]),
        ("trn-train run --data d --no-progress --merge-lora", [
            "trn-train run takes no --merge-lora"
        ]),
    ],
)  # fmt: skip
def test_the_check_finds_a_wrong_trn_train_command_or_option(line: str, found: list[str]) -> None:
    (words,) = commands(f"```bash\n{line}\n```\n", "trn-train")

    assert trn_train_problems(words, trn_train_cli._parser()) == found
