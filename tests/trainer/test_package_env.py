"""Importing the trainer asks torch's CPU allocator for transparent huge pages before torch is
imported, and keeps a choice already made."""

from __future__ import annotations

import os
import subprocess
import sys

CHECK = "import trainer, os; print(os.environ['THP_MEM_ALLOC_ENABLE'])"


def _value(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


def test_importing_the_trainer_enables_huge_pages_for_torch() -> None:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    assert _value(env) == "1"


def test_an_explicit_choice_is_kept() -> None:
    assert _value({**os.environ, "THP_MEM_ALLOC_ENABLE": "0"}) == "0"
