"""``trn-train export``: the newest valid checkpoint of a ``--model`` run as a Hugging Face model
directory, from the checkpoint alone (it carries the model's ``config.json`` and tokenizer
files, see :class:`trainer.checkpoint.Checkpointer`). A LoRA run's checkpoint is written as a
PEFT adapter directory, or with ``merge_lora`` as the full model with the adapters merged."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trainer import hf, lora
from trainer.checkpoint import Checkpointer, CheckpointError, open_store
from trainer.config import ModelConfig


def export_checkpoint(
    checkpoint_dir: str,
    out: str | Path,
    *,
    dtype: str = "auto",
    max_shard_bytes: int = 5 << 30,
    merge_lora: bool = False,
    base_model_id: str = "",
) -> list[str]:
    """Writes the newest valid checkpoint in ``checkpoint_dir`` (a path or ``s3://`` URI) to the
    local directory ``out`` (see :func:`trainer.hf.save_pretrained` for ``dtype`` and
    ``max_shard_bytes``) with the carried tokenizer files, and returns the files written. The
    checkpoint of a LoRA run becomes a PEFT adapter directory (see
    :func:`trainer.lora.save_adapter`), or with ``merge_lora`` (default False) the full model
    with the adapters merged. The adapter names its base model (``base_model_name_or_path``)
    by :func:`base_model_name`.

    Raises:
        CheckpointError: no valid checkpoint there, the newest was not saved by a run from a
            model directory (it carries no ``config.json``), or ``merge_lora`` for a checkpoint
            of a run without LoRA.
        ValueError: ``out`` is not a new or empty directory; see
            :func:`trainer.hf.save_pretrained`.
    """
    if not checkpoint_dir.startswith("s3://") and not Path(checkpoint_dir).is_dir():
        raise CheckpointError(f"checkpoint directory {checkpoint_dir} does not exist")
    hf.check_empty_out(out)  # before reading a checkpoint that may be gigabytes
    checkpointer = Checkpointer(open_store(checkpoint_dir))
    try:
        return _export(
            checkpointer, checkpoint_dir, out, dtype, max_shard_bytes, merge_lora, base_model_id
        )
    finally:
        checkpointer.store.drop_local_copies()  # from S3: this process's downloads


def _export(
    checkpointer: Checkpointer,
    checkpoint_dir: str,
    out: str | Path,
    dtype: str,
    limit: int,
    merge_lora: bool,
    base_model_id: str,
) -> list[str]:
    name = checkpointer.newest_valid()
    if name is None:
        raise CheckpointError(f"{checkpoint_dir} holds no valid checkpoint to export")
    carried = checkpointer.model_files_of(name)
    if hf.CONFIG not in carried:
        raise CheckpointError(
            f"checkpoint {name} in {checkpoint_dir} carries no {hf.CONFIG}: only checkpoints of "
            "`trn-train run --model DIR` can be exported as Hugging Face models"
        )
    with checkpointer.model_file(name, hf.CONFIG) as path:
        raw = json.loads(path.read_text())
    adapter = (checkpointer.run_of(name) or {}).get("lora")
    if merge_lora and not isinstance(adapter, dict):
        raise CheckpointError(
            f"--merge-lora: checkpoint {name} in {checkpoint_dir} is not of a LoRA run "
            "(`trn-train run --model DIR --lora-rank R`); export it without --merge-lora"
        )
    state = checkpointer.load(name, verify=False, parts=("model",))["model"]
    if isinstance(adapter, dict):
        spec = lora.LoraSpec.from_dict(adapter)
        base = checkpointer.base_model_of(name)
        if not merge_lora:
            name_of_base = base_model_name(raw, base, base_model_id)
            written = lora.save_adapter(state, raw, spec, out, base_model=name_of_base, dtype=dtype)
            return written + _copy_carried(checkpointer, name, carried, out)
        cfg = hf.parse_config(raw, seq_len=1)
        state = lora.merged({**_base_weights(checkpointer, name, base, cfg), **state}, cfg, spec)
    written = hf.save_pretrained(state, raw, out, dtype=dtype, max_shard_bytes=limit)
    return written + _copy_carried(checkpointer, name, carried, out)


def base_model_name(raw_config: Mapping[str, Any], base_dir: str, base_model_id: str) -> str:
    """What an exported adapter names as its base model: ``base_model_id`` when given, else the
    model's own id where its ``config.json`` keeps one (``_name_or_path``, which transformers
    sets from the name a model was loaded by), else the base directory the run read, as an
    absolute path."""
    own = raw_config.get("_name_or_path")
    return base_model_id or (own if isinstance(own, str) and own else base_dir)


def _base_weights(
    checkpointer: Checkpointer, name: str, base: str, cfg: ModelConfig
) -> dict[str, torch.Tensor]:
    """The base weights a LoRA checkpoint's adapters merge into: its checkpoint holds the
    adapters only, so they are read from the base model directory it recorded, which must
    still hold the model it was trained on (the same :func:`trainer.hf.fingerprint`).

    Raises:
        CheckpointError: the directory is missing or holds another model.
    """
    recorded = (checkpointer.run_of(name) or {}).get("model")
    if not base or not Path(base).is_dir():
        raise CheckpointError(
            f"--merge-lora: checkpoint {name} holds LoRA adapters only and its base model "
            f"directory {base!r} is not here; export the adapter without --merge-lora, or run "
            "where the base model is"
        )
    found = hf.fingerprint(base)
    if found != recorded:
        raise CheckpointError(
            f"--merge-lora: base model {base} has fingerprint {found}, but checkpoint {name} "
            f"was trained on {recorded}: the adapters only fit the base they were trained on"
        )
    return hf.read_weights(base, cfg)


def _copy_carried(
    checkpointer: Checkpointer, name: str, carried: list[str], out: str | Path
) -> list[str]:
    """Copies the carried files but ``config.json`` (the tokenizer's) into ``out``."""
    written = []
    for file in carried:
        if file != hf.CONFIG:
            with checkpointer.model_file(name, file) as path:
                (Path(out) / file).write_bytes(path.read_bytes())
            written.append(file)
    return written
