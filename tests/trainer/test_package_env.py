"""Importing the trainer sets nothing in the environment, so that torch's CPU allocator does not
advise huge pages for every large tensor (issue 36: the ``small`` preset ran at 0.86 of its
speed with ``THP_MEM_ALLOC_ENABLE=1``, which the package used to set on import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vmflags import SMAPS

# A clean process imports the trainer's modules, then allocates a tensor the size of one of the
# `small` preset's activations (8 x 256 x 1536 FP32, 12 MiB) and reports the environment variables
# importing added and the kernel's flags on that tensor's memory.
CHECK = """
import json, os
before = dict(os.environ)
import trainer, trainer.cli, trainer.loop, torch
from vmflags import vm_flags
activation = torch.empty(8, 256, 1536)
added = {k: v for k, v in os.environ.items() if before.get(k) != v}
print(json.dumps({"added": added, "flags": sorted(vm_flags(activation.data_ptr() + (4 << 20)))}))
"""


def _child() -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    env["PYTHONPATH"] = str(Path(__file__).parent)
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, check=True
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.skipif(not SMAPS.exists(), reason="needs Linux's /proc/self/smaps")
def test_importing_the_trainer_leaves_torchs_allocator_without_huge_page_advice() -> None:
    child = _child()
    assert child["added"] == {}
    assert "hg" not in child["flags"]  # MADV_HUGEPAGE: what THP_MEM_ALLOC_ENABLE=1 asks for
