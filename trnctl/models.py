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
from typing import Any

from trn_catalog import hf_models as hf
from trnctl import transfer
from trnctl.errors import TrnctlError
from trnctl.transfer import S3Prefix, Upload, sha256_file

AREA = transfer.StagedArea(
    top=hf.MODELS_PREFIX, what="model", option="--model", last_file=hf.CONFIG_FILE
)
validate_name = AREA.validate_name
name_of = AREA.name_of
prefix = AREA.prefix
pod_path = AREA.pod_path
require_staged = AREA.require_staged


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
    """Checks that ``root`` holds a model the trainer reads, reading only small files and the
    safetensors headers.

    The checks: ``config.json`` is a JSON object whose ``architectures`` is a list of one of
    :data:`trn_catalog.hf_models.ARCHITECTURES` (or, without ``architectures``, whose
    ``model_type`` is one of theirs, as transformers reads it); the weights are
    ``model.safetensors`` (preferred where both exist, as transformers prefers it) or
    ``model.safetensors.index.json`` whose ``weight_map`` names files all present, each tensor in
    the file the index names; every weight file has a valid safetensors header whose tensors
    account for the file's size exactly; ``tokenizer.json`` or ``tokenizer.model`` is present.

    Raises:
        TrnctlError: USAGE, naming the file and what is wrong with it.
    """
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise TrnctlError(f"model directory {str(root)!r} {what}")
    architecture = _architecture(root / hf.CONFIG_FILE)
    weights = _weights(root)
    if not any((root / name).is_file() for name in hf.TOKENIZER_FILES):
        raise TrnctlError(
            f"model directory {str(root)!r} has no {' or '.join(hf.TOKENIZER_FILES)}: the "
            "tokenizer travels with the model (prepare-data and export read it)"
        )
    files, skipped = _selection(root, weights)
    return ModelDir(root, architecture, files, skipped)


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise TrnctlError(f"{path}: missing; a Hugging Face model directory has one")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise TrnctlError(f"{path}: not valid JSON ({error})") from None


def _architecture(config: Path) -> str:
    raw = _read_json(config)
    if not isinstance(raw, dict):
        raise TrnctlError(f"{config}: not a JSON object")
    allowed = ", ".join(hf.ARCHITECTURES)
    archs = raw.get("architectures")
    if archs is not None:
        if isinstance(archs, list) and len(archs) == 1 and archs[0] in hf.ARCHITECTURES:
            return str(archs[0])
        raise TrnctlError(f"{config}: architectures {archs!r} is not supported; allowed: {allowed}")
    by_type = {t: a for a, t in hf.MODEL_TYPES.items()}
    model_type = raw.get("model_type")
    if isinstance(model_type, str) and model_type in by_type:
        return by_type[model_type]
    raise TrnctlError(
        f"{config}: no architectures, and model_type {model_type!r} is not one of "
        f"{', '.join(by_type)}; allowed architectures: {allowed}"
    )


def _weights(root: Path) -> tuple[str, ...]:
    """The weight files (and the index, first) after checking each."""
    single = root / hf.WEIGHTS_FILE
    if single.is_file():
        check_safetensors(single)
        return (hf.WEIGHTS_FILE,)
    index = root / hf.WEIGHTS_INDEX_FILE
    if not index.is_file():
        raise TrnctlError(
            f"model directory {str(root)!r} has neither {hf.WEIGHTS_FILE} nor "
            f"{hf.WEIGHTS_INDEX_FILE} (other weight formats, such as pytorch_model.bin, are not "
            "read)"
        )
    weight_map = _weight_map(index)
    for shard in sorted(set(weight_map.values())):
        path = root / shard
        if not path.is_file():
            raise TrnctlError(f"{index}: names {shard}, which is missing")
        tensors = check_safetensors(path)
        absent = sorted(t for t, f in weight_map.items() if f == shard and t not in tensors)
        if absent:
            raise TrnctlError(
                f"{index}: maps {absent[0]} to {shard}, whose header has no such tensor"
                + (f" ({len(absent) - 1} more)" if len(absent) > 1 else "")
            )
    return (hf.WEIGHTS_INDEX_FILE, *sorted(set(weight_map.values())))


def _weight_map(index: Path) -> dict[str, str]:
    raw = _read_json(index)
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
    """The tensor names of the safetensors file at ``path``, after checking its header: an 8-byte
    little-endian length, that many bytes of a JSON object (at most safetensors' 100,000,000),
    and tensors whose byte ranges end exactly at the end of the file (a truncated copy fails).

    Raises:
        TrnctlError: USAGE, naming the file and what is wrong.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        raw_length = f.read(hf.SAFETENSORS_LENGTH_BYTES)
        if len(raw_length) < hf.SAFETENSORS_LENGTH_BYTES:
            raise TrnctlError(f"{path}: {size} bytes, too short for a safetensors header")
        (length,) = struct.unpack("<Q", raw_length)
        room = size - hf.SAFETENSORS_LENGTH_BYTES
        if length > min(room, hf.SAFETENSORS_MAX_HEADER):
            raise TrnctlError(
                f"{path}: header length {length} exceeds the file's remaining {room} bytes or "
                f"safetensors' limit of {hf.SAFETENSORS_MAX_HEADER} (not a safetensors file?)"
            )
        header_bytes = f.read(length)
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


def _data_end(path: Path, tensors: dict[str, Any]) -> int:
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


def uploads(model: ModelDir, dest: S3Prefix) -> list[Upload]:
    """The uploads of ``model``'s files to ``dest``, in :attr:`ModelDir.files` order, each with
    its SHA-256 (which reads every file once)."""
    return [
        Upload(model.root / name, dest.key(name), sha256_file(model.root / name))
        for name in model.files
    ]
