"""Immutable versions of datasets and models in the datasets bucket.

A versioned dataset or model ``NAME`` of an area (``datasets`` or ``models``) lives under
``AREA/NAME/`` as:

- ``vN/``: the files of version N, written once;
- ``versions/vN.json``: the version's record, claimed (written first, ``state`` ``staging``)
  with an S3 conditional write that fails when the key exists, so that two stages never take the
  same number, and rewritten ``complete`` once every file of the version is uploaded (the
  dataset's manifest, the model's ``config.json``, last of all);
- ``latest`` (datasets): which version a job gets for ``datasets/NAME``, moved only after the
  record says ``complete``, and only forward (a conditional write on the ETag it read).

A stage stopped anywhere leaves ``latest`` where it was; the next stage of the same content
resumes the claimed version (same content SHA-256), and a stage of content that an existing
version already holds makes no new version. Data staged before versions existed (a prefix with
its own ``manifest.json``, or ``models/NAME/config.json``) keeps working.

S3 conditional writes (``If-None-Match: *`` and ``If-Match`` on PutObject) are in the S3 user
guide, "Add preconditions to S3 operations with conditional requests"; a lost race answers 412
PreconditionFailed, or 409 ConditionalRequestConflict while another write of the key is in
flight.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from trn_catalog import refs
from trnctl.errors import ExitCode, TrnctlError, settings_as_usage
from trnctl.transfer import S3Prefix

DATASETS = refs.DATASETS
MODELS = refs.MODELS
RECORDS_DIR = "versions"
LATEST = "latest"
STAGING, COMPLETE = "staging", "complete"
_LOST_RACE = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
# Claims tried before giving up: each lost one means another stage took that number meanwhile.
MAX_CLAIMS = 20


def version_label(number: int) -> str:
    """``v3`` for 3."""
    return f"v{number}"


@dataclass(frozen=True)
class Ref:
    """``AREA/NAME`` (``version`` None: the newest, or for models the one in service) or
    ``AREA/NAME@vN``."""

    area: str
    name: str
    version: int | None = None

    def __str__(self) -> str:
        suffix = f"@{version_label(self.version)}" if self.version is not None else ""
        return f"{self.area}/{self.name}{suffix}"

    def at(self, version: int) -> Ref:
        return Ref(self.area, self.name, version)

    @property
    def root(self) -> str:
        """``AREA/NAME``: where the versions live."""
        return f"{self.area}/{self.name}"

    @property
    def path(self) -> str:
        """``AREA/NAME/vN``, the version's directory (the bucket's key prefix, and the path
        under the datasets mount in pods). Raises ValueError without a version."""
        if self.version is None:
            raise ValueError(f"{self} names no version")
        return f"{self.root}/{version_label(self.version)}"

    def prefix(self, bucket: str) -> S3Prefix:
        return S3Prefix(bucket, f"{self.path}/")

    def record_key(self) -> str:
        return f"{self.root}/{RECORDS_DIR}/{version_label(self.number)}.json"

    @property
    def number(self) -> int:
        """The version number. Raises ValueError without a version."""
        if self.version is None:
            raise ValueError(f"{self} names no version")
        return self.version


def parse(text: str, area: str, option: str) -> Ref | None:
    """The :class:`Ref` of ``text`` when it is ``AREA/NAME`` or ``AREA/NAME@vN`` (a trailing
    ``/`` ignored); None when it names something outside ``area`` (a plain prefix, staged
    before versions existed).

    Raises:
        TrnctlError: USAGE, naming ``option``, for a bad NAME or version.
    """
    with settings_as_usage(str):
        found = refs.split(text, area, option)
    return None if found is None else Ref(area, *found)


def now() -> str:
    """The current UTC time as ISO-8601 with Z, as records store it."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def get_json(s3: Any, bucket: str, key: str) -> tuple[dict[str, Any], str] | None:
    """The JSON object at ``key`` and its ETag, or None when there is none.

    Raises:
        TrnctlError: FAILED when the object is not a JSON object.
        botocore.exceptions.ClientError: any S3 error but a missing key.
    """
    try:
        found = s3.get_object(Bucket=bucket, Key=key)
    except s3.exceptions.NoSuchKey:
        return None
    try:
        value = json.loads(found["Body"].read())
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise TrnctlError(f"s3://{bucket}/{key} is not a JSON object", ExitCode.FAILED)
    return value, str(found["ETag"])


def put_json(
    s3: Any,
    bucket: str,
    key: str,
    value: dict[str, Any],
    *,
    if_none_match: bool = False,
    if_match: str | None = None,
) -> bool:
    """Writes ``value`` at ``key``; with ``if_none_match`` only if the key does not exist, with
    ``if_match`` only if its ETag is still that. False when such a condition failed.

    Raises:
        botocore.exceptions.ClientError: any other S3 error.
    """
    extra: dict[str, str] = {}
    if if_none_match:
        extra["IfNoneMatch"] = "*"
    if if_match is not None:
        extra["IfMatch"] = if_match
    body = json.dumps(value, indent=1, sort_keys=True).encode()
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json", **extra)
    except s3.exceptions.ClientError as error:
        if extra and error.response.get("Error", {}).get("Code") in _LOST_RACE:
            return False
        raise
    return True


def records(s3: Any, bucket: str, ref: Ref) -> dict[int, dict[str, Any]]:
    """Every version record of ``ref``'s NAME, by number.

    Raises:
        botocore.exceptions.ClientError: S3 refused the listing or a read.
    """
    prefix = f"{ref.root}/{RECORDS_DIR}/"
    found: dict[int, dict[str, Any]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            number = refs.parse_version(item["Key"][len(prefix) :].removesuffix(".json"))
            record = get_json(s3, bucket, item["Key"]) if number is not None else None
            if number is not None and record is not None:
                found[number] = record[0]
    return dict(sorted(found.items()))


def claim(s3: Any, bucket: str, ref: Ref, record: dict[str, Any]) -> Ref:
    """Takes the next free version number of ``ref``'s NAME by writing its record (``state``
    ``staging`` and ``record``'s fields) where none exists; returns the claimed version.

    Raises:
        TrnctlError: FAILED after :data:`MAX_CLAIMS` numbers were taken by other stages.
        botocore.exceptions.ClientError: any other S3 error.
    """
    taken = max(records(s3, bucket, ref), default=0)
    for number in range(taken + 1, taken + 1 + MAX_CLAIMS):
        mine = ref.at(number)
        body = {**record, "name": ref.name, "version": version_label(number), "state": STAGING}
        if put_json(s3, bucket, mine.record_key(), body, if_none_match=True):
            return mine
    raise TrnctlError(
        f"{ref.root}: {MAX_CLAIMS} version numbers after v{taken} were taken while this stage "
        "tried to claim one; run it again",
        ExitCode.FAILED,
    )


def reusable(
    found: dict[int, dict[str, Any]], content_sha256: str
) -> tuple[int, dict[str, Any]] | None:
    """The version among ``found`` to reuse for content of ``content_sha256``: a complete one
    that holds it (nothing to stage), else the newest staging one claimed for it (a stage
    stopped midway, to resume)."""
    same = [(n, r) for n, r in found.items() if r.get("content_sha256") == content_sha256]
    complete = [(n, r) for n, r in same if r.get("state") == COMPLETE]
    staging = [(n, r) for n, r in same if r.get("state") == STAGING]
    if complete:
        return complete[-1]
    return staging[-1] if staging else None


def latest(s3: Any, bucket: str, ref: Ref) -> tuple[int, str] | None:
    """The version ``AREA/NAME/latest`` points at and the pointer's ETag; None without one.

    Raises:
        TrnctlError: FAILED for a pointer that names no version.
    """
    found = get_json(s3, bucket, f"{ref.root}/{LATEST}")
    if found is None:
        return None
    number = refs.parse_version(str(found[0].get("version", "")))
    if number is None:
        raise TrnctlError(
            f"s3://{bucket}/{ref.root}/{LATEST} names no version: {found[0]!r}", ExitCode.FAILED
        )
    return number, found[1]


def point_latest(s3: Any, bucket: str, version: Ref) -> int:
    """Moves ``AREA/NAME/latest`` to ``version`` unless it already points at it or a newer one
    (another stage finished later with a higher number); returns the version it points at.

    Raises:
        TrnctlError: FAILED when the pointer kept changing under it.
        botocore.exceptions.ClientError: any other S3 error.
    """
    key = f"{version.root}/{LATEST}"
    for _ in range(MAX_CLAIMS):
        current = latest(s3, bucket, version)
        if current is not None and current[0] >= version.number:
            return current[0]
        body = {"version": version_label(version.number), "updated_at": now()}
        if current is None:
            written = put_json(s3, bucket, key, body, if_none_match=True)
        else:
            written = put_json(s3, bucket, key, body, if_match=current[1])
        if written:
            return version.number
    raise TrnctlError(f"s3://{bucket}/{key} kept changing; run the stage again", ExitCode.FAILED)


def complete(
    s3: Any, bucket: str, version: Ref, record: dict[str, Any], **fields: Any
) -> dict[str, Any]:
    """Rewrites the version's record as ``complete`` with ``fields`` added; returns it."""
    done = {**record, **fields, "state": COMPLETE}
    put_json(s3, bucket, version.record_key(), done)
    return done


def newest_complete(found: dict[int, dict[str, Any]]) -> int | None:
    done = [n for n, r in found.items() if r.get("state") == COMPLETE]
    return done[-1] if done else None


def describe_versions(found: dict[int, dict[str, Any]]) -> str:
    done = [version_label(n) for n, r in found.items() if r.get("state") == COMPLETE]
    return ", ".join(done) or "none complete"


def require_version(
    s3: Any, bucket: str, ref: Ref, stage_hint: Callable[[], str]
) -> dict[str, Any]:
    """The record of ``ref``'s version, which must be complete.

    Raises:
        TrnctlError: NOT_FOUND naming the versions there are and how to stage one.
    """
    found = records(s3, bucket, ref)
    record = found.get(ref.number)
    if record is None or record.get("state") != COMPLETE:
        state = "is still staging (or its stage stopped)" if record else "does not exist"
        raise TrnctlError(
            f"{ref} {state}; complete versions of {ref.root}: {describe_versions(found)} "
            f"({stage_hint()})",
            ExitCode.NOT_FOUND,
        )
    return record


class Item(Protocol):
    """A file of a version: where it goes and its size (an upload or a copy)."""

    @property
    def key(self) -> str: ...

    @property
    def size(self) -> int: ...


ItemT = TypeVar("ItemT", bound=Item)


@dataclass(frozen=True)
class Staged(Generic[ItemT]):
    """What :func:`stage` did: the version, its files and those uploaded now (none when an
    existing version already held the content: ``reused``), its complete record, and the
    version ``latest`` points at (datasets; None where the area has no pointer)."""

    version: Ref
    items: list[ItemT]
    uploaded: list[ItemT]
    reused: bool
    record: dict[str, Any]
    latest: int | None = None


def stage(
    s3: Any,
    bucket: str,
    ref: Ref,
    *,
    record: dict[str, Any],
    items_at: Callable[[S3Prefix], list[ItemT]],
    upload: Callable[[list[ItemT], S3Prefix, str], list[ItemT]],
    marker: str,
    on_complete: dict[str, Any] | None = None,
) -> Staged[ItemT]:
    """Stages a version of ``ref``'s NAME: reuses the complete version that already holds this
    content (``record['content_sha256']``), or resumes the one a stopped stage claimed for it,
    else claims the next number (:func:`claim`); uploads ``items_at(prefix)`` through
    ``upload(items, prefix, marker_key)``, the file ``marker`` last; then rewrites the record
    ``complete`` with the size, the file count and ``on_complete``.

    Raises:
        TrnctlError: see :func:`claim`.
        botocore.exceptions.ClientError: S3 refused a call.
    """
    found = records(s3, bucket, ref)
    reuse = reusable(found, str(record["content_sha256"]))
    if reuse is not None and reuse[1].get("state") == COMPLETE:
        version = ref.at(reuse[0])
        return Staged(version, items_at(version.prefix(bucket)), [], True, reuse[1])
    if reuse is not None:
        version, claimed = ref.at(reuse[0]), reuse[1]
    else:
        version = claim(s3, bucket, ref, record)
        claimed = {**record, "name": ref.name, "version": version_label(version.number)}
    location = version.prefix(bucket)
    items = items_at(location)
    uploaded = upload(items, location, location.key(marker))
    done = complete(
        s3,
        bucket,
        version,
        claimed,
        bytes=sum(i.size for i in items),
        files=len(items),
        **(on_complete or {}),
    )
    return Staged(version, items, uploaded, False, done)
