"""ruff over the whole repository: lint rules and formatting, as `make lint` runs them, but
without ruff's cache: nothing is written into the checkout while tests/test_library.py compares
its state."""

import subprocess

from tests.conftest import ROOT

RUFF = ROOT / ".venv" / "bin" / "ruff"


def test_ruff_lint_is_clean() -> None:
    result = subprocess.run(
        [str(RUFF), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


def test_ruff_format_is_clean() -> None:
    result = subprocess.run(
        [str(RUFF), "format", "--check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout
