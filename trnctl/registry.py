"""The model registry: versioned models ``models/NAME/vN/`` with manifests that carry lineage and
status, in the datasets bucket (the source of truth; :mod:`trnctl.sagemaker_registry` mirrors it
into SageMaker Model Registry when the environment asks for it).

A model version's manifest is its record ``models/NAME/versions/vN.json``
(:mod:`trnctl.versioning`): how it was made (``source``: staged from a directory, or exported
from a job), its lineage (base model and version, dataset version and manifest SHA-256, the run's
configuration, the job), evaluation results, creation time and who made it, and a ``status`` with
its ``history``: each change with who, why and when.

Statuses: ``candidate`` (registered, not decided), ``promoted`` (approved for service),
``rejected``. The version **in service** is the highest-numbered promoted one: a promotion of a
newer version puts it in service, and ``rollback`` rejects the one in service, which puts the
next promoted one below it back. That is also how SageMaker's approval status reads (the newest
``Approved`` package of a group), so the two stay in step. ``models/NAME`` in a job names the
version in service; ``models/NAME@vN`` names one exactly.

Standard library and boto3 only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trn_catalog import hf_models as hf
from trn_catalog import refs
from trnctl import models, transfer, versioning
from trnctl.errors import ExitCode, TrnctlError, settings_as_usage
from trnctl.transfer import Copy, S3Prefix, Upload
from trnctl.versioning import MODELS, Ref

CANDIDATE, PROMOTED, REJECTED = "candidate", "promoted", "rejected"
STATUSES = (CANDIDATE, PROMOTED, REJECTED)
# Rewrites of a manifest tried when another writer changed it in between.
MAX_UPDATES = 5


def model_ref(text: str, option: str, *, bare: bool = True) -> Ref:
    """The model ``text`` names: ``models/NAME``, ``models/NAME@vN``, or with ``bare`` (default
    True) a plain ``NAME``.

    Raises:
        TrnctlError: USAGE, naming ``option``, for anything else.
    """
    with settings_as_usage(str):
        return Ref(MODELS, *refs.split_model(text, option, bare=bare))


def stage_command(ref: Ref, env: str) -> str:
    return f"trnctl model stage DIR {ref.name} --env {env}"


def content_sha256(files: list[tuple[str, str]]) -> str:
    """The identity of a model directory: the SHA-256 of its files' names and SHA-256s."""
    listing = json.dumps(sorted(files), separators=(",", ":")).encode()
    return hashlib.sha256(listing).hexdigest()


def change(status: str, by: str, reason: str) -> dict[str, str]:
    """One entry of a manifest's history."""
    return {"status": status, "by": by, "reason": reason, "at": versioning.now()}


def in_service(found: dict[int, dict[str, Any]]) -> int | None:
    """The version in service among ``found``: the highest complete and promoted one."""
    serving = [
        n
        for n, r in found.items()
        if r.get("state") == versioning.COMPLETE and r.get("status") == PROMOTED
    ]
    return max(serving, default=None)


@dataclass(frozen=True)
class ResolvedModel:
    """What a job reads: ``path`` under the datasets mount (``models/NAME/vN``, or
    ``models/NAME`` for a model staged before versions), and the version and its manifest."""

    path: str
    version: Ref | None = None
    record: dict[str, Any] | None = None


def resolve(s3: Any, bucket: str, model: str, env: str, option: str = "--model") -> ResolvedModel:
    """The exact model ``model`` names: ``models/NAME`` the version in service (or, staged
    before versions, ``models/NAME`` itself when its ``config.json`` is there), ``models/NAME@vN``
    that version (complete, whatever its status).

    Raises:
        TrnctlError: USAGE for a bad reference; NOT_FOUND for a model or version not staged, or
            a model none of whose versions is promoted (the message lists them).
        botocore.exceptions.ClientError: S3 refused a read.
    """
    ref = model_ref(model, option, bare=False)
    if ref.version is not None:
        record = versioning.require_version(s3, bucket, ref, lambda: stage_command(ref, env))
        return ResolvedModel(ref.path, ref, record)
    found = versioning.records(s3, bucket, ref)
    serving = in_service(found)
    if serving is not None:
        return ResolvedModel(ref.at(serving).path, ref.at(serving), found[serving])
    if versioning.newest_complete(found) is not None:
        raise TrnctlError(
            f"{option} {ref}: no version is promoted ({describe(found)}); pass {ref}@vN or "
            f"promote one with: trnctl model promote {ref}@vN --env {env} --reason ...",
            ExitCode.NOT_FOUND,
        )
    if transfer.head(s3, bucket, f"{ref.root}/{hf.CONFIG_FILE}") is not None:
        return ResolvedModel(ref.root)
    raise TrnctlError(
        f"{option} {ref}: model {ref.root} is not staged (no version, and no "
        f"s3://{bucket}/{ref.root}/{hf.CONFIG_FILE}); stage it first with: "
        f"{stage_command(ref, env)}",
        ExitCode.NOT_FOUND,
    )


def describe(found: dict[int, dict[str, Any]]) -> str:
    """``v1 promoted, v2 rejected`` of the complete versions among ``found``."""
    done = [
        f"{versioning.version_label(n)} {r.get('status', '?')}"
        for n, r in found.items()
        if r.get("state") == versioning.COMPLETE
    ]
    return ", ".join(done) or "none complete"


def describe_source(record: dict[str, Any]) -> str:
    """Where a version came from, in words: ``staged from DIR`` or ``exported from URI``."""
    source = record.get("source") or {}
    if source.get("kind") == "export":
        job = (record.get("lineage") or {}).get("job")
        return f"exported from {source.get('uri')}" + (f" (job {job})" if job else "")
    return f"staged from {source.get('path', '?')}"


def complete_record(s3: Any, bucket: str, ref: Ref) -> dict[str, Any]:
    """The manifest of the complete version ``ref`` names (``models/NAME@vN``).

    Raises:
        TrnctlError: USAGE without a version; NOT_FOUND for a version not complete.
    """
    if ref.version is None:
        raise TrnctlError(f"{ref}: name the version, e.g. {ref}@v3")
    return versioning.require_version(s3, bucket, ref, lambda: "see trnctl model list")


def update(
    s3: Any, bucket: str, ref: Ref, edit: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """Rewrites the manifest of ``ref`` as ``edit`` returns it, conditionally on the ETag it
    read, so that two writers (a pipeline and a person) never lose each other's change; returns
    the manifest written.

    Raises:
        TrnctlError: NOT_FOUND without such a manifest; FAILED when it kept changing.
        botocore.exceptions.ClientError: S3 refused a call.
    """
    for _ in range(MAX_UPDATES):
        found = versioning.get_json(s3, bucket, ref.record_key())
        if found is None:
            raise TrnctlError(f"{ref} has no manifest", ExitCode.NOT_FOUND)
        edited = edit(found[0])
        if versioning.put_json(s3, bucket, ref.record_key(), edited, if_match=found[1]):
            return edited
    raise TrnctlError(f"the manifest of {ref} kept changing; run again", ExitCode.FAILED)


def set_status(s3: Any, bucket: str, ref: Ref, status: str, by: str, reason: str) -> dict[str, Any]:
    """Sets ``ref``'s status and appends the change to its history; returns the manifest.

    Raises:
        TrnctlError: see :func:`update`.
    """

    def edit(record: dict[str, Any]) -> dict[str, Any]:
        history = [*record.get("history", []), change(status, by, reason)]
        return {**record, "status": status, "history": history}

    return update(s3, bucket, ref, edit)


def promote(
    s3: Any, bucket: str, ref: Ref, by: str, reason: str
) -> tuple[dict[str, Any], int | None]:
    """Promotes the complete version ``ref`` (it goes into service); returns its manifest and
    the version that was in service before.

    Raises:
        TrnctlError: USAGE when it is promoted already, or older than the version in service
            (roll that back instead: promoting an older version would not put it in service);
            NOT_FOUND for a version not complete.
    """
    complete_record(s3, bucket, ref)
    found = versioning.records(s3, bucket, ref)
    serving = in_service(found)
    if found[ref.number].get("status") == PROMOTED:
        raise TrnctlError(f"{ref} is promoted already ({describe(found)})")
    if serving is not None and ref.number < serving:
        raise TrnctlError(
            f"{ref} is older than {versioning.version_label(serving)}, which is in service: "
            f"roll that back (trnctl model rollback {ref.root}) to return to an older version"
        )
    return set_status(s3, bucket, ref, PROMOTED, by, reason), serving


def rollback(s3: Any, bucket: str, ref: Ref, by: str, reason: str) -> tuple[Ref, int | None]:
    """Rejects the version of ``ref``'s NAME in service; returns it and the version in service
    now (the next promoted one below it; None when there is none).

    Raises:
        TrnctlError: NOT_FOUND when no version is in service.
    """
    found = versioning.records(s3, bucket, ref)
    serving = in_service(found)
    if serving is None:
        raise TrnctlError(
            f"{ref.root} has no version in service to roll back ({describe(found)})",
            ExitCode.NOT_FOUND,
        )
    set_status(s3, bucket, ref.at(serving), REJECTED, by, f"rolled back: {reason}")
    found[serving] = {**found[serving], "status": REJECTED}
    return ref.at(serving), in_service(found)


def stage_dir(
    s3: Any,
    bucket: str,
    ref: Ref,
    model: models.ModelDir,
    *,
    by: str,
    upload: Callable[[list[Upload], S3Prefix, str], list[Upload]],
) -> versioning.Staged[Upload]:
    """Stages the local model directory ``model`` as a version of ``ref``'s NAME (the same files
    as a complete version already holds: that version), ``config.json`` last, promoted by ``by``
    (a staged model is put into service by the person who stages it).

    Raises:
        TrnctlError: see :func:`trnctl.versioning.stage`.
    """
    sha256s = models.digests(model)
    reason = "staged with trnctl model stage"
    record = {
        "content_sha256": content_sha256(list(sha256s.items())),
        "architecture": model.architecture,
        "source": {"kind": "staged", "path": str(model.root.resolve())},
        "created_at": versioning.now(),
        "created_by": by,
    }
    return versioning.stage(
        s3,
        bucket,
        ref,
        record=record,
        items_at=lambda where: models.uploads(model, where, sha256s),
        upload=upload,
        marker=hf.CONFIG_FILE,
        on_complete={"status": PROMOTED, "history": [change(PROMOTED, by, reason)]},
    )


def register_export(
    s3: Any,
    bucket: str,
    ref: Ref,
    export: S3Prefix,
    *,
    by: str,
    lineage: dict[str, Any],
    reason: str,
) -> versioning.Staged[Copy]:
    """Registers the model directory at ``export`` (a ``trn-train export`` in the checkpoints
    bucket, after :func:`trnctl.models.check`) as a ``candidate`` version of ``ref``'s NAME:
    copies its files into ``models/NAME/vN/`` (weights first, ``config.json`` last) and writes
    the manifest with ``lineage``. The same export registered again is the same version.

    Raises:
        TrnctlError: USAGE when ``export`` does not hold a whole model (a file missing, a
            truncated weights file, an adapter-only export); see also
            :func:`trnctl.versioning.stage`.
        botocore.exceptions.ClientError: S3 refused a call.
    """
    files = models.S3Files.listed(s3, export)
    architecture, weights = models.check(files, str(export))
    record = {
        "content_sha256": hashlib.sha256(str(export).encode()).hexdigest(),
        "architecture": architecture,
        "source": {"kind": "export", "uri": str(export)},
        "lineage": lineage,
        "created_at": versioning.now(),
        "created_by": by,
    }

    def copy(items: list[Copy], where: S3Prefix, marker: str) -> list[Copy]:
        transfer.retract(s3, where.bucket, marker)
        transfer.copy_all(s3, items, where)
        return items

    return versioning.stage(
        s3,
        bucket,
        ref,
        record=record,
        items_at=lambda where: models.export_copies(files, weights, where),
        upload=copy,
        marker=hf.CONFIG_FILE,
        on_complete={"status": CANDIDATE, "history": [change(CANDIDATE, by, reason)]},
    )
