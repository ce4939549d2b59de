"""Stage a text corpus in S3 as the trainer's shards: tokenize, shard, verify, upload.

The shard format, the manifest and the byte tokenizer are the trainer's (:mod:`trainer.data`),
imported rather than copied, so that what trnctl stages is what the trainer reads. Importing it
loads torch (about two seconds), which is why the CLI imports this module only for ``data``.

Uploads go through :mod:`trnctl.transfer`: a rerun skips shards already uploaded intact (same
size, same SHA-256 from the manifest). The manifest goes up after every file it names, and a stage
that has anything to upload deletes the prefix's manifest before its first upload, so a stage
stopped midway leaves a prefix without a manifest, which the trainer refuses.

Staging is where shards are hashed in full (written, then read back by the trainer's reader with
every SHA-256 checked); the trainer checks only headers and sizes when it starts, and records the
manifest's SHA-256 (:func:`manifest_sha256`, which pins every shard's) in its checkpoints.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from trainer import data as shard_format
from trnctl.errors import TrnctlError
from trnctl.transfer import MIB, S3Prefix, Upload
from trnctl.transfer import upload_all as upload_all

DEFAULT_SHARD_TOKENS = 1 << 24
# The dataset's completion marker: uploaded after every file it names.
MANIFEST = shard_format.MANIFEST
_READ_BYTES = 64 * MIB


def source_files(source: Path) -> list[Path]:
    """The text files to stage: ``source`` itself, or the ``*.txt`` files directly in it (the
    rule the trainer's ``prepare_corpus`` uses), sorted by name.

    Raises:
        TrnctlError: ``source`` does not exist or holds no ``.txt`` file (USAGE).
    """
    if source.is_file():
        return [source]
    if not source.is_dir():
        raise TrnctlError(f"source {str(source)!r} does not exist")
    files = sorted(source.glob("*.txt"))
    if not files:
        raise TrnctlError(f"source directory {str(source)!r} has no .txt files")
    return files


def _byte_tokens(files: list[Path]) -> Iterator[np.ndarray]:
    # The trainer's tokenizer "bytes-v1": one token per UTF-8 byte, files concatenated in order.
    for path in files:
        with path.open("rb") as f:
            while chunk := f.read(_READ_BYTES):
                yield np.frombuffer(chunk, dtype=np.uint8)


def build_shards(
    source: Path, workdir: Path, *, shard_tokens: int = DEFAULT_SHARD_TOKENS
) -> dict[str, Any]:
    """Tokenize ``source`` into shards plus manifest under ``workdir`` and verify them with the
    trainer's reader; returns the manifest.

    Args:
        shard_tokens: tokens per shard; default 16M (32 MiB of uint16 per shard).

    Raises:
        TrnctlError: no source text, or the source is empty (USAGE).
        trainer.data.ShardError: the trainer's reader rejects what was written.
    """
    files = source_files(source)
    if sum(f.stat().st_size for f in files) == 0:
        raise TrnctlError(f"source {str(source)!r} holds no text")
    manifest: dict[str, Any] = shard_format.write_dataset(
        workdir,
        _byte_tokens(files),
        vocab_size=256,
        tokenizer=shard_format.BYTE_TOKENIZER,
        shard_tokens=shard_tokens,
    )
    shard_format.open_dataset(workdir, verify=True)
    return manifest


def is_prepared(source: Path) -> bool:
    """True when ``source`` is a directory that ``trn-train prepare-data`` wrote (it holds a
    ``manifest.json``): staged as it is, not tokenized again."""
    return source.is_dir() and (source / shard_format.MANIFEST).is_file()


def check_prepared(source: Path) -> dict[str, Any]:
    """The manifest of a prepared dataset, after the trainer's reader has checked every file it
    names (headers, sizes and full SHA-256s of shards, masks and held-out shards).

    Raises:
        TrnctlError: a file is missing, truncated or fails its checksum (USAGE); nothing is
            uploaded.
    """
    try:
        shard_format.open_dataset(source, verify=True)
    except shard_format.ShardError as error:
        raise TrnctlError(
            f"prepared dataset {str(source)!r}: {error}; run `trn-train prepare-data` again"
        ) from error
    manifest: dict[str, Any] = json.loads((source / shard_format.MANIFEST).read_text())
    return manifest


def manifest_sha256(workdir: Path) -> str:
    """The SHA-256 of the staged ``manifest.json``: the dataset's identity, as the trainer
    records it in each checkpoint."""
    return hashlib.sha256((workdir / shard_format.MANIFEST).read_bytes()).hexdigest()


def uploads(workdir: Path, manifest: dict[str, Any], dest: S3Prefix) -> list[Upload]:
    """Every file the manifest names (shards, their masks, held-out shards) in manifest order,
    then the manifest itself, so that a reader never finds a manifest that names a file not yet
    uploaded."""
    items = [
        Upload(workdir / name, dest.key(name), digest)
        for name, digest in shard_format.dataset_files(manifest)
    ]
    manifest_path = workdir / shard_format.MANIFEST
    digest = manifest_sha256(workdir)
    return [*items, Upload(manifest_path, dest.key(shard_format.MANIFEST), digest)]
