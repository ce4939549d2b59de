"""Stage a text corpus in S3 as the trainer's shards: tokenize, shard, verify, upload.

The shard format, the manifest and the byte tokenizer are the trainer's (:mod:`trainer.data`),
imported rather than copied, so that what trnctl stages is what the trainer reads. Importing it
loads torch (about two seconds), which is why the CLI imports this module only for ``data``.

A shard counts as already uploaded when the object has the shard's size and carries its SHA-256
(from the manifest) in the ``sha256`` metadata that this module writes; S3 itself verifies each
part's SHA-256 checksum on upload, and a multipart upload that did not complete leaves no object.

Staging is where shards are hashed in full (written, then read back by the trainer's reader with
every SHA-256 checked); the trainer checks only headers and sizes when it starts, and records the
manifest's SHA-256 (:func:`manifest_sha256`, which pins every shard's) in its checkpoints.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from boto3.s3.transfer import TransferConfig

from trainer import data as shard_format
from trnctl.errors import TrnctlError

MIB = 1 << 20
# S3's smallest part (except the last) is 5 MiB; 8 MiB is boto3's default part size.
MIN_PART_MIB = 5
DEFAULT_PART_MIB = 8
DEFAULT_SHARD_TOKENS = 1 << 24
_READ_BYTES = 64 * MIB
SHA256_METADATA = "sha256"


@dataclass(frozen=True)
class S3Prefix:
    """``s3://bucket/prefix/``; ``prefix`` is empty or ends with ``/``."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, uri: str) -> S3Prefix:
        """Parse ``s3://BUCKET[/PREFIX]``.

        Raises:
            TrnctlError: not an s3:// URI with a bucket name (USAGE).
        """
        if not uri.startswith("s3://") or not uri[5:].split("/", 1)[0]:
            raise TrnctlError(f"{uri!r} is not an S3 location; expected s3://BUCKET/PREFIX")
        bucket, _, prefix = uri[5:].partition("/")
        prefix = prefix.strip("/")
        return cls(bucket, f"{prefix}/" if prefix else "")

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


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


@dataclass(frozen=True)
class Upload:
    """One file to put at ``key``: a shard or the manifest."""

    path: Path
    key: str
    sha256: str

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def manifest_sha256(workdir: Path) -> str:
    """The SHA-256 of the staged ``manifest.json``: the dataset's identity, as the trainer
    records it in each checkpoint."""
    return hashlib.sha256((workdir / shard_format.MANIFEST).read_bytes()).hexdigest()


def uploads(workdir: Path, manifest: dict[str, Any], dest: S3Prefix) -> list[Upload]:
    """The shards in manifest order, then the manifest itself, so that a reader never finds a
    manifest that names a shard not yet uploaded."""
    items = [
        Upload(workdir / s["name"], dest.key(s["name"]), s["sha256"]) for s in manifest["shards"]
    ]
    manifest_path = workdir / shard_format.MANIFEST
    digest = manifest_sha256(workdir)
    return [*items, Upload(manifest_path, dest.key(shard_format.MANIFEST), digest)]


def is_intact(s3: Any, bucket: str, upload: Upload) -> bool:
    """Whether ``bucket`` already holds ``upload`` whole: same size, same recorded SHA-256.

    Raises:
        botocore.exceptions.ClientError: any error but a missing object (access denied).
    """
    try:
        head = s3.head_object(Bucket=bucket, Key=upload.key)
    except s3.exceptions.ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return bool(
        head["ContentLength"] == upload.size
        and head.get("Metadata", {}).get(SHA256_METADATA) == upload.sha256
    )


def pending(s3: Any, items: list[Upload], dest: S3Prefix) -> list[Upload]:
    """The items that ``dest`` does not already hold intact, in order.

    Raises:
        botocore.exceptions.ClientError: S3 refused a HEAD request (access denied, no bucket).
    """
    return [item for item in items if not is_intact(s3, dest.bucket, item)]


def upload_all(
    s3: Any,
    items: list[Upload],
    dest: S3Prefix,
    *,
    part_mib: int = DEFAULT_PART_MIB,
    on_bytes: Callable[[int], None] = lambda sent: None,
) -> None:
    """Upload ``items`` to ``dest``.

    Files larger than ``part_mib`` (default 8) MiB go up as multipart uploads in parts of that
    size; every part carries a SHA-256 checksum that S3 verifies, and the object records the
    file's SHA-256 for :func:`is_intact`. ``on_bytes`` receives each increment sent (a progress
    bar).

    Raises:
        TrnctlError: ``part_mib`` below S3's 5 MiB minimum (USAGE).
        boto3.exceptions.S3UploadFailedError: S3 refused an upload.
    """
    if part_mib < MIN_PART_MIB:
        raise TrnctlError(f"--part-size-mib {part_mib} is below S3's minimum of {MIN_PART_MIB}")
    config = TransferConfig(multipart_threshold=part_mib * MIB, multipart_chunksize=part_mib * MIB)
    for item in items:
        s3.upload_file(
            str(item.path),
            dest.bucket,
            item.key,
            ExtraArgs={"ChecksumAlgorithm": "SHA256", "Metadata": {SHA256_METADATA: item.sha256}},
            Config=config,
            Callback=on_bytes,
        )
