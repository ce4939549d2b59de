"""Atomic, checksummed checkpoints on a local or shared file system (FSx) or under an S3 URI.

A checkpoint is a directory ``step_00000123/`` holding ``state.pt`` (model, optimizer, RNG and
step) and ``meta.json`` (step, size, CRC-32 of ``state.pt``). It is staged under a temporary name
and renamed into place (on S3, ``meta.json`` is uploaded last), so a checkpoint is either
complete or absent; ``meta.json`` is the mark of completion. Loading checks the CRC and falls
back to the next older checkpoint, with a :class:`CorruptCheckpointWarning`, when it fails.
"""

from __future__ import annotations

import io
import json
import mmap
import os
import shutil
import tempfile
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

STATE, META = "state.pt", "meta.json"
FORMAT = "trn-train-checkpoint-v1"
_PREFIX = "step_"


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint failed its checks and was skipped."""


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read; the message names it and the reason."""


def name_for(step: int) -> str:
    return f"{_PREFIX}{step:08d}"


class Store(Protocol):
    """Where checkpoints live. A checkpoint is staged in a local directory, then published."""

    def names(self) -> list[str]:
        """Complete checkpoints, oldest first."""
        ...

    def staging(self) -> Path: ...

    def publish(self, staged: Path, name: str) -> None: ...

    def read(self, name: str, file: str) -> bytes: ...

    def delete(self, name: str) -> None: ...


class LocalStore:
    """A directory on a local or shared POSIX file system."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.glob(f"{_PREFIX}*") if (p / META).is_file())

    def staging(self) -> Path:
        # Inside root, so that publishing is a rename on one file system.
        return Path(tempfile.mkdtemp(prefix=".staging-", dir=self.root))

    def publish(self, staged: Path, name: str) -> None:
        final = self.root / name
        if final.exists():  # saved again at the same step after a resume
            shutil.rmtree(final)
        os.rename(staged, final)
        _fsync_dir(self.root)

    def read(self, name: str, file: str) -> bytes:
        return (self.root / name / file).read_bytes()

    def delete(self, name: str) -> None:
        shutil.rmtree(self.root / name, ignore_errors=True)


class S3Store:
    """``s3://bucket/prefix``; boto3 is imported only here. ``meta.json`` goes up last."""

    def __init__(self, uri: str, client: Any = None) -> None:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        if client is None:
            import boto3

            client = boto3.client("s3")
        self.s3 = client

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def names(self) -> list[str]:
        found = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._key(_PREFIX)
        ):
            for obj in page.get("Contents", []):
                name, _, file = obj["Key"][len(self._key()) :].lstrip("/").partition("/")
                if file == META:
                    found.append(name)
        return sorted(found)

    def staging(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="trn-ckpt-"))

    def publish(self, staged: Path, name: str) -> None:
        try:
            for file in (STATE, META):
                self.s3.upload_file(str(staged / file), self.bucket, self._key(name, file))
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def read(self, name: str, file: str) -> bytes:
        body: bytes = self.s3.get_object(Bucket=self.bucket, Key=self._key(name, file))[
            "Body"
        ].read()
        return body

    def delete(self, name: str) -> None:
        # meta.json first: a half-deleted checkpoint must not look complete.
        for file in (META, STATE):
            self.s3.delete_object(Bucket=self.bucket, Key=self._key(name, file))


def open_store(location: str) -> Store:
    """An :class:`S3Store` for ``s3://`` URIs, else a :class:`LocalStore` (created if missing)."""
    return S3Store(location) if location.startswith("s3://") else LocalStore(location)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_state(state: dict[str, Any], path: Path) -> tuple[int, int]:
    """Writes ``state`` durably and returns (size, CRC-32). torch.save goes straight to the file
    (its fast path); the CRC is then read back from the page cache while fsync runs in a second
    thread, so the checksum adds little to the time the bytes take to reach the disk."""
    with path.open("w+b") as f:
        torch.save(state, f)
        f.flush()
        with ThreadPoolExecutor(1) as pool:
            synced = pool.submit(os.fsync, f.fileno())
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
                crc = zlib.crc32(view)
            synced.result()
        return f.tell(), crc


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass(frozen=True)
class Checkpointer:
    """Saves and restores training state through a :class:`Store`.

    Every rank calls :meth:`save` (sharded models gather there); only the main rank writes.
    ``keep`` (default 3) newest checkpoints survive each save.
    """

    store: Store
    keep: int = 3

    def save(
        self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, *, main: bool = True
    ) -> str:
        state = {
            "format": FORMAT,
            "step": step,
            "model": get_model_state_dict(model, options=_FULL),
            "optimizer": get_optimizer_state_dict(model, optimizer, options=_FULL),
            "rng": torch.get_rng_state(),
        }
        name = name_for(step)
        if not main:
            return name
        staged = self.store.staging()
        size, crc = _write_state(state, staged / STATE)
        meta = {"format": FORMAT, "step": step, "bytes": size, "crc32": f"{crc:08x}"}
        with (staged / META).open("w") as f:
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        self.store.publish(staged, name)
        for old in self.store.names()[: -self.keep]:
            self.store.delete(old)
        return name

    def read_valid(self, name: str) -> dict[str, Any]:
        """The state of checkpoint ``name`` after checking its size and CRC.

        Raises:
            CheckpointError: unreadable, truncated or failing its CRC; the message names it.
        """
        try:
            meta = json.loads(self.store.read(name, META))
            blob = self.store.read(name, STATE)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {name}: unreadable ({e})") from e
        if meta.get("format") != FORMAT:
            raise CheckpointError(
                f"checkpoint {name}: format {meta.get('format')!r}, expected {FORMAT!r}"
            )
        if len(blob) != meta["bytes"] or f"{zlib.crc32(blob):08x}" != meta["crc32"]:
            raise CheckpointError(f"checkpoint {name}: {STATE} fails its size or CRC-32 check")
        state: dict[str, Any] = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        return state

    def newest_valid(self) -> tuple[str, dict[str, Any]] | None:
        """The newest checkpoint that passes its checks, warning about each newer one that does
        not; None when there is none."""
        for name in reversed(self.store.names()):
            try:
                return name, self.read_valid(name)
            except CheckpointError as e:
                warnings.warn(f"skipping {e}", CorruptCheckpointWarning, stacklevel=2)
        return None

    @staticmethod
    def restore(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Loads ``state`` into ``model`` and ``optimizer``; returns the step to train next."""
        set_model_state_dict(model, state["model"], options=_FULL)
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=_FULL)
        torch.set_rng_state(state["rng"])
        step: int = state["step"]
        return step
