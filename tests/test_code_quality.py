"""ruff over the whole repository: lint rules and formatting, as `make lint` runs them."""

import subprocess

from tests.conftest import ROOT

RUFF = ROOT / ".venv" / "bin" / "ruff"


def test_ruff_lint_is_clean() -> None:
    result = subprocess.run([str(RUFF), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_ruff_format_is_clean() -> None:
    result = subprocess.run(
        [str(RUFF), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout
