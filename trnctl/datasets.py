"""Versioned datasets: ``datasets/NAME/vN/`` in the datasets bucket (see :mod:`trnctl.versioning`).

``trnctl data stage DIR NAME --env E`` (or ``datasets/NAME``) stages a new version: it claims the
next number, uploads the shards and the manifest last (:func:`trnctl.commands.common.upload`),
marks the record complete and then moves ``datasets/NAME/latest``. Jobs take ``--data
datasets/NAME`` (the version ``latest`` names, resolved when the job is submitted and recorded
with it) or ``--data datasets/NAME@v3``; any other prefix is staged and read as before.

The version's identity is the SHA-256 of its ``manifest.json``, which pins every shard's SHA-256
and is what the trainer records in its checkpoints.

Standard library and boto3 only (no torch): ``job submit`` resolves data through here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trn_catalog import hf_models as hf
from trnctl import transfer, versioning
from trnctl.errors import ExitCode, TrnctlError
from trnctl.transfer import S3Prefix, Upload
from trnctl.versioning import DATASETS, Ref

# The trainer's manifest (trainer.data.MANIFEST), the dataset's completion marker.
MANIFEST = "manifest.json"


def stage_target(dest: str, with_env: bool) -> Ref | None:
    """The dataset a ``data stage`` destination names: ``datasets/NAME``, or with ``--env`` a
    bare ``NAME``; None for any other prefix (staged without versions, as before).

    Raises:
        TrnctlError: USAGE for a bad NAME, or a version in a destination (versions are
            numbered by the stage).
    """
    text = dest.strip().rstrip("/")
    if with_env and "/" not in text and "@" not in text and hf.MODEL_NAME.match(text):
        text = f"{DATASETS}/{text}"
    ref = versioning.parse(text, DATASETS, "destination")
    if ref is not None and ref.version is not None:
        raise TrnctlError(
            f"destination {dest!r}: a stage makes the next version of {ref.root} itself; "
            f"stage to {ref.root}"
        )
    return ref


def stage_command(ref: Ref, env: str) -> str:
    return f"trnctl data stage DIR {ref.root} --env {env}"


def stage_version(
    s3: Any,
    bucket: str,
    ref: Ref,
    *,
    record: dict[str, Any],
    items_at: Callable[[S3Prefix], list[Upload]],
    upload: Callable[[list[Upload], S3Prefix, str], list[Upload]],
) -> versioning.Staged[Upload]:
    """Stages a version of ``ref``'s dataset (:func:`trnctl.versioning.stage`, the manifest
    last) and then moves ``datasets/NAME/latest`` to it.

    Raises:
        TrnctlError: see :func:`trnctl.versioning.stage` and
            :func:`~trnctl.versioning.point_latest`.
        botocore.exceptions.ClientError: S3 refused a call.
    """
    staged = versioning.stage(
        s3, bucket, ref, record=record, items_at=items_at, upload=upload, marker=MANIFEST
    )
    pointed = versioning.point_latest(s3, bucket, staged.version)
    return dataclasses.replace(staged, latest=pointed)


@dataclass(frozen=True)
class ResolvedData:
    """What a job reads: ``path`` under the datasets mount, and for a versioned dataset the
    version and its record."""

    path: str
    version: Ref | None = None
    record: dict[str, Any] | None = None

    @property
    def manifest_sha256(self) -> str | None:
        return None if self.record is None else self.record.get("manifest_sha256")


def resolve(s3: Any, bucket: str, data: str, env: str, option: str = "--data") -> ResolvedData:
    """The exact data ``data`` names: ``datasets/NAME`` the version ``latest`` points at (or,
    staged before versions, ``datasets/NAME`` itself when it holds a ``manifest.json``),
    ``datasets/NAME@vN`` that version; anything else (a prefix, an absolute path) as it is.

    Raises:
        TrnctlError: NOT_FOUND for a dataset or version that is not staged (the message names
            the complete versions and the stage command); USAGE for a bad NAME or version.
        botocore.exceptions.ClientError: S3 refused a read.
    """
    ref = versioning.parse(data, DATASETS, option) if not data.startswith("/") else None
    if ref is None:
        return ResolvedData(data)
    if ref.version is None:
        pointed = versioning.latest(s3, bucket, ref)
        if pointed is None:
            return _unversioned(s3, bucket, ref, env, option)
        ref = ref.at(pointed[0])
    record = versioning.require_version(s3, bucket, ref, lambda: stage_command(ref, env))
    return ResolvedData(ref.path, ref, record)


def _unversioned(s3: Any, bucket: str, ref: Ref, env: str, option: str) -> ResolvedData:
    if transfer.head(s3, bucket, f"{ref.root}/{MANIFEST}") is not None:
        return ResolvedData(ref.root)
    raise TrnctlError(
        f"{option} {ref}: no version of it is staged (s3://{bucket}/{ref.root}/latest does not "
        f"exist) and no manifest.json either; stage it first with: {stage_command(ref, env)}",
        ExitCode.NOT_FOUND,
    )
