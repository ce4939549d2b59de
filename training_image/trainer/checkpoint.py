"""Atomic, checksummed checkpoints on a local or shared file system (FSx) or under an S3 URI.

A checkpoint is a directory ``step_00000123/`` holding ``state.pt`` (model, optimizer, RNG and
step) and ``meta.json`` (step, size, CRC-32 of ``state.pt``). It is staged under a temporary name
and renamed into place (on S3, ``meta.json`` is uploaded last), so a checkpoint is either
complete or absent; ``meta.json`` is the mark of completion. What a save killed midway leaves
behind is removed by :meth:`Store.remove_stale` when the writing rank starts. Checking a
checkpoint streams its CRC, and falls back to the next older checkpoint, with a
:class:`CorruptCheckpointWarning`, when it fails.

Loading memory-maps ``state.pt`` (``torch.load(mmap=True)``) rather than reading it into each
process: the ranks of a node then share one copy of its pages in the page cache, and a rank's
own memory holds only what it copies into its model and optimizer. From S3 a node downloads
each file once, into node-local disk that its ranks share (the first rank to take the lock
downloads, the others wait for it and read the same file), not once per rank.

``meta.json`` also records the run's configuration (:func:`run_config`: preset, seed, global
batch, learning-rate schedule, data manifest); :func:`resume_newest` refuses to resume a run
whose configuration differs, naming each field, rather than continue a different run silently.

A checkpoint of a run that started from a Hugging Face model directory also carries that
directory's ``config.json`` and tokenizer files under ``model/`` (``meta.json`` lists them), so
that exporting it needs nothing but the checkpoint.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import mmap
import os
import shutil
import tempfile
import warnings
import zlib
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from trainer import parallel

if TYPE_CHECKING:
    import torch.distributed as dist

    from trainer.config import TrainConfig

STATE, META = "state.pt", "meta.json"
MODEL_FILES = "model"  # the folder, in a checkpoint, of the model directory's carried files
FORMAT = "trn-train-checkpoint-v1"
_PREFIX = "step_"
_STAGING = ".staging-"  # a save in progress, or one killed midway
_REPLACED = ".replaced-"  # a checkpoint set aside while a new save at its step is renamed in
_CHUNK = 8 << 20  # bytes read at a time when checksumming


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint failed its checks and was skipped."""


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read; the message names it and the reason."""


class RunConfigError(ValueError):
    """Resuming would change the run's configuration; the message names each field, the
    checkpoint's value and this run's."""


def name_for(step: int) -> str:
    return f"{_PREFIX}{step:08d}"


class Store(Protocol):
    """Where checkpoints live. A checkpoint is staged in a local directory, then published."""

    def names(self) -> list[str]:
        """Complete checkpoints, oldest first."""
        ...

    def staging(self) -> Path: ...

    def publish(self, staged: Path, name: str) -> None: ...

    def read(self, name: str, file: str) -> bytes:
        """A small file (``meta.json``) in memory."""
        ...

    def local_file(self, name: str, file: str) -> AbstractContextManager[Path]:
        """A local path of ``file`` while the context lasts, to read in place or map."""
        ...

    def delete(self, name: str) -> None: ...

    def remove_stale(self) -> list[str]:
        """Removes what saves killed midway left behind and returns what it removed. Only for
        the writing rank, before its first save."""
        ...

    def drop_local_copies(self) -> None:
        """Deletes this node's copies of remote files; one rank per node, once every rank of
        the node has loaded what it needs."""
        ...


class LocalStore:
    """A directory on a local or shared POSIX file system."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.glob(f"{_PREFIX}*") if (p / META).is_file())

    def staging(self) -> Path:
        # Inside root, so that publishing is a rename on one file system.
        return Path(tempfile.mkdtemp(prefix=_STAGING, dir=self.root))

    def publish(self, staged: Path, name: str) -> None:
        """Renames ``staged`` to ``name``. A checkpoint already there (saved again at the same
        step after resuming from an older one) is renamed aside first and deleted only once the
        new one is in place, so that one of the two is always complete on disk;
        :meth:`remove_stale` puts the old one back if a kill came before the new one arrived."""
        final = self.root / name
        if not final.exists():
            os.rename(staged, final)
            _fsync_dir(self.root)
            return
        aside = self.root / f"{_REPLACED}{name}"
        shutil.rmtree(aside, ignore_errors=True)  # from an earlier save, killed midway
        os.rename(final, aside)
        os.rename(staged, final)
        _fsync_dir(self.root)
        shutil.rmtree(aside)

    def read(self, name: str, file: str) -> bytes:
        return (self.root / name / file).read_bytes()

    @contextlib.contextmanager
    def local_file(self, name: str, file: str) -> Iterator[Path]:
        yield self.root / name / file

    def delete(self, name: str) -> None:
        shutil.rmtree(self.root / name, ignore_errors=True)

    def remove_stale(self) -> list[str]:
        """Deletes staging directories (a save killed before it was published) and checkpoints
        set aside by :meth:`publish`, putting one back where its replacement is missing."""
        removed = []
        for aside in sorted(self.root.glob(f"{_REPLACED}*")):
            final = self.root / aside.name.removeprefix(_REPLACED)
            if (final / META).is_file():
                shutil.rmtree(aside, ignore_errors=True)
                removed.append(aside.name)
            else:
                shutil.rmtree(final, ignore_errors=True)
                os.rename(aside, final)
        for staged in sorted(self.root.glob(f"{_STAGING}*")):
            shutil.rmtree(staged, ignore_errors=True)
            removed.append(staged.name)
        _fsync_dir(self.root)
        return removed

    def drop_local_copies(self) -> None:
        """Nothing: files are read where they are."""


class S3Store:
    """``s3://bucket/prefix``; boto3 is imported only here. ``meta.json`` goes up last.

    Files read for loading are downloaded once per node into ``node_cache`` (default: a
    directory for this prefix under the system's temporary directory, node-local in a pod),
    keyed by the object's ETag so that a checkpoint replaced at the same step is never read from
    an older copy.
    """

    def __init__(self, uri: str, client: Any = None, *, node_cache: Path | None = None) -> None:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        if client is None:
            import boto3

            client = boto3.client("s3")
        self.s3 = client
        digest = hashlib.sha256(f"{self.bucket}/{self.prefix}".encode()).hexdigest()[:16]
        self.node_cache = node_cache or Path(tempfile.gettempdir()) / f"trn-checkpoints-{digest}"

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
            files = sorted(
                p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()
            )
            for file in [f for f in files if f != META] + [META]:
                self.s3.upload_file(str(staged / file), self.bucket, self._key(name, file))
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def read(self, name: str, file: str) -> bytes:
        body: bytes = self.s3.get_object(Bucket=self.bucket, Key=self._key(name, file))[
            "Body"
        ].read()
        return body

    @contextlib.contextmanager
    def local_file(self, name: str, file: str) -> Iterator[Path]:
        """This node's copy of ``file``: the first process of the node to take the copy's lock
        downloads it (streamed by boto3, renamed into place when complete); the others wait on
        the lock and read the same file. It stays until :meth:`drop_local_copies`."""
        yield self._node_copy(self._key(name, file), file)

    def _node_copy(self, key: str, file: str) -> Path:
        from botocore.exceptions import ClientError

        try:
            etag = self.s3.head_object(Bucket=self.bucket, Key=key)["ETag"].strip('"')
            folder = self.node_cache / hashlib.sha256(f"{key}@{etag}".encode()).hexdigest()[:24]
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / Path(file).name
            with _exclusive(folder / ".lock"):
                if not path.is_file():
                    partial = folder / f".{path.name}.partial"
                    self.s3.download_file(self.bucket, key, str(partial))
                    os.replace(partial, path)
        except ClientError as e:
            raise OSError(f"s3://{self.bucket}/{key}: {e}") from e
        return path

    def drop_local_copies(self) -> None:
        shutil.rmtree(self.node_cache, ignore_errors=True)

    def delete(self, name: str) -> None:
        # meta.json first: a half-deleted checkpoint must not look complete.
        self.s3.delete_object(Bucket=self.bucket, Key=self._key(name, META))
        self._delete_all(name)

    def _delete_all(self, name: str) -> None:
        """Every object of checkpoint ``name`` (``state.pt`` and carried model files)."""
        for page in self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._key(name) + "/"
        ):
            for obj in page.get("Contents", []):
                self.s3.delete_object(Bucket=self.bucket, Key=obj["Key"])

    def remove_stale(self) -> list[str]:
        """Deletes the objects of checkpoints without a ``meta.json`` (an upload killed midway:
        ``state.pt``, carried model files); the local staging directory went with the process."""
        files: dict[str, set[str]] = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._key(_PREFIX)
        ):
            for obj in page.get("Contents", []):
                name, _, file = obj["Key"][len(self._key()) :].lstrip("/").partition("/")
                files.setdefault(name, set()).add(file)
        stale = sorted(name for name, held in files.items() if META not in held)
        for name in stale:
            self._delete_all(name)
        return stale


def open_store(location: str) -> Store:
    """An :class:`S3Store` for ``s3://`` URIs, else a :class:`LocalStore` (created if missing)."""
    return S3Store(location) if location.startswith("s3://") else LocalStore(location)


@contextlib.contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    """Holds an exclusive lock on ``lock`` (created if missing) across the processes of a node."""
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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
    ``keep`` (default 3) newest checkpoints survive each save. ``model_files`` (default none):
    files copied into each checkpoint's ``model/`` folder (a Hugging Face model's config and
    tokenizer files). ``base_model`` (default none): the model directory a run started from,
    recorded in ``meta.json`` for exports that name it (a PEFT adapter's base model).
    """

    store: Store
    keep: int = 3
    model_files: tuple[Path, ...] = ()
    base_model: str = ""

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        main: bool = True,
        run: Mapping[str, object] | None = None,
    ) -> str:
        """Writes checkpoint ``step`` (on the main rank; the others only take part in gathering)
        and returns its name; ``run`` (see :func:`run_config`) goes into ``meta.json``."""
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
        meta: dict[str, object] = {
            "format": FORMAT,
            "step": step,
            "bytes": size,
            "crc32": f"{crc:08x}",
        }
        if run is not None:
            meta["run"] = dict(run)
        if self.model_files:
            (staged / MODEL_FILES).mkdir()
            for path in self.model_files:
                shutil.copyfile(path, staged / MODEL_FILES / path.name)
            meta["model_files"] = [path.name for path in self.model_files]
        if self.base_model:
            meta["base_model"] = self.base_model
        with (staged / META).open("w") as f:
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        self.store.publish(staged, name)
        for old in self.store.names()[: -self.keep]:
            self.store.delete(old)
        return name

    def remove_stale(self) -> list[str]:
        """What saves killed midway left behind, removed (see :meth:`Store.remove_stale`). Call
        it on the writing rank before its first save."""
        return self.store.remove_stale()

    def run_of(self, name: str) -> dict[str, object] | None:
        """The run configuration checkpoint ``name`` was saved with; None for a checkpoint
        written before checkpoints recorded it.

        Raises:
            CheckpointError: ``meta.json`` is unreadable.
        """
        try:
            run = json.loads(self.store.read(name, META)).get("run")
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {name}: unreadable ({e})") from e
        return dict(run) if isinstance(run, dict) else None

    def model_files_of(self, name: str) -> list[str]:
        """The names of the model files checkpoint ``name`` carries (empty for a run that did not
        start from a model directory).

        Raises:
            CheckpointError: ``meta.json`` is unreadable.
        """
        try:
            files = json.loads(self.store.read(name, META)).get("model_files", [])
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {name}: unreadable ({e})") from e
        return [str(f) for f in files]

    def base_model_of(self, name: str) -> str:
        """The model directory the run of checkpoint ``name`` started from ("" if none was
        recorded).

        Raises:
            CheckpointError: ``meta.json`` is unreadable.
        """
        try:
            return str(json.loads(self.store.read(name, META)).get("base_model", ""))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {name}: unreadable ({e})") from e

    def model_file(self, name: str, file: str) -> AbstractContextManager[Path]:
        """A local path of carried model file ``file`` of checkpoint ``name`` while the context
        lasts (see :meth:`model_files_of`)."""
        return self.store.local_file(name, f"{MODEL_FILES}/{file}")

    def verify(self, name: str) -> None:
        """Checks the format, size and CRC-32 of checkpoint ``name``, reading ``state.pt`` a
        chunk at a time.

        Raises:
            CheckpointError: unreadable, truncated or failing its CRC; the message names it.
        """
        with self.store.local_file(name, STATE) as path:
            self._check(name, path, crc=True)

    def _check(self, name: str, path: Path, *, crc: bool) -> None:
        try:
            meta = json.loads(self.store.read(name, META))
            size = path.stat().st_size
            if meta.get("format") != FORMAT:
                raise CheckpointError(
                    f"checkpoint {name}: format {meta.get('format')!r}, expected {FORMAT!r}"
                )
            if size != meta["bytes"] or (crc and f"{_crc32(path):08x}" != meta["crc32"]):
                raise CheckpointError(f"checkpoint {name}: {STATE} fails its size or CRC-32 check")
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"checkpoint {name}: unreadable ({e})") from e

    def load(self, name: str, *, verify: bool = True) -> dict[str, Any]:
        """The state of checkpoint ``name``, its tensors memory-mapped from ``state.pt`` (CPU),
        after :meth:`verify` (``verify=False``: the format and size only, for a checkpoint
        another rank has verified).

        Raises:
            CheckpointError: unreadable, truncated or failing its CRC; the message names it.
        """
        with self.store.local_file(name, STATE) as path:
            self._check(name, path, crc=verify)
            try:
                state: dict[str, Any] = torch.load(
                    path, map_location="cpu", mmap=True, weights_only=True
                )
            except (OSError, RuntimeError, ValueError) as e:
                raise CheckpointError(f"checkpoint {name}: unreadable ({e})") from e
        return state

    def newest_valid(self) -> str | None:
        """The newest checkpoint that passes :meth:`verify`, warning about each newer one that
        does not; None when there is none. Nothing is loaded."""
        for name in reversed(self.store.names()):
            try:
                self.verify(name)
            except CheckpointError as e:
                warnings.warn(f"skipping {e}", CorruptCheckpointWarning, stacklevel=2)
            else:
                return name
        return None

    def resume(
        self, name: str, model: nn.Module, optimizer: torch.optim.Optimizer, *, verify: bool = True
    ) -> int:
        """Loads checkpoint ``name`` (see :meth:`load`) into ``model`` and ``optimizer`` and
        returns the step to train next. The loaded state is dropped on return."""
        return self.restore(self.load(name, verify=verify), model, optimizer)

    @staticmethod
    def restore(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Loads ``state`` into ``model`` and ``optimizer``; returns the step to train next."""
        set_model_state_dict(model, state["model"], options=_FULL)
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=_FULL)
        torch.set_rng_state(state["rng"])
        step: int = state["step"]
        return step


def _crc32(path: Path) -> int:
    """The CRC-32 of ``path``, read :data:`_CHUNK` bytes at a time into one buffer."""
    crc = 0
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(buffer):
            crc = zlib.crc32(view[:n], crc)
    return crc


def run_config(
    cfg: TrainConfig, *, world_size: int, manifest_sha256: str, model_id: str | None = None
) -> dict[str, object]:
    """What a resumed run must share with the run that saved the checkpoint: the preset, the
    seed, the global batch (sequences per optimizer step, however ranks and accumulation split
    it), the learning-rate schedule and the data (its manifest's SHA-256); for a run from a
    model directory also the model (``model_id``, see :func:`trainer.hf.fingerprint`), and the
    sequence length where it was chosen rather than the preset's, and a LoRA run's rank, alpha
    and target modules (``lora``)."""
    run: dict[str, object] = {
        "preset": cfg.preset,
        "seed": cfg.seed,
        "global_batch": cfg.batch_per_rank * world_size * cfg.grad_accum,
        "peak_lr": cfg.peak_lr,
        "min_lr_ratio": cfg.min_lr_ratio,
        "warmup_steps": cfg.warmup,
        "max_steps": cfg.max_steps,
        "data_manifest_sha256": manifest_sha256,
    }
    if model_id is not None:
        run["model"] = model_id
    if model_id is not None or cfg.seq_len:
        run["seq_len"] = cfg.model.seq_len
    if cfg.lora is not None:
        run["lora"] = cfg.lora.as_dict()
    return run


def check_resume(name: str, saved: Mapping[str, object] | None, run: Mapping[str, object]) -> None:
    """Refuses to resume from checkpoint ``name`` with a configuration other than ``saved``;
    a checkpoint that recorded none (written before this check existed) is accepted.

    Raises:
        RunConfigError: naming every field that differs with both values.
    """
    if saved is None:
        return
    # Fields either side recorded: a run from a model directory records more than a preset run.
    fields = list(run) + [field for field in saved if field not in run]
    changed = [
        f"{field} {saved.get(field)!r} in the checkpoint, {run.get(field)!r} now"
        for field in fields
        if saved.get(field) != run.get(field)
    ]
    if changed:
        raise RunConfigError(
            f"refusing to resume from checkpoint {name}: the run's configuration changed "
            f"({'; '.join(changed)}); resume with the same settings, or start a new run in "
            "another checkpoint directory"
        )


def resume_newest(
    checkpointer: Checkpointer,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    run: Mapping[str, object],
    ranks: parallel.Ranks,
    group: dist.ProcessGroup | None,
) -> int:
    """Resumes every rank from the newest valid checkpoint and returns the step to train next
    (0 when there is none). The main rank removes what killed saves left behind, then verifies
    (streaming the CRC) and chooses; every rank checks ``run`` against the checkpoint's
    (:func:`check_resume`) and maps the state, which from S3 each node downloads once; after
    every rank has loaded, one rank per node drops the node's copies.

    Raises:
        RunConfigError: the checkpoint was saved with another configuration.
        CheckpointError: the chosen checkpoint cannot be read.
    """
    if ranks.is_main:
        checkpointer.remove_stale()
    chosen = parallel.broadcast_object(
        checkpointer.newest_valid() if ranks.is_main else None, ranks, group
    )
    if chosen is None:
        return 0
    name = str(chosen)
    check_resume(name, checkpointer.run_of(name), run)
    step = checkpointer.resume(name, model, optimizer, verify=False)
    parallel.any_rank(False, ranks, group)  # every rank holds its state: the copies can go
    if ranks.local_rank == 0:
        checkpointer.store.drop_local_copies()
    return step
