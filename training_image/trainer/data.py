"""Pre-tokenized shards, their manifest, and a sampler that is a pure function of the step.

Shard file: a 32-byte header (magic ``TRNSHRD1``, format version, bytes per token, token count;
little-endian) followed by the tokens as little-endian uint16 or uint32. ``manifest.json`` lists
each shard's name, token count and SHA-256 with the tokenizer id, vocabulary size and dtype.

Shards are hashed in full when they are written and staged (``trnctl data stage`` checks them
with this module's reader before it uploads them, and S3 checks each part's SHA-256). Opening a
dataset for training checks the manifest, each shard's header and size, and records the
manifest's own SHA-256, which pins every shard's hash; re-hashing every shard is a choice
(``verify``), as it reads the whole dataset.

Batches are drawn by :class:`WindowSampler` from ``(seed, step)`` alone; each rank reads its slice
of the step's global batch, so a resumed run sees exactly the batches it would have seen, and one
rank accumulating gradients over N micro-steps sees the same global batch as N ranks.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

MAGIC = b"TRNSHRD1"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sIIQ8x")
MANIFEST = "manifest.json"
BYTE_TOKENIZER = "bytes-v1"
DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "corpus"
_DTYPES: dict[int, np.dtype[np.unsignedinteger]] = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


class ShardError(ValueError):
    """A shard or the manifest is missing, truncated, or fails its checksum; ``shard`` names it."""

    def __init__(self, shard: str, problem: str) -> None:
        self.shard = shard
        super().__init__(f"shard {shard}: {problem}")


def dtype_for_vocab(vocab_size: int) -> np.dtype[np.unsignedinteger]:
    """uint16 when every token id fits, else uint32."""
    return _DTYPES[2] if vocab_size <= 1 << 16 else _DTYPES[4]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def write_shard(path: Path, tokens: np.ndarray, dtype: np.dtype) -> str:
    """Writes one shard and returns its SHA-256.

    Raises:
        ValueError: a token does not fit ``dtype``.
    """
    if tokens.size and int(tokens.max()) > np.iinfo(dtype).max:
        raise ValueError(f"token id {int(tokens.max())} does not fit {dtype.name}")
    with path.open("wb") as f:
        f.write(HEADER.pack(MAGIC, FORMAT_VERSION, dtype.itemsize, tokens.size))
        f.write(np.ascontiguousarray(tokens, dtype=dtype).tobytes())
    return _sha256(path)


def write_dataset(
    out: Path,
    token_chunks: Iterable[np.ndarray],
    *,
    vocab_size: int,
    tokenizer: str,
    shard_tokens: int = 1 << 24,
) -> dict[str, object]:
    """Writes ``token_chunks`` as shards of at most ``shard_tokens`` (default 16M) tokens plus the
    manifest; returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    dtype = dtype_for_vocab(vocab_size)
    shards: list[dict[str, object]] = []
    pending: list[np.ndarray] = []
    pending_size = 0

    def flush() -> None:
        nonlocal pending, pending_size
        tokens = np.concatenate(pending)
        name = f"shard_{len(shards):05d}.bin"
        shards.append(
            {
                "name": name,
                "tokens": int(tokens.size),
                "sha256": write_shard(out / name, tokens, dtype),
            }
        )
        pending, pending_size = [], 0

    for chunk in token_chunks:
        while chunk.size:
            take = chunk[: shard_tokens - pending_size]
            pending.append(take)
            pending_size += take.size
            chunk = chunk[take.size :]
            if pending_size == shard_tokens:
                flush()
    if pending_size:
        flush()
    manifest: dict[str, object] = {
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer,
        "vocab_size": vocab_size,
        "dtype": dtype.name,
        "shards": shards,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def prepare_corpus(
    out: Path, corpus: Path = DEFAULT_CORPUS, *, shard_tokens: int = 1 << 16
) -> dict[str, object]:
    """Tokenizes every ``*.txt`` under ``corpus`` (default: the corpus shipped with the trainer)
    as UTF-8 bytes (vocabulary 256) into shards of ``shard_tokens`` (default 65,536) tokens.

    Raises:
        FileNotFoundError: ``corpus`` has no ``.txt`` file.
    """
    files = sorted(corpus.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"corpus {corpus} has no .txt files")
    chunks = (np.frombuffer(f.read_bytes(), dtype=np.uint8) for f in files)
    return write_dataset(
        out, chunks, vocab_size=256, tokenizer=BYTE_TOKENIZER, shard_tokens=shard_tokens
    )


@dataclass(frozen=True)
class Dataset:
    """Memory-mapped shards of one prepared directory."""

    root: Path
    tokenizer: str
    vocab_size: int
    shards: tuple[np.memmap, ...]
    names: tuple[str, ...]
    manifest_sha256: str = ""

    @property
    def num_tokens(self) -> int:
        return sum(s.size for s in self.shards)


def open_dataset(root: str | Path, *, verify: bool = True) -> Dataset:
    """Opens a directory written by :func:`write_dataset`, checking each shard's header and size
    and (with ``verify``, the default) its SHA-256 against the manifest; the dataset carries the
    manifest's SHA-256.

    Raises:
        ShardError: the manifest or a shard is missing or wrong; the message names the shard.
    """
    root = Path(root)
    try:
        raw_manifest = (root / MANIFEST).read_bytes()
        manifest = json.loads(raw_manifest)
        entries = manifest["shards"]
        dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ShardError(str(root / MANIFEST), f"unreadable manifest ({e})") from e
    maps, names = [], []
    for entry in entries:
        path = root / entry["name"]
        if not path.is_file():
            raise ShardError(str(path), "missing")
        with path.open("rb") as f:
            raw = f.read(HEADER.size)
        if len(raw) < HEADER.size:
            raise ShardError(str(path), "shorter than its header")
        magic, version, itemsize, count = HEADER.unpack(raw)
        if magic != MAGIC or version != FORMAT_VERSION or itemsize != dtype.itemsize:
            raise ShardError(
                str(path),
                f"bad header (magic {magic!r}, version {version}, {itemsize} bytes per token; "
                f"expected {MAGIC!r}, {FORMAT_VERSION}, {dtype.itemsize})",
            )
        if count != entry["tokens"] or path.stat().st_size != HEADER.size + count * itemsize:
            raise ShardError(
                str(path),
                f"holds {path.stat().st_size} bytes, the manifest says {entry['tokens']} tokens",
            )
        if verify and _sha256(path) != entry["sha256"]:
            raise ShardError(str(path), "checksum mismatch (SHA-256 differs from the manifest)")
        maps.append(np.memmap(path, dtype=dtype, mode="r", offset=HEADER.size, shape=(count,)))
        names.append(entry["name"])
    return Dataset(
        root,
        manifest["tokenizer"],
        int(manifest["vocab_size"]),
        tuple(maps),
        tuple(names),
        hashlib.sha256(raw_manifest).hexdigest(),
    )


class WindowSampler:
    """Random windows of ``seq_len + 1`` tokens that never cross a shard boundary.

    Each step's global batch is ``micro_batch * world_size * grad_accum`` windows drawn from
    ``(seed, step)``; micro-step ``m`` of rank ``r`` reads block ``m * world_size + r`` of
    ``micro_batch`` rows.

    Raises:
        ValueError: no shard holds a full window.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        seq_len: int,
        micro_batch: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        grad_accum: int = 1,
    ) -> None:
        self.dataset, self.seq_len, self.micro_batch = dataset, seq_len, micro_batch
        self.seed, self.rank, self.world_size, self.grad_accum = seed, rank, world_size, grad_accum
        windows = np.array([max(0, s.size - seq_len) for s in dataset.shards], dtype=np.int64)
        if windows.sum() == 0:
            raise ValueError(f"no shard in {dataset.root} holds {seq_len + 1} tokens (seq_len + 1)")
        self._ends = np.cumsum(windows)
        self._starts = self._ends - windows

    def batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, int64 ``(micro_batch, seq_len)`` CPU tensors, for this rank."""
        rng = np.random.Generator(np.random.PCG64([self.seed, step]))
        picks = rng.integers(
            0, int(self._ends[-1]), size=self.micro_batch * self.world_size * self.grad_accum
        )
        block = micro_step * self.world_size + self.rank
        picks = picks[block * self.micro_batch : (block + 1) * self.micro_batch]
        shard_ids = np.searchsorted(self._ends, picks, side="right")
        offsets = picks - self._starts[shard_ids]
        span = self.seq_len + 1
        rows = np.empty((self.micro_batch, span), dtype=np.int64)
        for i, (s, o) in enumerate(zip(shard_ids, offsets, strict=True)):
            rows[i] = self.dataset.shards[s][o : o + span]
        # Imported here: trnctl data stage writes shards with this module and needs no torch.
        import torch

        t = torch.from_numpy(rows)
        return t[:, :-1], t[:, 1:]
