"""Every `trnctl` command line in the README's shell blocks names a command the CLI has, with
options that command takes: the README's walks cannot drift from the CLI unnoticed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main

from trnctl.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|console)\n(.*?)^```", re.DOTALL | re.MULTILINE)
# Where one command ends and the next begins on a shell line.
SEPARATORS = {"&&", "||", ";", "|"}


def shell_lines(text: str) -> list[str]:
    """The logical lines of the README's shell blocks (backslash continuations joined)."""
    lines = []
    for block in SHELL_BLOCK.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    return lines


def trnctl_commands(text: str) -> list[list[str]]:
    """Each ``trnctl ...`` invocation's words after ``trnctl`` (comments left out)."""
    found = []
    for line in shell_lines(text):
        words = shlex.split(line, comments=True)
        current: list[str] | None = None
        for word in words:
            if word in SEPARATORS:
                current = None
            elif current is None and word == "trnctl":
                current = []
                found.append(current)
            elif current is not None:
                current.append(word)
    return found


def problems(words: list[str], root: Any) -> list[str]:
    """Why ``trnctl WORDS`` is not a command line of ``root``: an unknown command or an option
    the command does not take. Usage brackets (``[--nodes N]``) are read as the option inside;
    nothing after ``--`` is looked at (it is the job's own command)."""
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
    options.add("--help")
    found = []
    for word in rest:
        if word == "--":
            break
        flag = word.lstrip("[").rstrip("]").split("=", 1)[0]
        if flag.startswith("-") and flag != "-" and flag not in options:
            found.append(f"{' '.join(path)} takes no {flag}")
    return found


ROOT = typer.main.get_command(app)
COMMANDS = trnctl_commands(README.read_text(encoding="utf-8"))


def test_the_readme_has_trnctl_commands_including_the_trn_vs_gpu_walk() -> None:
    lines = [" ".join(words) for words in COMMANDS]
    assert len(lines) > 20
    assert any("--target gpu" in line for line in lines)
    assert any("--target trn" in line for line in lines)
    assert any(line.startswith("compare ") and "--out report.html" in line for line in lines)


@pytest.mark.parametrize("words", COMMANDS, ids=[" ".join(w)[:60] for w in COMMANDS])
def test_every_readme_command_exists_with_its_options(words: list[str]) -> None:
    assert problems(words, ROOT) == []


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
    (words,) = trnctl_commands(f"```bash\n{line}\n```\n")

    assert problems(words, ROOT) == found
