"""Uploads to S3 that a rerun can skip, and the directories staged whole that jobs read: what
``trnctl data stage``, ``trnctl model stage`` and ``trnctl code stage`` share.

An object counts as already uploaded when it has the file's size and carries the file's SHA-256 in
the ``sha256`` metadata that :func:`upload_all` writes; S3 itself verifies each part's SHA-256
checksum on upload, and a multipart upload that did not complete leaves no object.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig

from trn_catalog import hf_models as hf
from trn_catalog import workspace as ws
from trnctl.errors import ExitCode, TrnctlError

MIB = 1 << 20
# S3's smallest part (except the last) is 5 MiB; 8 MiB is boto3's default part size.
MIN_PART_MIB = 5
DEFAULT_PART_MIB = 8
SHA256_METADATA = "sha256"
_READ_BYTES = 8 * MIB


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


@dataclass(frozen=True)
class Upload:
    """One file to put at ``key`` and its SHA-256."""

    path: Path
    key: str
    sha256: str

    @property
    def size(self) -> int:
        return self.path.stat().st_size


@dataclass(frozen=True)
class Copy:
    """One object to copy within S3, from ``source_bucket``/``source_key`` to ``key``."""

    source_bucket: str
    source_key: str
    key: str
    size: int


def copy_all(s3: Any, items: list[Copy], dest: S3Prefix) -> None:
    """Copies ``items`` into ``dest``'s bucket in order, server-side (boto3's managed copy: a
    multipart copy above 8 MiB, so objects over CopyObject's 5 GB limit copy too), asking S3 to
    store a SHA-256 checksum of each copy.

    Raises:
        botocore.exceptions.ClientError: S3 refused a copy (no such source, access denied).
    """
    for item in items:
        s3.copy(
            {"Bucket": item.source_bucket, "Key": item.source_key},
            dest.bucket,
            item.key,
            ExtraArgs={"ChecksumAlgorithm": "SHA256"},
        )


def sha256_file(path: Path) -> str:
    """The SHA-256 of the file at ``path``, read in 8 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_READ_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def head(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """The HEAD response of ``bucket``/``key``, or None when there is no such object.

    Raises:
        botocore.exceptions.ClientError: any error but a missing object (access denied).
    """
    try:
        response: dict[str, Any] = s3.head_object(Bucket=bucket, Key=key)
    except s3.exceptions.ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    return response


def is_intact(s3: Any, bucket: str, upload: Upload) -> bool:
    """Whether ``bucket`` already holds ``upload`` whole: same size, same recorded SHA-256.

    Raises:
        botocore.exceptions.ClientError: any error but a missing object (access denied).
    """
    found = head(s3, bucket, upload.key)
    return bool(
        found is not None
        and found["ContentLength"] == upload.size
        and found.get("Metadata", {}).get(SHA256_METADATA) == upload.sha256
    )


@dataclass(frozen=True)
class StagedArea:
    """Directories staged whole under ``top/NAME/`` of the datasets bucket (``code``,
    ``models``): their names, where they live, how a job refers to them and reads them.

    ``last_file`` is the file a stage uploads last, so present only once the stage finished.
    """

    top: str
    what: str
    option: str
    last_file: str

    def validate_name(self, name: str) -> str:
        """``name`` if it can name a staged directory (:data:`trn_catalog.hf_models.MODEL_NAME`:
        one path segment that is also a Kubernetes label value).

        Raises:
            TrnctlError: USAGE, naming the rule that ``name`` breaks.
        """
        if not hf.MODEL_NAME.match(name):
            raise TrnctlError(f"{self.what} name {name!r} is not allowed: use {hf.MODEL_NAME_RULE}")
        return name

    def name_of(self, ref: str) -> str:
        """The NAME of ``top/NAME`` (a trailing ``/`` is ignored), as the job option takes it.

        Raises:
            TrnctlError: USAGE when ``ref`` is not ``top/NAME`` or NAME breaks the name rule.
        """
        head, _, name = ref.rstrip("/").partition("/")
        if head != self.top or not name or "/" in name:
            raise TrnctlError(
                f"{self.option} {ref!r} is not {self.top}/NAME ({self.what} staged with "
                f"{self.stage_command('NAME', 'E')})"
            )
        return self.validate_name(name)

    def prefix(self, bucket: str, name: str) -> S3Prefix:
        """Where ``name`` lives in ``bucket``: ``s3://bucket/top/NAME/``."""
        return S3Prefix(bucket, f"{self.top}/{name}/")

    def pod_path(self, name: str) -> str:
        """Where a job's pods read ``name``: under the datasets mount."""
        return f"{ws.DATASETS_MOUNT}/{self.top}/{name}"

    def stage_command(self, name: str, env: str) -> str:
        return f"trnctl {self.what} stage DIR {name} --env {env}"

    def require_staged(self, s3: Any, bucket: str, name: str, env: str) -> None:
        """Refuses ``name`` unless its stage finished (``last_file`` is there).

        Raises:
            TrnctlError: NOT_FOUND, naming the directory and the command that stages it.
            botocore.exceptions.ClientError: S3 refused the HEAD request (access denied).
        """
        dest = self.prefix(bucket, name)
        if head(s3, dest.bucket, dest.key(self.last_file)) is None:
            raise TrnctlError(
                f"{self.what} {self.top}/{name} is not staged: {dest}{self.last_file} does not "
                f"exist; stage it first with: {self.stage_command(name, env)}",
                ExitCode.NOT_FOUND,
            )


def retract(s3: Any, bucket: str, marker: str) -> None:
    """Deletes the completion marker ``marker`` (a staged directory's manifest or last file)
    before a stage uploads anything: a stage stopped midway then leaves no marker, rather than an
    earlier stage's naming files that this one has started to replace.

    Raises:
        botocore.exceptions.ClientError: S3 refused the delete (access denied, no bucket).
    """
    s3.delete_object(Bucket=bucket, Key=marker)


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
