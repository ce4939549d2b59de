"""Shared fixtures: the shipped corpus prepared once per test process, and trainer subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import two_ranks as two_ranks_launch

from tests import warm
from trainer import data


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    data.prepare_corpus(out)
    return out


@pytest.fixture(scope="session")
def model_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped corpus as the tiny Hugging Face models' words (byte b as "w<b>"), prepared
    with their tokenizer (tests/trainer/hf_tiny.py): the token ids of ``corpus_dir`` with an EOS
    and a 1% held-out tail, data that ``run --model`` of a 256-word tiny model trains on."""
    import hf_tiny

    from trainer import tokenizing

    root = tmp_path_factory.mktemp("model-data")
    text = " ".join(
        f"w{b}" for f in sorted(data.DEFAULT_CORPUS.glob("*.txt")) for b in f.read_bytes()
    )
    (root / "corpus.txt").write_text(text)
    tokenizing.prepare(
        root / "data", hf_tiny.save_tokenizer(root / "tok"), root / "corpus.txt", "text"
    )
    return root / "data"


@pytest.fixture(scope="session")
def trainer_env() -> dict[str, str]:
    """One thread per trainer process, so two pytest workers each running a trainer do not
    oversubscribe two cores; no torchrun variables leak in."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


@pytest.fixture
def launch(trainer_env: dict[str, str]) -> Iterator[Callable[..., warm.Started]]:
    """Starts ``python -m trainer ARGS`` (the ``trn-train`` CLI) warm (tests/warm.py) without
    waiting; what the test left running is killed after it."""
    started: list[warm.Started] = []

    def start(*args: str) -> warm.Started:
        started.append(warm.start([sys.executable, "-m", "trainer", *args], env=trainer_env))
        return started[-1]

    yield start
    for run in started:
        run.kill()


@pytest.fixture(scope="session")
def run_trainer(trainer_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs ``python -m trainer ARGS`` warm (tests/warm.py) to completion (two minutes at
    most)."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return warm.run([sys.executable, "-m", "trainer", *args], env=trainer_env, timeout=120)

    return run


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    """In-process training shares two cores with another pytest worker and trainer subprocesses;
    more threads than cores only adds contention."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def two_ranks(
    corpus_dir: Path, trainer_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> two_ranks_launch.TwoRanks:
    """Every two-rank scenario in one launch of two ranks; its tests carry
    ``pytest.mark.xdist_group(two_ranks_launch.GROUP)`` so that one worker runs it once."""
    return two_ranks_launch.launch(tmp_path_factory.mktemp("two-ranks"), corpus_dir, trainer_env)
