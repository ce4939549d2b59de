"""``trn-train export``: the newest valid checkpoint of a ``--model`` run as a Hugging Face model
directory, from the checkpoint alone (it carries the model's ``config.json`` and tokenizer
files, see :class:`trainer.checkpoint.Checkpointer`)."""

from __future__ import annotations

import json
from pathlib import Path

from trainer import hf
from trainer.checkpoint import Checkpointer, CheckpointError, open_store


def export_checkpoint(
    checkpoint_dir: str, out: str | Path, *, dtype: str = "auto", max_shard_bytes: int = 5 << 30
) -> list[str]:
    """Writes the newest valid checkpoint in ``checkpoint_dir`` (a path or ``s3://`` URI) to the
    local directory ``out`` (see :func:`trainer.hf.save_pretrained` for ``dtype`` and
    ``max_shard_bytes``) with the carried tokenizer files, and returns the files written.

    Raises:
        CheckpointError: no valid checkpoint there, or the newest was not saved by a run from a
            model directory (it carries no ``config.json``).
        ValueError: see :func:`trainer.hf.save_pretrained`.
    """
    if not checkpoint_dir.startswith("s3://") and not Path(checkpoint_dir).is_dir():
        raise CheckpointError(f"checkpoint directory {checkpoint_dir} does not exist")
    checkpointer = Checkpointer(open_store(checkpoint_dir))
    try:
        return _export(checkpointer, checkpoint_dir, out, dtype, max_shard_bytes)
    finally:
        checkpointer.store.drop_local_copies()  # from S3: this process's downloads


def _export(
    checkpointer: Checkpointer, checkpoint_dir: str, out: str | Path, dtype: str, limit: int
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
    state = checkpointer.load(name, verify=False)["model"]
    written = hf.save_pretrained(state, raw, out, dtype=dtype, max_shard_bytes=limit)
    for file in carried:
        if file != hf.CONFIG:
            with checkpointer.model_file(name, file) as path:
                (Path(out) / file).write_bytes(path.read_bytes())
            written.append(file)
    return written
