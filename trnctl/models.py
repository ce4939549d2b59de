"""Hugging Face model directories in the datasets bucket: check, stage, find.

``trnctl model stage DIR NAME`` checks that ``DIR`` is a model the trainer reads (see
:func:`inspect`) and uploads it to ``models/NAME/`` in the environment's datasets bucket through
:mod:`trnctl.transfer` (multipart, SHA-256 checksums, intact files skipped on a rerun).
``config.json`` goes up last, and a stage with anything to upload deletes it before its first
upload, so a model whose ``config.json`` is in the bucket was staged whole: that is what
``trnctl job submit --model models/NAME`` checks (:func:`require_staged`).

Jobs read the model where they read their data: the runtime mounts the datasets bucket read-only
at ``/datasets`` (Mountpoint for S3), so ``models/NAME`` is ``/datasets/models/NAME`` in every
pod (:func:`pod_path`).

Standard library and boto3 only: the safetensors headers are read with ``struct`` and ``json``,
not with torch or the safetensors package.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trn_catalog import hf_models as hf
from trnctl import transfer
from trnctl.errors import TrnctlError
from trnctl.transfer import Copy, S3Prefix, Upload, sha256_file

AREA = transfer.StagedArea(
    top=hf.MODELS_PREFIX, what="model", option="--model", last_file=hf.CONFIG_FILE
)
validate_name = AREA.validate_name
name_of = AREA.name_of
prefix = AREA.prefix
pod_path = AREA.pod_path
require_staged = AREA.require_staged


class Files(Protocol):
    """A directory of a model to check, on disk or in S3: what :func:`check` reads."""

    def label(self, name: str) -> str:
        """How messages name the file ``name``."""

    def size(self, name: str) -> int | None:
        """The size of ``name``; None when there is no such file."""

    def read(self, name: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``name`` from ``start`` (fewer at its end)."""


@dataclass(frozen=True)
class LocalFiles:
    """A model directory on disk."""

    root: Path

    def label(self, name: str) -> str:
        return str(self.root / name)

    def size(self, name: str) -> int | None:
        path = self.root / name
        return path.stat().st_size if path.is_file() else None

    def read(self, name: str, start: int, length: int) -> bytes:
        with (self.root / name).open("rb") as f:
            f.seek(start)
            return f.read(length)


@dataclass(frozen=True)
class S3Files:
    """A model directory in S3: the objects directly under ``prefix`` (``sizes``, by name, from
    :meth:`listed`), read with ranged GETs."""

    s3: Any
    prefix: S3Prefix
    sizes: dict[str, int]

    @classmethod
    def listed(cls, s3: Any, prefix: S3Prefix) -> S3Files:
        """The objects under ``prefix`` (not in subdirectories).

        Raises:
            botocore.exceptions.ClientError: S3 refused the listing.
        """
        sizes: dict[str, int] = {}
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=prefix.bucket, Prefix=prefix.prefix
        )
        for page in pages:
            for item in page.get("Contents", []):
                name = item["Key"][len(prefix.prefix) :]
                if name and "/" not in name:
                    sizes[name] = int(item["Size"])
        return cls(s3, prefix, sizes)

    def label(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def size(self, name: str) -> int | None:
        return self.sizes.get(name)

    def read(self, name: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        found = self.s3.get_object(
            Bucket=self.prefix.bucket,
            Key=self.prefix.key(name),
            Range=f"bytes={start}-{start + length - 1}",
        )
        body: bytes = found["Body"].read()
        return body


@dataclass(frozen=True)
class ModelDir:
    """A checked model directory: its architecture and the file names to upload (``config.json``
    last), and the files left behind (other weight formats, unreferenced safetensors, hidden
    files and subdirectories)."""

    root: Path
    architecture: str
    files: tuple[str, ...]
    skipped: tuple[str, ...]


def inspect(root: Path) -> ModelDir:
    """Checks that ``root`` holds a model the trainer reads (:func:`check`) and selects its files
    to stage.

    Raises:
        TrnctlError: USAGE, naming the file and what is wrong with it.
    """
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise TrnctlError(f"model directory {str(root)!r} {what}")
    architecture, weights = check(LocalFiles(root), str(root))
    files, skipped = _selection(root, weights)
    return ModelDir(root, architecture, files, skipped)


def check(files: Files, where: str) -> tuple[str, tuple[str, ...]]:
    """Checks that ``files`` (the directory ``where``) hold a model the trainer reads, reading
    only small files and the safetensors headers; returns its architecture and weight files.

    The checks: ``config.json`` is a JSON object whose ``architectures`` is a list of one of
    :data:`trn_catalog.hf_models.STAGED_ARCHITECTURES` (or, without ``architectures``, whose
    ``model_type`` is one of theirs, as transformers reads it); the weights are
    ``model.safetensors`` (preferred where both exist, as transformers prefers it) or
    ``model.safetensors.index.json`` whose ``weight_map`` names files all present, each tensor in
    the file the index names; every weight file has a valid safetensors header whose tensors
    account for the file's size exactly; ``tokenizer.json`` or ``tokenizer.model`` is present.

    Raises:
        TrnctlError: USAGE, naming the file and what is wrong with it.
    """
    architecture = _architecture(files, hf.CONFIG_FILE)
    weights = _weights(files, where)
    if not any(files.size(name) is not None for name in hf.TOKENIZER_FILES):
        raise TrnctlError(
            f"model directory {where!r} has no {' or '.join(hf.TOKENIZER_FILES)}: the "
            "tokenizer travels with the model (prepare-data and export read it)"
        )
    return architecture, weights


def _read_json(files: Files, name: str) -> Any:
    size = files.size(name)
    if size is None:
        raise TrnctlError(f"{files.label(name)}: missing; a Hugging Face model directory has one")
    try:
        return json.loads(files.read(name, 0, size).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise TrnctlError(f"{files.label(name)}: not valid JSON ({error})") from None


def _architecture(files: Files, name: str) -> str:
    raw = _read_json(files, name)
    config = files.label(name)
    if not isinstance(raw, dict):
        raise TrnctlError(f"{config}: not a JSON object")
    allowed = ", ".join(hf.STAGED_ARCHITECTURES)
    archs = raw.get("architectures")
    if archs is not None:
        if isinstance(archs, list) and len(archs) == 1 and archs[0] in hf.STAGED_ARCHITECTURES:
            return str(archs[0])
        raise TrnctlError(f"{config}: architectures {archs!r} is not supported; allowed: {allowed}")
    by_type = {t: a for a, t in hf.MODEL_TYPES.items()} | {hf.BERT_MODEL_TYPE: "BertModel"}
    model_type = raw.get("model_type")
    if isinstance(model_type, str) and model_type in by_type:
        return by_type[model_type]
    raise TrnctlError(
        f"{config}: no architectures, and model_type {model_type!r} is not one of "
        f"{', '.join(by_type)}; allowed architectures: {allowed}"
    )


def _weights(files: Files, where: str) -> tuple[str, ...]:
    """The weight files (and the index, first) after checking each."""
    if files.size(hf.WEIGHTS_FILE) is not None:
        _safetensors(files, hf.WEIGHTS_FILE)
        return (hf.WEIGHTS_FILE,)
    if files.size(hf.WEIGHTS_INDEX_FILE) is None:
        raise TrnctlError(
            f"model directory {where!r} has neither {hf.WEIGHTS_FILE} nor "
            f"{hf.WEIGHTS_INDEX_FILE} (other weight formats, such as pytorch_model.bin, are not "
            "read)"
        )
    index = files.label(hf.WEIGHTS_INDEX_FILE)
    weight_map = _weight_map(files, hf.WEIGHTS_INDEX_FILE)
    for shard in sorted(set(weight_map.values())):
        if files.size(shard) is None:
            raise TrnctlError(f"{index}: names {shard}, which is missing")
        tensors = _safetensors(files, shard)
        absent = sorted(t for t, f in weight_map.items() if f == shard and t not in tensors)
        if absent:
            raise TrnctlError(
                f"{index}: maps {absent[0]} to {shard}, whose header has no such tensor"
                + (f" ({len(absent) - 1} more)" if len(absent) > 1 else "")
            )
    return (hf.WEIGHTS_INDEX_FILE, *sorted(set(weight_map.values())))


def _weight_map(files: Files, name: str) -> dict[str, str]:
    raw = _read_json(files, name)
    index = files.label(name)
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise TrnctlError(f"{index}: no weight_map object naming the file of each tensor")
    for tensor, shard in weight_map.items():
        if (
            not isinstance(shard, str)
            or not shard.endswith(hf.WEIGHTS_SUFFIX)
            or Path(shard).name != shard
        ):
            raise TrnctlError(
                f"{index}: weight_map maps {tensor} to {shard!r}; expected a "
                f"{hf.WEIGHTS_SUFFIX} file in the same directory"
            )
    return {str(t): str(f) for t, f in weight_map.items()}


def check_safetensors(path: Path) -> set[str]:
    """The tensor names of the safetensors file at ``path`` (see :func:`_safetensors`).

    Raises:
        TrnctlError: USAGE, naming the file and what is wrong.
    """
    return _safetensors(LocalFiles(path.parent), path.name)


def _safetensors(files: Files, name: str) -> set[str]:
    """The tensor names of the safetensors file ``name``, after checking its header: an 8-byte
    little-endian length, that many bytes of a JSON object (at most safetensors' 100,000,000),
    and tensors whose byte ranges end exactly at the end of the file (a truncated copy fails).

    Raises:
        TrnctlError: USAGE, naming the file and what is wrong.
    """
    path = files.label(name)
    size = files.size(name) or 0
    raw_length = files.read(name, 0, hf.SAFETENSORS_LENGTH_BYTES)
    if len(raw_length) < hf.SAFETENSORS_LENGTH_BYTES:
        raise TrnctlError(f"{path}: {size} bytes, too short for a safetensors header")
    (length,) = struct.unpack("<Q", raw_length)
    room = size - hf.SAFETENSORS_LENGTH_BYTES
    if length > min(room, hf.SAFETENSORS_MAX_HEADER):
        raise TrnctlError(
            f"{path}: header length {length} exceeds the file's remaining {room} bytes or "
            f"safetensors' limit of {hf.SAFETENSORS_MAX_HEADER} (not a safetensors file?)"
        )
    header_bytes = files.read(name, hf.SAFETENSORS_LENGTH_BYTES, length)
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        header = None
    if not isinstance(header, dict):
        raise TrnctlError(f"{path}: the safetensors header is not a JSON object")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    data_end = _data_end(path, tensors)
    if data_end != room - length:
        raise TrnctlError(
            f"{path}: the header describes {data_end} bytes of tensor data but the file holds "
            f"{room - length} (truncated or corrupt)"
        )
    return set(tensors)


def _data_end(path: str, tensors: dict[str, Any]) -> int:
    end = 0
    for name, info in tensors.items():
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offsets)
            or offsets[0] > offsets[1]
        ):
            raise TrnctlError(f"{path}: tensor {name} has no valid data_offsets [BEGIN, END]")
        end = max(end, offsets[1])
    return end


def _selection(root: Path, weights: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(files to upload: weights, then the others by name, config.json last; files skipped)."""
    others: list[str] = []
    skipped: list[str] = []
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        name = entry.name
        if name in weights or name == hf.CONFIG_FILE:
            continue
        if (
            name.startswith(".")
            or not entry.is_file()
            or name.endswith(hf.UNREAD_WEIGHT_SUFFIXES)
            or name.endswith(hf.WEIGHTS_SUFFIX)
            or name == hf.WEIGHTS_INDEX_FILE
        ):
            skipped.append(name + ("/" if entry.is_dir() else ""))
        else:
            others.append(name)
    return (*weights, *others, hf.CONFIG_FILE), tuple(skipped)


def digests(model: ModelDir) -> dict[str, str]:
    """The SHA-256 of each of ``model``'s files, by name (which reads every file once)."""
    return {name: sha256_file(model.root / name) for name in model.files}


def uploads(model: ModelDir, dest: S3Prefix, sha256s: dict[str, str] | None = None) -> list[Upload]:
    """The uploads of ``model``'s files to ``dest``, in :attr:`ModelDir.files` order, each with
    its SHA-256 (``sha256s``, by name, or read from the file)."""
    known = sha256s or {}
    return [
        Upload(
            model.root / name,
            dest.key(name),
            known.get(name) or sha256_file(model.root / name),
        )
        for name in model.files
    ]


def export_copies(files: S3Files, weights: tuple[str, ...], dest: S3Prefix) -> list[Copy]:
    """The copies of a checked model directory in S3 (:func:`check` of ``files``) into
    ``dest``: the weights first, then every other file directly in it by name (hidden ones left
    out), ``config.json`` last."""
    others = sorted(
        n for n in files.sizes if n not in weights and n != hf.CONFIG_FILE and not n.startswith(".")
    )
    return [
        Copy(files.prefix.bucket, files.prefix.key(name), dest.key(name), files.sizes[name])
        for name in (*weights, *others, hf.CONFIG_FILE)
    ]
