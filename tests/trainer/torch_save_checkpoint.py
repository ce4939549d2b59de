"""Checkpoints as trainers before the one format wrote them for an unsharded run: the state in one
``torch.save`` file, ``state.pt``, and ``meta.json`` with its size and CRC-32 (format
``trn-train-checkpoint-v1``; the writer of training_image/trainer/checkpoint.py before the one
format), so that tests check today's trainer still reads them."""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from trainer import checkpoint

FORMAT = "trn-train-checkpoint-v1"


def write(
    root: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    run: Mapping[str, object] | None = None,
    model_files: tuple[Path, ...] = (),
) -> Path:
    """Writes checkpoint ``step`` of ``model`` (no frozen parameters) under ``root`` and returns
    its directory."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = {
        "format": FORMAT,
        "step": step,
        "model": get_model_state_dict(model, options=options),
        "optimizer": get_optimizer_state_dict(model, optimizer, options=options),
        "rng": torch.get_rng_state(),
    }
    folder = root / checkpoint.name_for(step)
    folder.mkdir(parents=True)
    torch.save(state, folder / "state.pt")
    written = (folder / "state.pt").read_bytes()
    meta: dict[str, object] = {
        "format": FORMAT,
        "step": step,
        "bytes": len(written),
        "crc32": f"{zlib.crc32(written):08x}",
    }
    if run is not None:
        meta["run"] = dict(run)
    if model_files:
        (folder / "model").mkdir()
        for path in model_files:
            shutil.copyfile(path, folder / "model" / path.name)
        meta["model_files"] = [path.name for path in model_files]
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder
