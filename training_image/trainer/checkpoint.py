"""Atomic, checksummed checkpoints on a local or shared file system (FSx) or under an S3 URI.

A checkpoint is a directory ``step_00000123/`` in one format (:data:`FORMAT`), whatever the run:
the training state (model, optimizer, RNG) as a ``torch.distributed.checkpoint`` (DCP)
checkpoint under ``shards/`` (``__<rank>_0.distcp`` from each rank that wrote, ``.metadata``
from rank 0), and ``meta.json``: the format, the step, the number of ranks that wrote and every
file with its size and CRC-32. When the state is sharded (FSDP2 on more than one rank) no rank
gathers it: every rank writes its own shards and checksums them. Otherwise the state is gathered
and the main rank alone writes it, in one process (DCP without a process group), as one shard.

A checkpoint is staged under a temporary name and renamed into place (on S3, ``meta.json`` is
uploaded after every file it lists, and the one of an earlier save at the same step is deleted
before the first), so a checkpoint is either complete or absent; ``meta.json`` is the mark of
completion. On a file system the ranks write into one staging directory that rank 0 renames into
place once every rank has written; on S3 each rank uploads its own files and rank 0 uploads
``meta.json`` last, once every rank has. What a save killed midway leaves behind is removed by
:meth:`Store.remove_stale` when the writing rank starts. Checking a checkpoint streams each
file's CRC, and falls back to the next older checkpoint, with a
:class:`CorruptCheckpointWarning`, when it fails.

Resuming reads the shards with DCP into the model's and optimizer's own tensors, each rank
reading what its part of the state needs and one tensor at a time, so that no copy of the whole
state is held beside the model; DCP reshards for the world size at hand: a checkpoint of two
ranks resumes on one and the other way round. From S3 a node downloads each file once, into
node-local disk that its ranks share (the first rank to take the lock downloads, the others wait
for it and read the same files), not once per rank. :meth:`Checkpointer.load` reads a whole
checkpoint into one process (an export, an evaluation) from the checkpoint alone: the state's
shape comes from DCP's metadata. The data position needs nothing per rank: the run's
configuration pins the global batch, and the sampler draws each step's global batch from
``(seed, step)`` alone (see :class:`trainer.data.WindowSampler`), so two ranks of two sequences
and one rank of four (or accumulating two micro-steps of two) train on the same windows.

``meta.json`` also records the run's configuration (:func:`run_config`: preset, seed, global
batch, learning-rate schedule, data manifest); :func:`resume_newest` refuses to resume a run
whose configuration differs, naming each field, rather than continue a different run silently.

A checkpoint of a run that started from a Hugging Face model directory also carries that
directory's ``config.json`` and tokenizer files under ``model/`` (``meta.json`` lists them), so
that exporting it needs nothing but the checkpoint.

LoRA runs. The model state of a checkpoint holds the trained parameters only (the adapters),
and the optimizer state only has theirs: the frozen base weights come from the ``--model``
directory again on resume, and :func:`check_resume` refuses a base whose fingerprint
(:func:`trainer.hf.fingerprint`) differs from the one ``meta.json`` recorded.

Earlier checkpoints. Trainers before the one format wrote unsharded runs' checkpoints as one
``torch.save`` file, ``state.pt`` (:data:`FORMAT_TORCH_SAVE`); those are still verified, resumed
(memory-mapped) and exported, never written. A format this trainer does not know (a newer
trainer's) is refused with a message naming it.

Reading a checkpoint unpickles DCP's ``.metadata`` and the state's non-tensor values (an earlier
``state.pt`` is read with ``weights_only``), as DCP does: checkpoints must come from a directory
or bucket that only the runs write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import itertools
import json
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

from trainer import packing, parallel

if TYPE_CHECKING:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    from trainer.config import TrainConfig
    from trainer.model_spec import ModelSpec

META = "meta.json"
MODEL_FILES = "model"  # the folder, in a checkpoint, of the model directory's carried files
SHARDS = "shards"  # the folder, in a checkpoint, of torch.distributed.checkpoint's files
# The one format this trainer writes. Its name is the one sharded checkpoints have had since
# they were introduced, so that those load as they are.
FORMAT = "trn-train-checkpoint-dcp-v1"
# Unsharded runs' checkpoints before the one format: the state in one torch.save file, STATE.
FORMAT_TORCH_SAVE = "trn-train-checkpoint-v1"
STATE = "state.pt"
# meta.json's record of the eval figure that made a checkpoint its run's best (best_metric).
BEST = "best"
# torch.distributed.checkpoint's FileSystemWriter names rank r's data files __<r>_<i>.distcp and
# the coordinator's metadata .metadata (torch 2.13, torch/distributed/checkpoint/filesystem.py).
DCP_METADATA = ".metadata"
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

    def retract(self, name: str) -> None:
        """Makes checkpoint ``name`` incomplete (not among :meth:`names`) before it is written
        again at the same step: the main rank, before any rank writes a file of it."""
        ...

    def remove_stale(self) -> list[str]:
        """Removes what saves killed midway left behind and returns what it removed. Only for
        the writing rank, before its first save."""
        ...

    def drop_local_copies(self) -> None:
        """Deletes this node's copies of remote files; one rank per node, once every rank of
        the node has loaded what it needs."""
        ...

    @property
    def shared_staging(self) -> bool:
        """True when a staging directory one rank makes is where every rank writes (a shared
        file system); False when each rank stages its own files and uploads them
        (:meth:`publish_part`)."""
        ...

    def publish_part(self, staged: Path, name: str) -> None:
        """A rank's own files of a sharded checkpoint ``name``, staged under ``staged``, put
        where :meth:`publish` of the main rank's will complete them (nothing to do where the
        staging directory is shared)."""
        ...

    def local_folder(
        self, name: str, folder: str, files: list[str]
    ) -> AbstractContextManager[Path]:
        """A local directory holding ``files`` of ``folder`` of checkpoint ``name`` while the
        context lasts."""
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
            _fsync(self.root)
            return
        aside = self.root / f"{_REPLACED}{name}"
        shutil.rmtree(aside, ignore_errors=True)  # from an earlier save, killed midway
        os.rename(final, aside)
        os.rename(staged, final)
        _fsync(self.root)
        shutil.rmtree(aside)

    def read(self, name: str, file: str) -> bytes:
        return (self.root / name / file).read_bytes()

    @contextlib.contextmanager
    def local_file(self, name: str, file: str) -> Iterator[Path]:
        yield self.root / name / file

    def delete(self, name: str) -> None:
        shutil.rmtree(self.root / name, ignore_errors=True)

    def retract(self, name: str) -> None:
        """Nothing: :meth:`publish` sets the old checkpoint aside only once the new one is
        staged whole, and :meth:`remove_stale` puts it back if the rename never came."""

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
        _fsync(self.root)
        return removed

    def drop_local_copies(self) -> None:
        """Nothing: files are read where they are."""

    @property
    def shared_staging(self) -> bool:
        """True: a run on several nodes keeps its checkpoints on a file system they share."""
        return True

    def publish_part(self, staged: Path, name: str) -> None:
        """Nothing: the rank wrote into the shared staging directory."""

    @contextlib.contextmanager
    def local_folder(self, name: str, folder: str, files: list[str]) -> Iterator[Path]:
        yield self.root / name / folder


class S3Store:
    """``s3://bucket/prefix``; boto3 is imported only here. ``meta.json`` goes up last, after
    every file it lists.

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

    @property
    def shared_staging(self) -> bool:
        return False

    def publish_part(self, staged: Path, name: str) -> None:
        """Uploads every file under ``staged`` (a rank's shards; never ``meta.json``)."""
        try:
            for path in sorted(p for p in staged.rglob("*") if p.is_file()):
                file = path.relative_to(staged).as_posix()
                self.s3.upload_file(str(path), self.bucket, self._key(name, file))
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    @contextlib.contextmanager
    def local_folder(self, name: str, folder: str, files: list[str]) -> Iterator[Path]:
        """This node's copy of ``files``, in one directory keyed by ``meta.json``'s ETag (a
        checkpoint saved again at the same step gets a new one): the first process of the node
        to take the directory's lock downloads what is missing, the others wait and read the
        same files. They stay until :meth:`drop_local_copies`."""
        from botocore.exceptions import ClientError

        try:
            etag = self.s3.head_object(Bucket=self.bucket, Key=self._key(name, META))["ETag"]
            digest = hashlib.sha256(f"{self._key(name)}@{etag}".encode()).hexdigest()[:24]
            local = self.node_cache / digest / folder
            local.mkdir(parents=True, exist_ok=True)
            with _exclusive(local.parent / ".lock"):
                for file in files:
                    if not (local / file).is_file():
                        partial = local / f".{file}.partial"
                        key = self._key(name, folder, file)
                        self.s3.download_file(self.bucket, key, str(partial))
                        os.replace(partial, local / file)
        except ClientError as e:
            raise OSError(f"s3://{self.bucket}/{self._key(name, folder)}: {e}") from e
        yield local

    def delete(self, name: str) -> None:
        # meta.json first: a half-deleted checkpoint must not look complete.
        self.retract(name)
        self._delete_all(name)

    def retract(self, name: str) -> None:
        """Deletes ``meta.json`` of ``name``: objects have no rename, so the files of a save at a
        step that already has a checkpoint overwrite that one's in place, and its old
        ``meta.json`` would otherwise vouch for a mix of both if the save stopped midway."""
        self.s3.delete_object(Bucket=self.bucket, Key=self._key(name, META))

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


def _fsync(path: Path) -> None:
    """Syncs file or directory ``path`` to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# torch.distributed.checkpoint's state-dict functions are imported where a checkpoint is saved or
# restored: importing them costs a second or more, which a run without checkpoints (and every
# other command of the CLI) need not pay.
def _options(model: nn.Module, *, full: bool) -> StateDictOptions:
    """Full (gathered to CPU) or sharded state-dict options; a model with frozen parameters (a
    LoRA run's base) leaves them out, so that a checkpoint holds what training changes."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    frozen = any(not p.requires_grad for p in model.parameters())
    return StateDictOptions(
        full_state_dict=full, cpu_offload=full, ignore_frozen_params=frozen, strict=not frozen
    )


def _model_state(model: nn.Module, options: StateDictOptions) -> dict[str, Any]:
    """``get_model_state_dict``, without frozen parameters under any of their names when
    ``options`` leaves them out: torch drops a frozen parameter under one name only, so a tied
    output head (the embedding under a second name) would stay."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=options)
    if options.ignore_frozen_params:
        for name, p in model.named_parameters(remove_duplicate=False):
            if not p.requires_grad:
                state.pop(_plain_name(name), None)
    return state


def _optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, options: StateDictOptions
) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=options)


def _set_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: Mapping[str, Any],
    options: StateDictOptions,
) -> None:
    """Loads ``state``'s model and optimizer parts (not the RNG) under ``options``."""
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    set_model_state_dict(model, state["model"], options=options)
    set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)


@contextlib.contextmanager
def _no_record_crc() -> Iterator[None]:
    """torch.save's CRC-32 of each zip record off while DCP writes (it torch.saves every item):
    the CRC-32 of each whole file in ``meta.json`` covers those bytes and is checked before any
    is read, while torch.load never checks the records' own (torch 2.13 builds its zip reader
    with miniz's CRC checks off), so computing both would spend the time twice. The option is
    process-wide: the trainer torch.saves nothing else while a checkpoint is written."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)


@contextlib.contextmanager
def _one_process_quietly(alone: bool) -> Iterator[None]:
    """DCP warns at each save or load without a process group that it assumes one process; a
    run of one rank is one on purpose."""
    with warnings.catch_warnings():
        if alone:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _plain_name(name: str) -> str:
    """A parameter's name without what wrappers add (DDP's ``module.``, the activation
    checkpoint wrapper's and torch.compile's modules), as state dicts name it."""
    for wrapper in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(wrapper, "")
    return name.removeprefix("module.")


def _own_files(folder: Path, rank: int, main: bool) -> dict[str, dict[str, object]]:
    """Size and CRC-32 of the files this rank wrote into ``folder`` (see :data:`DCP_METADATA`),
    made durable. DCP writes them without syncing (``sync_files=False``): they are synced here in
    a second thread while their CRC is read back from the page cache, so that the checksum adds
    little to the time the bytes take to reach the disk."""
    names = sorted(p.name for p in folder.glob(f"__{rank}_*.distcp"))
    if main:
        names.append(DCP_METADATA)
    paths = [folder / name for name in names]
    with ThreadPoolExecutor(1) as pool:
        synced = [pool.submit(_fsync, path) for path in [*paths, folder]]
        records = {
            f"{SHARDS}/{path.name}": {"bytes": path.stat().st_size, "crc32": f"{_crc32(path):08x}"}
            for path in paths
        }
        for done in synced:
            done.result()
    return records


def _read_whole(folder: Path, parts: tuple[str, ...] | None) -> dict[str, Any]:
    """Every value of the DCP checkpoint in ``folder`` whose top-level key is in ``parts``
    (default all), read in this process alone into tensors shaped from the checkpoint's own
    metadata, as nested as the state that was saved.

    DCP's public ``load`` fills a state whose tensors are allocated up front, which a reader of
    the checkpoint alone (an export) does not have: the metadata gives each saved value's
    flattened key, shape and dtype, and the default save planner records in its
    ``planner_data`` each flattened key's path in the nested state (torch 2.13,
    ``DefaultSavePlanner.create_global_plan``), so the values are loaded under their
    flattened keys and put back in place."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    metadata = FileSystemReader(folder).read_metadata()
    paths: dict[str, tuple[str | int, ...]] = metadata.planner_data
    flat: dict[str, Any] = {
        key: torch.empty(stored.size, dtype=stored.properties.dtype)
        if isinstance(stored, TensorStorageMetadata)
        else None  # replaced by the loaded value
        for key, stored in metadata.state_dict_metadata.items()
        if parts is None or paths[key][0] in parts
    }
    # ``flat`` is flat already; without ``flatten_sharded_tensors`` (a copy of the state that the
    # planner would load the non-tensor values into: the optimizer's hyperparameters, lost) the
    # planner loads into ``flat`` itself (torch 2.13 DefaultLoadPlanner.set_up_planner).
    planner = DefaultLoadPlanner(flatten_state_dict=False, flatten_sharded_tensors=False)
    with _one_process_quietly(True):
        load(flat, storage_reader=FileSystemReader(folder), planner=planner, no_dist=True)
    state: dict[str, Any] = {}
    for key, value in flat.items():
        _put(state, paths[key], value)
    return state


def _put(state: dict[str, Any], path: tuple[str | int, ...], value: object) -> None:
    """Sets ``value`` at ``path`` in ``state``, making the dicts (a string key) and lists (an
    integer index: the optimizer's parameter groups) along the way."""
    node: Any = state
    for key, below in itertools.pairwise(path):
        if isinstance(key, int):
            node.extend([None] * (key + 1 - len(node)))
            if node[key] is None:
                node[key] = [] if isinstance(below, int) else {}
            node = node[key]
        else:
            node = node.setdefault(key, [] if isinstance(below, int) else {})
    last = path[-1]
    if isinstance(last, int):
        node.extend([None] * (last + 1 - len(node)))
    node[last] = value


@dataclass(frozen=True)
class Checkpointer:
    """Saves and restores training state through a :class:`Store`.

    Every rank calls :meth:`save`: a full checkpoint gathers there and only the main rank
    writes; a sharded one (``sharded``) has every rank write its shards. ``keep`` (default 3)
    newest checkpoints survive each save. ``model_files`` (default none): files copied into each
    checkpoint's ``model/`` folder (a Hugging Face model's config and tokenizer files).
    ``base_model`` (default none): the model directory a run started from, recorded in
    ``meta.json`` for exports that name it (a PEFT adapter's base model) and for those that
    read it (a LoRA checkpoint merged: its base weights).
    """

    store: Store
    keep: int = 3
    model_files: tuple[Path, ...] = ()
    base_model: str = ""
    pinned: set[str] = dataclasses.field(default_factory=set)

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        main: bool = True,
        run: Mapping[str, object] | None = None,
        sharded: bool = False,
        ranks: parallel.Ranks | None = None,
        group: dist.ProcessGroup | None = None,
        best: Mapping[str, object] | None = None,
    ) -> str:
        """Writes checkpoint ``step`` and returns its name; ``run`` (see :func:`run_config`)
        goes into ``meta.json``, and ``best`` (default none: the eval figure that made it the
        run's best, see :meth:`best_valid`) beside it. Full (default): gathered, written by the
        main rank alone (the others only take part in gathering). ``sharded``: every rank of
        ``ranks`` (default: one) writes its own shards (see the module's documentation);
        ``group`` is the control group the ranks agree on (the staging directory, the files'
        checksums, the end of writing)."""
        options = _options(model, full=not sharded)
        state = {
            "model": _model_state(model, options),
            "optimizer": _optimizer_state(model, optimizer, options),
            "rng": torch.get_rng_state(),
        }
        name = name_for(step)
        if best is not None:
            run = {**(run or {}), BEST: dict(best)}
        if sharded:
            self._write(name, step, state, main, run, ranks or parallel.Ranks(), group)
        elif main:
            self._write(name, step, state, True, run, parallel.Ranks(), None)
        return name

    def _write(
        self,
        name: str,
        step: int,
        state: dict[str, Any],
        main: bool,
        run: Mapping[str, object] | None,
        ranks: parallel.Ranks,
        group: dist.ProcessGroup | None,
    ) -> None:
        """Every rank of ``ranks`` writes its part of ``state`` with DCP (one rank: in this
        process alone) and checksums it; the main rank publishes them with ``meta.json``."""
        from torch.distributed.checkpoint.filesystem import FileSystemWriter
        from torch.distributed.checkpoint.state_dict_saver import save

        if main:
            # Before the gather below, after which the other ranks upload their files.
            self.store.retract(name)
        staged = self.store.staging() if main or not self.store.shared_staging else None
        if self.store.shared_staging:
            staged = Path(str(parallel.broadcast_object(str(staged), ranks, group)))
        assert staged is not None
        with _one_process_quietly(not ranks.distributed), _no_record_crc():
            save(
                state,
                storage_writer=FileSystemWriter(staged / SHARDS, sync_files=False),
                no_dist=not ranks.distributed,
            )
        files = _own_files(staged / SHARDS, ranks.rank, main)
        every = parallel.all_gather_object(files, ranks, group)
        if not main:
            self.store.publish_part(staged, name)
        parallel.any_rank(False, ranks, group)  # every rank's files are in place
        if not main:
            return
        listed = {file: record for part in every for file, record in part.items()}  # type: ignore[attr-defined]
        meta: dict[str, object] = {
            "format": FORMAT,
            "step": step,
            "world_size": ranks.world_size,
            "files": dict(sorted(listed.items())),
        }
        self._publish(staged, name, meta, run)

    def _publish(
        self, staged: Path, name: str, meta: dict[str, object], run: Mapping[str, object] | None
    ) -> None:
        """Adds the run, the carried model files and ``meta.json`` (last) to ``staged``,
        publishes it as ``name`` and prunes to the newest :attr:`keep`."""
        if run is not None:
            meta["run"] = {k: v for k, v in run.items() if k != BEST}
            if BEST in run:
                meta[BEST] = run[BEST]
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
            if old not in self.pinned:
                self.store.delete(old)

    def remove_stale(self) -> list[str]:
        """What saves killed midway left behind, removed (see :meth:`Store.remove_stale`). Call
        it on the writing rank before its first save."""
        return self.store.remove_stale()

    def meta_of(self, name: str) -> dict[str, Any]:
        """``meta.json`` of checkpoint ``name``.

        Raises:
            CheckpointError: it is unreadable or not a JSON object.
        """
        try:
            meta = json.loads(self.store.read(name, META))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {name}: unreadable ({e})") from e
        if not isinstance(meta, dict):
            raise CheckpointError(f"checkpoint {name}: unreadable ({META} is not an object)")
        return meta

    def run_of(self, name: str) -> dict[str, object] | None:
        """The run configuration checkpoint ``name`` was saved with; None for a checkpoint
        written before checkpoints recorded it.

        Raises:
            CheckpointError: ``meta.json`` is unreadable.
        """
        run = self.meta_of(name).get("run")
        return dict(run) if isinstance(run, dict) else None

    def model_files_of(self, name: str) -> list[str]:
        """The names of the model files checkpoint ``name`` carries (empty for a run that did not
        start from a model directory).

        Raises:
            CheckpointError: ``meta.json`` is unreadable.
        """
        return [str(f) for f in self.meta_of(name).get("model_files", [])]

    def base_model_of(self, name: str) -> str:
        """The model directory the run of checkpoint ``name`` started from ("" if none was
        recorded).

        Raises:
            CheckpointError: ``meta.json`` is unreadable.
        """
        return str(self.meta_of(name).get("base_model", ""))

    def model_file(self, name: str, file: str) -> AbstractContextManager[Path]:
        """A local path of carried model file ``file`` of checkpoint ``name`` while the context
        lasts (see :meth:`model_files_of`)."""
        return self.store.local_file(name, f"{MODEL_FILES}/{file}")

    def format_of(self, name: str) -> str:
        """The format of checkpoint ``name``: :data:`FORMAT`, or :data:`FORMAT_TORCH_SAVE` (an
        earlier trainer's).

        Raises:
            CheckpointError: ``meta.json`` is unreadable, or names another format (a newer
                trainer's); the message names the format and those this trainer reads.
        """
        found = self.meta_of(name).get("format")
        if found not in (FORMAT, FORMAT_TORCH_SAVE):
            raise CheckpointError(
                f"checkpoint {name}: format {found!r} is not one this trainer reads ({FORMAT!r}, "
                f"or {FORMAT_TORCH_SAVE!r} from earlier trainers); a newer trainer wrote it: "
                "resume or export it with that trainer's image"
            )
        return str(found)

    def verify(self, name: str) -> None:
        """Checks the format, size and CRC-32 of every file of checkpoint ``name``, reading each
        a chunk at a time.

        Raises:
            CheckpointError: unreadable, of a format this trainer does not read (named),
                truncated or failing its CRC; the message names it.
        """
        if self.format_of(name) == FORMAT_TORCH_SAVE:
            with self.store.local_file(name, STATE) as path:
                self._check_torch_save(name, path, crc=True)
            return
        with self._shards(name) as folder:
            self._check_shards(name, folder, crc=True)

    @contextlib.contextmanager
    def _shards(self, name: str) -> Iterator[Path]:
        """A local folder of the DCP files of checkpoint ``name``."""
        try:
            files = list(self.meta_of(name)["files"])
        except (KeyError, TypeError) as e:
            raise CheckpointError(f"checkpoint {name}: unreadable (no file list: {e})") from e
        names = [f.removeprefix(f"{SHARDS}/") for f in files]
        try:
            with self.store.local_folder(name, SHARDS, names) as folder:
                yield folder
        except OSError as e:
            raise CheckpointError(f"checkpoint {name}: unreadable ({e})") from e

    def _check_shards(self, name: str, folder: Path, *, crc: bool) -> None:
        for file, record in self.meta_of(name)["files"].items():
            path = folder / file.removeprefix(f"{SHARDS}/")
            try:
                size = path.stat().st_size
            except OSError as e:
                raise CheckpointError(f"checkpoint {name}: unreadable ({e})") from e
            if size != record["bytes"] or (crc and f"{_crc32(path):08x}" != record["crc32"]):
                raise CheckpointError(f"checkpoint {name}: {file} fails its size or CRC-32 check")

    def _check_torch_save(self, name: str, path: Path, *, crc: bool) -> None:
        try:
            meta = self.meta_of(name)
            size = path.stat().st_size
            if size != meta["bytes"] or (crc and f"{_crc32(path):08x}" != meta["crc32"]):
                raise CheckpointError(f"checkpoint {name}: {STATE} fails its size or CRC-32 check")
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"checkpoint {name}: unreadable ({e})") from e

    def load(
        self, name: str, *, verify: bool = True, parts: tuple[str, ...] | None = None
    ) -> dict[str, Any]:
        """The state of checkpoint ``name`` in this process alone, on CPU, after :meth:`verify`
        (``verify=False``: the format and sizes only, for a checkpoint another rank has
        verified): ``step``, ``model``, ``optimizer`` and ``rng``, whatever the number of ranks
        that wrote it, shaped from the checkpoint alone (an export, an evaluation). ``parts``
        (default all) names the ones to read (``("model",)`` for an export). An earlier
        trainer's :data:`FORMAT_TORCH_SAVE` checkpoint is memory-mapped whole.

        Raises:
            CheckpointError: unreadable, of a format this trainer does not read (named),
                truncated or failing its CRC; the message names it.
        """
        if self.format_of(name) == FORMAT_TORCH_SAVE:
            return self._load_torch_save(name, verify=verify)
        with self._shards(name) as folder:
            self._check_shards(name, folder, crc=verify)
            try:
                state = _read_whole(folder, parts)
            except (OSError, RuntimeError, ValueError) as e:
                raise CheckpointError(f"checkpoint {name}: unreadable ({e})") from e
        state["step"] = self.meta_of(name)["step"]
        return state

    def _load_torch_save(self, name: str, *, verify: bool) -> dict[str, Any]:
        """An earlier trainer's ``state.pt``, mapped (``torch.load(mmap=True)``): the ranks of a
        node share the page cache's one copy."""
        with self.store.local_file(name, STATE) as path:
            self._check_torch_save(name, path, crc=verify)
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

    def best_valid(self) -> tuple[str, dict[str, Any]] | None:
        """The checkpoint whose ``meta.json`` records the best eval figure (``best``: its
        ``metric``, ``value``; lower is better for a metric named ``*loss``, else higher; the
        newer on a tie) among those that pass :meth:`verify`, with that record; None when no
        checkpoint records one."""
        found: list[tuple[str, dict[str, Any]]] = []
        for name in self.store.names():
            record = self.meta_of(name).get(BEST)
            if isinstance(record, dict):
                found.append((name, record))
        lower = any(str(r.get("metric", "")).endswith("loss") for _, r in found)
        order = sorted(found, key=lambda f: (-f[1]["value"] if lower else f[1]["value"], f[0]))
        for name, record in reversed(order):
            try:
                self.verify(name)
            except CheckpointError as e:
                warnings.warn(f"skipping {e}", CorruptCheckpointWarning, stacklevel=2)
            else:
                return name, record
        return None

    def resume(
        self, name: str, model: nn.Module, optimizer: torch.optim.Optimizer, *, verify: bool = True
    ) -> int:
        """Loads checkpoint ``name`` into ``model`` and ``optimizer``, whatever the world size
        that wrote it, and returns the step to train next. DCP reads into the model's and
        optimizer's own tensors, each rank what its part of the state needs: together with the
        other ranks where the state is sharded (DTensor), in each process alone otherwise. An
        earlier trainer's :data:`FORMAT_TORCH_SAVE` checkpoint is mapped (see :meth:`load`).

        Raises:
            CheckpointError: unreadable, of a format this trainer does not read (named), or
                lacking a parameter this model trains.
        """
        if self.format_of(name) == FORMAT_TORCH_SAVE:
            state = self._load_torch_save(name, verify=verify)
            return self.restore(state, model, optimizer, name=name)
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.state_dict_loader import load
        from torch.distributed.tensor import DTensor

        options = _options(model, full=False)
        state = {
            "model": _model_state(model, options),
            "optimizer": _optimizer_state(model, optimizer, options),
            "rng": torch.get_rng_state(),
        }
        sharded = any(isinstance(t, DTensor) for t in state["model"].values())
        alone = not (sharded and torch.distributed.is_initialized())
        with self._shards(name) as folder:
            self._check_shards(name, folder, crc=verify)
            try:
                with _one_process_quietly(alone):
                    load(state, storage_reader=FileSystemReader(folder), no_dist=alone)
            except (OSError, RuntimeError, ValueError) as e:
                raise CheckpointError(f"checkpoint {name}: unreadable ({e})") from e
        _set_state(model, optimizer, state, options)
        torch.set_rng_state(state["rng"])
        step: int = self.meta_of(name)["step"]
        return step

    @staticmethod
    def restore(
        state: dict[str, Any],
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        name: str = "the checkpoint",
    ) -> int:
        """Loads full ``state`` into ``model`` and ``optimizer``; returns the step to train next.

        Raises:
            CheckpointError: ``state`` lacks a parameter this model trains.
        """
        options = _options(model, full=True)
        # Strict loading checks a model without frozen parameters; with them (LoRA), the
        # trained ones are checked here, under the names the state uses (no wrapper prefixes).
        missing = sorted(
            clean
            for n, p in model.named_parameters()
            if p.requires_grad and (clean := _plain_name(n)) not in state["model"]
        )
        if missing:
            raise CheckpointError(
                f"{name} lacks trained parameters of this model: {', '.join(missing[:5])}"
            )
        _set_state(model, optimizer, state, options)
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
    cfg: TrainConfig,
    spec: ModelSpec,
    *,
    world_size: int,
    manifest_sha256: str,
    model_id: str | None = None,
    total_steps: int | None = None,
    packed: bool = False,
) -> dict[str, object]:
    """What a resumed run must share with the run that saved the checkpoint: the preset, the
    seed, the global batch (sequences per optimizer step, however ranks and accumulation split
    it), the learning-rate schedule over the run's ``total_steps`` (default ``cfg.steps``) and
    the data (its manifest's SHA-256); for a run from a model directory also the model
    (``model_id``, see :func:`trainer.hf.fingerprint`), and the sequence length where it was
    chosen rather than the preset's, a LoRA run's rank, alpha and target modules (``lora``), a
    run of ``cfg.epochs`` its epochs, and one in ``packed`` rows their layout
    (:data:`trainer.packing.LAYOUT`), which with the seed fixes every step's rows."""
    steps = cfg.steps if total_steps is None else total_steps
    run: dict[str, object] = {
        "preset": cfg.preset,
        "seed": cfg.seed,
        "global_batch": cfg.batch_per_rank * world_size * cfg.grad_accum,
        "peak_lr": cfg.peak_lr,
        "min_lr_ratio": cfg.min_lr_ratio,
        "warmup_steps": cfg.warmup_for(steps),
        "max_steps": steps,
        "data_manifest_sha256": manifest_sha256,
    }
    if cfg.epochs:
        run["epochs"] = cfg.epochs
    if packed:
        run["rows"] = packing.LAYOUT
    if model_id is not None:
        run["model"] = model_id
    if model_id is not None or cfg.seq_len:
        run["seq_len"] = spec.config.seq_len
    if spec.lora is not None:
        run["lora"] = spec.lora.as_dict()
    return run


def check_resume(name: str, saved: Mapping[str, object] | None, run: Mapping[str, object]) -> None:
    """Refuses to resume from checkpoint ``name`` with a configuration other than ``saved``;
    a checkpoint that recorded none (written before this check existed) is accepted.

    Raises:
        RunConfigError: a LoRA checkpoint's base model differs (its own message), or naming
            every field that differs with both values.
    """
    if saved is None:
        return
    if saved.get("lora") is not None and saved.get("model") != run.get("model"):
        raise RunConfigError(
            f"refusing to resume from checkpoint {name}: it holds LoRA adapters only, trained "
            f"on the base model of fingerprint {saved.get('model')!r}, and this run's --model "
            f"has {run.get('model')!r}; adapters fit only the base they were trained on: "
            "resume with that base model, or start a new run in another checkpoint directory"
        )
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
