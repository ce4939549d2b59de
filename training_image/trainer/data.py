"""Pre-tokenized shards, their manifest, and a sampler that is a pure function of the step.

Shard file: a 32-byte header (magic ``TRNSHRD1``, format version, bytes per token, token count;
little-endian) followed by the tokens as little-endian uint16 or uint32. ``manifest.json`` lists
each shard's name, token count and SHA-256 with the tokenizer id, vocabulary size and dtype.

Manifest format 2 (``trn-train prepare-data --tokenizer``) adds, all optional to a reader:
``tokenizer_sha256`` and ``eos_token_id``; a loss-mask stream, one mask file per shard (the same
header with magic ``TRNMASK1`` and 1 byte per token, 1 = the token is trained as a target),
named with its SHA-256 in the shard's ``mask`` entry; and ``eval_shards``, the held-out split,
in the same form as ``shards``. The shard files themselves are unchanged, so format-1
directories (the byte corpus, which is still written as format 1) load as before.

Manifest format 3 (``prepare-data --format jsonl|chat``) keeps examples whole: an example (a
JSONL document, a conversation) never spans two shards, and each shard's ``index`` entry names
an index file (the same header with magic ``TRNINDX1`` and 8 bytes per value) of the offsets
at which its examples start, then the shard's token count, with the file's SHA-256 and the
number of examples. Such a dataset trains in packed rows of whole examples
(:class:`trainer.packing.PackedSampler`); formats 1 and 2 (the byte corpus, ``--format text``)
stay a token stream drawn in windows (:class:`WindowSampler`).

Shards are hashed in full when they are written and staged (``trnctl data stage`` checks them
with this module's reader before it uploads them, and S3 checks each part's SHA-256). Opening a
dataset for training checks the manifest, each shard's header and size, and records the
manifest's own SHA-256, which pins every shard's hash; re-hashing every shard is a choice
(``verify``), as it reads the whole dataset.

Batches are drawn by :class:`WindowSampler` from ``(seed, step)`` alone; each rank reads its slice
of the step's global batch, so a resumed run sees exactly the batches it would have seen, and one
rank accumulating gradients over N micro-steps sees the same global batch as N ranks. Targets
whose mask is 0 are :data:`IGNORE_INDEX` (-100), the value PyTorch's ``cross_entropy`` skips by
default.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

MAGIC = b"TRNSHRD1"
MASK_MAGIC = b"TRNMASK1"
INDEX_MAGIC = b"TRNINDX1"
FORMAT_VERSION = 1
EXAMPLES_VERSION = 3  # the manifest format whose shards hold whole examples
MANIFEST_VERSIONS = (1, 2, EXAMPLES_VERSION)
IGNORE_INDEX = -100
HEADER = struct.Struct("<8sIIQ8x")
MANIFEST = "manifest.json"
BYTE_TOKENIZER = "bytes-v1"
# The sample corpus: beside the trainer package in the checkout and the image
# (training_image/corpus), inside it where the ops wheel installed the trainer (trainer/corpus).
_HERE = Path(__file__).resolve().parent
DEFAULT_CORPUS = _HERE / "corpus" if (_HERE / "corpus").is_dir() else _HERE.parent / "corpus"
_DTYPES: dict[int, np.dtype[np.unsignedinteger]] = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
_MASK_DTYPE = np.dtype("u1")
_INDEX_DTYPE = np.dtype("<u8")


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


def write_shard(path: Path, tokens: np.ndarray, dtype: np.dtype, *, magic: bytes = MAGIC) -> str:
    """Writes one shard (``magic`` :data:`MASK_MAGIC` and dtype uint8: a mask file) and returns
    its SHA-256.

    Raises:
        ValueError: a token does not fit ``dtype``.
    """
    if tokens.size and int(tokens.max()) > np.iinfo(dtype).max:
        raise ValueError(f"token id {int(tokens.max())} does not fit {dtype.name}")
    with path.open("wb") as f:
        f.write(HEADER.pack(magic, FORMAT_VERSION, dtype.itemsize, tokens.size))
        f.write(np.ascontiguousarray(tokens, dtype=dtype).tobytes())
    return _sha256(path)


class _ShardWriter:
    """Cuts a stream of tokens (and, when ``masked``, their mask) into shards named
    ``{prefix}_NNNNN.bin`` (masks ``{prefix}_NNNNN.mask``) of at most ``shard_tokens`` tokens.
    With ``examples``, each :meth:`add` is one example, kept whole in one shard (a shard closes
    before an example that would take it past ``shard_tokens``; an example longer than that has
    a shard of its own), and each shard gets an index of its examples' offsets
    (``{prefix}_NNNNN.idx``)."""

    def __init__(
        self,
        out: Path,
        prefix: str,
        dtype: np.dtype,
        shard_tokens: int,
        *,
        masked: bool,
        examples: bool = False,
    ) -> None:
        self.out, self.prefix, self.dtype, self.shard_tokens = out, prefix, dtype, shard_tokens
        self.masked, self.examples = masked, examples
        self.entries: list[dict[str, object]] = []
        self._tokens: list[np.ndarray] = []
        self._masks: list[np.ndarray] = []
        self._ends: list[int] = []
        self._size = 0

    def add(self, tokens: np.ndarray, mask: np.ndarray | None = None) -> None:
        if self.masked and mask is None:
            mask = np.ones(tokens.size, dtype=np.uint8)
        if self.examples:
            if self._size and self._size + tokens.size > self.shard_tokens:
                self.flush()
            self._append(tokens, mask)
            self._ends.append(self._size)
            return
        while tokens.size:
            take = self.shard_tokens - self._size
            self._append(tokens[:take], None if mask is None else mask[:take])
            mask = None if mask is None else mask[take:]
            tokens = tokens[take:]
            if self._size == self.shard_tokens:
                self.flush()

    def _append(self, tokens: np.ndarray, mask: np.ndarray | None) -> None:
        self._tokens.append(tokens)
        if mask is not None:
            self._masks.append(mask)
        self._size += tokens.size

    def flush(self) -> None:
        if not self._size:
            return
        stem = f"{self.prefix}_{len(self.entries):05d}"
        tokens = np.concatenate(self._tokens)
        entry: dict[str, object] = {
            "name": f"{stem}.bin",
            "tokens": int(tokens.size),
            "sha256": write_shard(self.out / f"{stem}.bin", tokens, self.dtype),
        }
        if self.masked:
            mask = np.concatenate(self._masks)
            digest = write_shard(self.out / f"{stem}.mask", mask, _MASK_DTYPE, magic=MASK_MAGIC)
            entry["mask"] = {"name": f"{stem}.mask", "sha256": digest}
        if self.examples:
            offsets = np.asarray([0, *self._ends], dtype=np.uint64)
            digest = write_shard(self.out / f"{stem}.idx", offsets, _INDEX_DTYPE, magic=INDEX_MAGIC)
            entry["index"] = {"name": f"{stem}.idx", "sha256": digest, "examples": len(self._ends)}
        self.entries.append(entry)
        self._tokens, self._masks, self._ends, self._size = [], [], [], 0


def write_dataset(
    out: Path,
    token_chunks: Iterable[np.ndarray],
    *,
    vocab_size: int,
    tokenizer: str,
    shard_tokens: int = 1 << 24,
) -> dict[str, object]:
    """Writes ``token_chunks`` as shards of at most ``shard_tokens`` (default 16M) tokens plus a
    format-1 manifest (no masks, no held-out split); returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    dtype = dtype_for_vocab(vocab_size)
    writer = _ShardWriter(out, "shard", dtype, shard_tokens, masked=False)
    for chunk in token_chunks:
        writer.add(chunk)
    writer.flush()
    manifest: dict[str, object] = {
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer,
        "vocab_size": vocab_size,
        "dtype": dtype.name,
        "shards": writer.entries,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def summary(manifest: Mapping[str, Any], out: str | Path) -> str:
    """One line on what a manifest holds, e.g. ``wrote 1 shards, 900 tokens, to OUT``, with the
    held-out tokens when there is a held-out split; for a dataset of examples also the examples
    of each split."""
    tokens = sum(s["tokens"] for s in manifest["shards"])
    held_out = manifest.get("eval_shards", [])
    held_tokens = sum(s["tokens"] for s in held_out)
    examples = manifest.get("examples")
    if examples is None:
        line = f"wrote {len(manifest['shards'])} shards, {tokens} tokens, to {out}"
        return line + (f"; held out {held_tokens} tokens for eval" if held_out else "")
    line = (
        f"wrote {len(manifest['shards'])} shards, {examples['train']} examples ({tokens} "
        f"tokens), to {out}"
    )
    if held_out:
        line += f"; held out {examples['eval']} examples ({held_tokens} tokens) for eval"
    cuts = manifest.get("cut_at_seq_len")
    if cuts:
        line += f"; at seq_len {cuts['seq_len']}: " + ", ".join(
            f"{cuts[split]['cut']} cut and {cuts[split]['dropped']} dropped of {split}"
            for split in ("train", "eval")
            if cuts[split]["examples"]
        )
    return line


def eval_tokens_for(total_tokens: int, eval_fraction: float) -> int:
    """Tokens held out for evaluation: ``ceil(eval_fraction * total_tokens)``, 0 for 0.

    Raises:
        ValueError: ``eval_fraction`` outside [0, 0.5].
    """
    if not 0.0 <= eval_fraction <= 0.5:
        raise ValueError(f"--eval-fraction must be between 0 and 0.5, got {eval_fraction}")
    return math.ceil(eval_fraction * total_tokens)


def split_point(sizes: Sequence[int], eval_fraction: float) -> int:
    """Where the held-out tail of documents of ``sizes`` tokens starts: on the boundary between
    two documents nearest to holding out the last :func:`eval_tokens_for` tokens (the earlier
    boundary, holding out more, on a tie), so that no document is split between training and
    eval and both sides keep at least one document. A single document is cut at the token count
    itself, as nothing else leaves both sides tokens. The total when nothing is held out.

    Raises:
        ValueError: ``eval_fraction`` outside [0, 0.5].
    """
    total = sum(sizes)
    target = total - eval_tokens_for(total, eval_fraction)
    if target == total or len(sizes) < 2:
        return target
    boundaries = np.cumsum(sizes[:-1]).tolist()
    return int(min(boundaries, key=lambda b: (abs(b - target), b)))


def write_split_dataset(
    out: Path,
    documents: Sequence[tuple[np.ndarray, np.ndarray | None]],
    *,
    vocab_size: int,
    identity: Mapping[str, object],
    eval_fraction: float = 0.01,
    shard_tokens: int = 1 << 24,
) -> dict[str, object]:
    """Writes ``documents`` (token ids and a mask or None, in order) as a format-2 dataset and
    returns its manifest. The held-out split is the tail of the token stream from
    :func:`split_point` on (whole documents, unless there is only one), written as ``eval_*``
    shards; a mask stream is written when any document has a mask.
    ``identity`` (the tokenizer's name, SHA-256 and EOS id) goes into the manifest as given.

    Raises:
        ValueError: ``eval_fraction`` outside [0, 0.5]; a token does not fit the dtype.
    """
    out.mkdir(parents=True, exist_ok=True)
    dtype = dtype_for_vocab(vocab_size)
    masked = any(mask is not None for _, mask in documents)
    train_left = split_point([tokens.size for tokens, _ in documents], eval_fraction)
    train = _ShardWriter(out, "shard", dtype, shard_tokens, masked=masked)
    held_out = _ShardWriter(out, "eval", dtype, shard_tokens, masked=masked)
    for tokens, mask in documents:
        cut = min(train_left, tokens.size)
        train.add(tokens[:cut], None if mask is None else mask[:cut])
        held_out.add(tokens[cut:], None if mask is None else mask[cut:])
        train_left -= cut
    train.flush()
    held_out.flush()
    manifest: dict[str, object] = {
        "format_version": 2,
        **identity,
        "vocab_size": vocab_size,
        "dtype": dtype.name,
        "masked": masked,
        "shards": train.entries,
        "eval_shards": held_out.entries,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


Example = tuple[np.ndarray, "np.ndarray | None"]  # token ids, and a loss mask or None


def held_out_count(examples: int, eval_fraction: float) -> int:
    """Examples held out for evaluation: ``ceil(eval_fraction * examples)``, so at least one
    when ``eval_fraction`` is above 0, and 0 for 0.

    Raises:
        ValueError: ``eval_fraction`` outside [0, 0.5].
    """
    return eval_tokens_for(examples, eval_fraction)


def split_examples(
    examples: Sequence[Example], eval_fraction: float
) -> tuple[list[Example], list[Example]]:
    """The training and held-out examples of ``examples``: the :func:`held_out_count` examples
    whose token ids and mask have the lowest SHA-256 are held out, the others train in their
    order. Chosen by content, not position, so that the same examples in another order make the
    same two splits; identical examples are interchangeable.

    Raises:
        ValueError: ``eval_fraction`` outside [0, 0.5], or it would hold out every example.
    """
    count = held_out_count(len(examples), eval_fraction)
    if count and count >= len(examples):
        raise ValueError(
            f"--eval-fraction {eval_fraction} of {len(examples)} examples holds out "
            f"{count}, leaving none to train on; give more examples, a smaller fraction, or "
            "--eval-input FILE"
        )
    digests = [_example_digest(tokens, mask) for tokens, mask in examples]
    chosen = set(sorted(range(len(examples)), key=lambda i: (digests[i], i))[:count])
    train = [e for i, e in enumerate(examples) if i not in chosen]
    held_out = [e for i, e in enumerate(examples) if i in chosen]
    return train, held_out


def _example_digest(tokens: np.ndarray, mask: np.ndarray | None) -> bytes:
    h = hashlib.sha256(np.asarray(tokens, dtype="<u4").tobytes())
    if mask is not None:
        h.update(np.asarray(mask, dtype=np.uint8).tobytes())
    return h.digest()


def write_examples_dataset(
    out: Path,
    train: Sequence[Example],
    held_out: Sequence[Example],
    *,
    vocab_size: int,
    identity: Mapping[str, object],
    shard_tokens: int = 1 << 24,
    extra: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """Writes ``train`` and ``held_out`` examples (token ids and a mask or None, in order) as a
    format-3 dataset of whole examples (see the module's documentation) and returns its
    manifest: ``shards`` and ``eval_shards``, each shard with its ``index``, ``examples`` the
    two splits' example counts, and ``extra`` (what prepare-data reports) as given. A mask
    stream is written when any example has a mask.

    Raises:
        ValueError: no training example; a token does not fit the dtype.
    """
    if not train:
        raise ValueError("no training example to write")
    out.mkdir(parents=True, exist_ok=True)
    dtype = dtype_for_vocab(vocab_size)
    masked = any(mask is not None for _, mask in [*train, *held_out])
    entries = []
    for prefix, split in (("shard", train), ("eval", held_out)):
        writer = _ShardWriter(out, prefix, dtype, shard_tokens, masked=masked, examples=True)
        for tokens, mask in split:
            writer.add(np.asarray(tokens, dtype=dtype), mask)
        writer.flush()
        entries.append(writer.entries)
    manifest: dict[str, object] = {
        "format_version": EXAMPLES_VERSION,
        **identity,
        "vocab_size": vocab_size,
        "dtype": dtype.name,
        "masked": masked,
        "examples": {"train": len(train), "eval": len(held_out)},
        **(extra or {}),
        "shards": entries[0],
        "eval_shards": entries[1],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def dataset_files(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every file a manifest names, as (name, SHA-256): shards, their masks and indexes,
    held-out shards, then the dataset's other ``files`` (a classification dataset's labels,
    see :mod:`trainer.classify.data`)."""
    files = []
    for entry in [*manifest["shards"], *manifest.get("eval_shards", [])]:
        files.append((entry["name"], entry["sha256"]))
        for part in ("mask", "index"):
            if part in entry:
                files.append((entry[part]["name"], entry[part]["sha256"]))
    return files + [(entry["name"], entry["sha256"]) for entry in manifest.get("files", [])]


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
    """Memory-mapped shards of one prepared directory; ``masks`` (one per shard) is None when
    every token is trained, ``eval_split`` the held-out shards (None when there are none),
    ``index`` (one per shard: its examples' start offsets, then its token count) None for a
    token stream (formats 1 and 2)."""

    root: Path
    tokenizer: str
    vocab_size: int
    shards: tuple[np.memmap, ...]
    names: tuple[str, ...]
    manifest_sha256: str = ""
    masks: tuple[np.memmap, ...] | None = None
    eval_split: Dataset | None = None
    index: tuple[np.memmap, ...] | None = None

    @property
    def num_tokens(self) -> int:
        return sum(s.size for s in self.shards)

    @property
    def num_examples(self) -> int:
        """Examples of a dataset of examples; 0 for a token stream."""
        return sum(i.size - 1 for i in self.index) if self.index is not None else 0


def _open_file(
    root: Path, name: str, *, magic: bytes, dtype: np.dtype, tokens: int, sha256: str, verify: bool
) -> np.memmap:
    path = root / name
    if not path.is_file():
        raise ShardError(str(path), "missing")
    with path.open("rb") as f:
        raw = f.read(HEADER.size)
    if len(raw) < HEADER.size:
        raise ShardError(str(path), "shorter than its header")
    found, version, itemsize, count = HEADER.unpack(raw)
    if found != magic or version != FORMAT_VERSION or itemsize != dtype.itemsize:
        raise ShardError(
            str(path),
            f"bad header (magic {found!r}, version {version}, {itemsize} bytes per token; "
            f"expected {magic!r}, {FORMAT_VERSION}, {dtype.itemsize})",
        )
    if count != tokens or path.stat().st_size != HEADER.size + count * itemsize:
        raise ShardError(
            str(path), f"holds {path.stat().st_size} bytes, the manifest says {tokens} tokens"
        )
    if verify and _sha256(path) != sha256:
        raise ShardError(str(path), "checksum mismatch (SHA-256 differs from the manifest)")
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER.size, shape=(count,))


@dataclass(frozen=True)
class _Split:
    maps: tuple[np.memmap, ...]
    names: tuple[str, ...]
    masks: tuple[np.memmap, ...] | None
    index: tuple[np.memmap, ...] | None


def _open_split(
    root: Path,
    entries: list[dict[str, Any]],
    dtype: np.dtype,
    *,
    masked: bool,
    examples: bool,
    verify: bool,
) -> _Split:
    maps, names, masks, index = [], [], [], []
    for entry in entries:
        count = entry["tokens"]
        maps.append(
            _open_file(
                root,
                entry["name"],
                magic=MAGIC,
                dtype=dtype,
                tokens=count,
                sha256=entry["sha256"],
                verify=verify,
            )
        )
        names.append(entry["name"])
        if masked:
            mask = _part(root, entry, "mask")
            masks.append(
                _open_file(
                    root,
                    mask["name"],
                    magic=MASK_MAGIC,
                    dtype=_MASK_DTYPE,
                    tokens=count,
                    sha256=mask["sha256"],
                    verify=verify,
                )
            )
        if examples:
            index.append(_open_index(root, entry, verify=verify))
    return _Split(
        tuple(maps),
        tuple(names),
        tuple(masks) if masked else None,
        tuple(index) if examples else None,
    )


def _part(root: Path, entry: Mapping[str, Any], part: str) -> Mapping[str, Any]:
    if part not in entry:
        raise ShardError(str(root / entry["name"]), f"the manifest gives it no {part}")
    found: Mapping[str, Any] = entry[part]
    return found


def _open_index(root: Path, entry: Mapping[str, Any], *, verify: bool) -> np.memmap:
    """The shard's example offsets, checked: they start at 0, rise, and end at its size."""
    index = _part(root, entry, "index")
    offsets = _open_file(
        root,
        index["name"],
        magic=INDEX_MAGIC,
        dtype=_INDEX_DTYPE,
        tokens=int(index["examples"]) + 1,
        sha256=index["sha256"],
        verify=verify,
    )
    if offsets[0] != 0 or offsets[-1] != entry["tokens"] or np.any(np.diff(offsets) == 0):
        raise ShardError(
            str(root / index["name"]),
            f"its offsets do not cut {entry['tokens']} tokens into examples from 0 up",
        )
    return offsets


def open_dataset(root: str | Path, *, verify: bool = True) -> Dataset:
    """Opens a directory written by :func:`write_dataset` or :func:`write_split_dataset`,
    checking each shard's (and mask's) header and size and (with ``verify``, the default) its
    SHA-256 against the manifest; the dataset, and its held-out split, carry the manifest's
    SHA-256.

    Raises:
        ShardError: the manifest or a shard is missing or wrong; the message names the shard.
    """
    root = Path(root)
    if not (root / MANIFEST).is_file():
        raise ShardError(
            str(root / MANIFEST), "missing: not a directory made by `trn-train prepare-data`"
        )
    try:
        raw_manifest = (root / MANIFEST).read_bytes()
        manifest = json.loads(raw_manifest)
        entries = manifest["shards"]
        dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
        version = manifest.get("format_version", 1)
        masked = bool(manifest.get("masked", False))
        eval_entries = manifest.get("eval_shards", [])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ShardError(str(root / MANIFEST), f"unreadable manifest ({e})") from e
    if version not in MANIFEST_VERSIONS:
        raise ShardError(
            str(root / MANIFEST),
            f"format_version {version!r} is unknown; this trainer reads {MANIFEST_VERSIONS}",
        )
    digest = hashlib.sha256(raw_manifest).hexdigest()
    tokenizer, vocab_size = manifest["tokenizer"], int(manifest["vocab_size"])
    options = {"masked": masked, "examples": version >= EXAMPLES_VERSION, "verify": verify}
    train = _open_split(root, entries, dtype, **options)
    held_out = None
    if eval_entries:
        split = _open_split(root, eval_entries, dtype, **options)
        held_out = Dataset(
            root,
            tokenizer,
            vocab_size,
            split.maps,
            split.names,
            digest,
            split.masks,
            index=split.index,
        )
    return Dataset(
        root,
        tokenizer,
        vocab_size,
        train.maps,
        train.names,
        digest,
        train.masks,
        held_out,
        train.index,
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

    def _picks(self, step: int) -> np.ndarray:
        """Window starts of the step's whole global batch, in block order."""
        rng = np.random.Generator(np.random.PCG64([self.seed, step]))
        size = self.micro_batch * self.world_size * self.grad_accum
        return rng.integers(0, int(self._ends[-1]), size=size)

    def _locate(self, picks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        shard_ids = np.searchsorted(self._ends, picks, side="right")
        return shard_ids, picks - self._starts[shard_ids]

    def trained_targets(self, step: int) -> int:
        """Targets of the step's whole global batch (every rank, every micro-step) whose mask
        is 1; all of them for a dataset without masks. Host-side, from ``(seed, step)`` alone,
        so every rank knows it without communicating."""
        picks = self._picks(step)
        if self.dataset.masks is None:
            return picks.size * self.seq_len
        masks = self.dataset.masks
        shard_ids, offsets = self._locate(picks)
        return sum(
            int(np.count_nonzero(masks[s][o + 1 : o + self.seq_len + 1]))
            for s, o in zip(shard_ids, offsets, strict=True)
        )

    def batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, int64 ``(micro_batch, seq_len)`` CPU tensors, for this rank;
        a target whose mask is 0 is :data:`IGNORE_INDEX`."""
        block = micro_step * self.world_size + self.rank
        picks = self._picks(step)[block * self.micro_batch : (block + 1) * self.micro_batch]
        shard_ids, offsets = self._locate(picks)
        span = self.seq_len + 1
        rows = np.empty((self.micro_batch, span), dtype=np.int64)
        for i, (s, o) in enumerate(zip(shard_ids, offsets, strict=True)):
            rows[i] = self.dataset.shards[s][o : o + span]
        # Imported here: trnctl data stage writes shards with this module and needs no torch.
        import torch

        t = torch.from_numpy(rows)
        if self.dataset.masks is None:
            return t[:, :-1], t[:, 1:]
        targets = rows[:, 1:].copy()
        for i, (s, o) in enumerate(zip(shard_ids, offsets, strict=True)):
            targets[i][self.dataset.masks[s][o + 1 : o + span] == 0] = IGNORE_INDEX
        return t[:, :-1], torch.from_numpy(targets)
