"""Your own training code in the datasets bucket: stage a directory, find it from a job.

``trnctl code stage DIR NAME`` uploads the files of ``DIR`` (its subdirectories too) to
``code/NAME/`` in the environment's datasets bucket through :mod:`trnctl.transfer` (SHA-256
checksums, intact files skipped on a rerun), and then, last, a manifest :data:`MANIFEST` listing
every file with its size and SHA-256; a stage with anything to upload first deletes the manifest
an earlier stage wrote. A prefix with that manifest was staged whole: that is what
``trnctl job submit --code code/NAME -- COMMAND`` checks (:func:`require_staged`) before it runs
``COMMAND`` in ``/datasets/code/NAME`` (:func:`pod_path`), where the runtime mounts the bucket
read-only (Mountpoint for S3).

Left out of a stage: hidden files and directories (``.git``, ``.venv``), ``__pycache__`` and
compiled ``*.pyc`` files, and symbolic links (an object store has none).

Standard library and boto3 only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trnctl import transfer
from trnctl.errors import TrnctlError
from trnctl.transfer import S3Prefix, Upload, sha256_file

CODE_PREFIX = "code"
MANIFEST = "trnctl-code.json"
_LEFT_OUT_DIRS = ("__pycache__",)
_LEFT_OUT_SUFFIXES = (".pyc",)


AREA = transfer.StagedArea(top=CODE_PREFIX, what="code", option="--code", last_file=MANIFEST)
validate_name = AREA.validate_name
name_of = AREA.name_of
prefix = AREA.prefix
pod_path = AREA.pod_path
require_staged = AREA.require_staged


@dataclass(frozen=True)
class CodeDir:
    """A directory to stage: the files to upload (POSIX paths relative to ``root``, sorted) and
    what was left out."""

    root: Path
    files: tuple[str, ...]
    skipped: tuple[str, ...]


def _left_out(relative: Path, path: Path) -> bool:
    return (
        any(part.startswith(".") or part in _LEFT_OUT_DIRS for part in relative.parts)
        or path.is_symlink()
        or path.name.endswith(_LEFT_OUT_SUFFIXES)
    )


def inspect(root: Path) -> CodeDir:
    """The files of ``root`` to stage.

    Raises:
        TrnctlError: USAGE when ``root`` is not a directory, holds no file to stage, or holds a
            file named :data:`MANIFEST` (the name the stage writes).
    """
    if not root.is_dir():
        raise TrnctlError(f"{root} is not a directory; stage a directory of code")
    files: list[str] = []
    skipped: list[str] = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if _left_out(relative, path):
            skipped.append(relative.as_posix())
        elif path.is_file():
            files.append(relative.as_posix())
    if MANIFEST in files:
        raise TrnctlError(f"{root / MANIFEST}: the stage writes a file of that name; rename it")
    if not files:
        raise TrnctlError(f"{root} holds no file to stage (hidden files and caches are left out)")
    return CodeDir(root, tuple(files), tuple(_top_level(skipped)))


def _top_level(skipped: list[str]) -> list[str]:
    """Skipped paths without those inside a skipped directory (``.git``, not each of its files)."""
    kept: list[str] = []
    for path in skipped:
        if not any(path.startswith(f"{parent}/") for parent in kept):
            kept.append(path)
    return kept


def uploads(code: CodeDir, dest: S3Prefix) -> list[Upload]:
    """The uploads of ``code``'s files to ``dest``, each with its SHA-256 (which reads every
    file once)."""
    return [
        Upload(code.root / name, dest.key(name), sha256_file(code.root / name))
        for name in code.files
    ]


def manifest(items: list[Upload], dest: S3Prefix) -> bytes:
    """The manifest the stage writes last: each file's path under ``dest``, size and SHA-256."""
    files = [
        {"path": item.key.removeprefix(dest.prefix), "size": item.size, "sha256": item.sha256}
        for item in items
    ]
    return json.dumps({"files": files}, indent=1, sort_keys=True).encode()


def stale_keys(s3: Any, dest: S3Prefix, items: list[Upload]) -> list[str]:
    """Objects under ``dest`` that are neither a staged file nor the manifest: files deleted or
    renamed since an earlier stage, which jobs still see under the mount.

    Raises:
        botocore.exceptions.ClientError: S3 refused the listing (access denied, no bucket).
    """
    wanted = {item.key for item in items} | {dest.key(MANIFEST)}
    found: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=dest.bucket, Prefix=dest.prefix
    ):
        found += [o["Key"] for o in page.get("Contents", []) if o["Key"] not in wanted]
    return found
