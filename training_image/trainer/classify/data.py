"""Labelled documents for classification: ``trn-train prepare-data --format classify``, the
label files beside the shards, and the batches a classifier trains on.

Input: JSON lines of ``{"text": str, "label": str}`` (one class per document), or of
``{"text": str, "labels": [str, ...]}`` (multi-label: any number of classes, none included); one
file is all one kind. The label names of the training and held-out files together, sorted, are
the classes: class ``i`` is ``labels.json``'s ``i``-th name, so the ids do not depend on the
order of the lines.

A document is tokenized as transformers' text-classification pipelines tokenize it (the
tokenizer's own special tokens, ``add_special_tokens=True``, no EOS appended) and stored whole
as one example of a manifest-format-3 dataset (:mod:`trainer.data`). Beside the shards:
``labels.json`` (the names), and per split a NumPy file of the labels in the examples' stored
order: ``int32`` class ids (one class), or a ``uint8`` examples-by-classes matrix of 0/1
(multi-label). The manifest's ``classify`` entry names them with their SHA-256 (and
:func:`trainer.data.dataset_files` lists them, so ``trnctl data stage`` uploads and checks them).

The held-out split (``--eval-fraction``, default 0.01) is stratified: of each class (of each
combination of classes, multi-label) ``ceil(fraction * count)`` examples are held out, at most
all but one, chosen by the lowest SHA-256 of their tokens and labels as
:func:`trainer.data.split_examples` chooses; ``--eval-input FILE`` gives the held-out examples
instead.

Batches (:class:`ClassifySampler`): each row one example, its first ``seq_len`` tokens and then
the pad token (the tokenizer's, else its EOS) up to ``seq_len``: one static shape. A document
longer than that keeps the special tokens its tokenizer appends after a text (the manifest's
``tail_tokens``, :func:`tail_tokens`: BERT's ``[SEP]``), as transformers' tokenizers truncate
(``truncation=True`` cuts the text, not the special tokens), so a served model sees what it
trained on. Epoch ``e``
visits every example once in an order drawn from ``(seed, e)``; its last step is filled up with
empty rows, which no loss or metric counts.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainer import data, tokenizing
from trainer.packing import CutReport, cut_report

if TYPE_CHECKING:
    import torch

TASK = "classify"
LABELS_FILE = "labels.json"
LABEL_ARRAYS = {"train": "train_labels.npy", "eval": "eval_labels.npy"}
DEFAULT_EVAL_FRACTION = 0.01
# The third word of the epoch order's PCG64 seed, so the stream is not the other samplers'.
_ORDER_STREAM = 0x636C6173  # "clas"


class LabelsError(ValueError):
    """The classification labels of a dataset are missing, unreadable or do not fit its
    examples; the message names the file."""


@dataclass(frozen=True)
class Record:
    """One line of a classification file: where it is, its text and its label names."""

    where: str
    text: str
    labels: tuple[str, ...]


def read_records(path: Path) -> tuple[list[Record], bool]:
    """The records of a JSON-lines classification file and whether it is multi-label.

    Raises:
        tokenizing.InputError: a missing file, an empty one, a line that is not a JSON object
            with a string ``text`` and either a string ``label`` or a list of strings
            ``labels``, or lines of both kinds; the message names the line.
    """
    if not path.is_file():
        raise tokenizing.InputError(f"--input {str(path)!r} is not a file")
    records: list[Record] = []
    kinds: dict[bool, str] = {}
    for where, raw in tokenizing._json_lines(path):
        text = raw.get("text")
        if not isinstance(text, str):
            raise tokenizing.InputError(f"{where}: field 'text' must be a string, got {text!r:.40}")
        multi = "labels" in raw
        if multi == ("label" in raw):
            raise tokenizing.InputError(
                f"{where}: give exactly one of 'label' (a string: one class) and 'labels' (a "
                "list of strings: multi-label)"
            )
        kinds.setdefault(multi, where)
        if len(kinds) > 1:
            raise tokenizing.InputError(
                f"{where}: mixes 'label' and 'labels' lines (see {kinds[not multi]}); a file is "
                "all one class per line or all multi-label"
            )
        records.append(Record(where, text, _label_names(where, raw, multi)))
    if not records:
        raise tokenizing.InputError(f"--input {str(path)!r} is empty (no JSON lines)")
    return records, bool(next(iter(kinds)))


def _label_names(where: str, raw: Mapping[str, Any], multi: bool) -> tuple[str, ...]:
    value = raw["labels"] if multi else [raw["label"]]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        field = "labels" if multi else "label"
        kind = "a list of non-empty strings" if multi else "a non-empty string"
        raise tokenizing.InputError(f"{where}: field {field!r} must be {kind}, got {value!r:.60}")
    if len(set(value)) != len(value):
        raise tokenizing.InputError(f"{where}: field 'labels' names a class twice: {value!r:.60}")
    return tuple(value)


def stratum(labels: tuple[int, ...], multi: bool) -> Hashable:
    """What the held-out split is stratified by: the class, or the set of classes."""
    return tuple(sorted(labels)) if multi else labels[0]


def stratified_split(
    strata: Sequence[Hashable], digests: Sequence[bytes], eval_fraction: float
) -> tuple[list[int], list[int]]:
    """The indexes of the training and held-out examples: of each stratum of ``count``
    examples, the ``min(ceil(eval_fraction * count), count - 1)`` with the lowest ``digests``
    are held out; each list in input order.

    Raises:
        ValueError: ``eval_fraction`` outside [0, 0.5], or above 0 while it holds out nothing
            (every stratum has one example).
    """
    if not 0.0 <= eval_fraction <= 0.5:
        raise ValueError(f"--eval-fraction must be between 0 and 0.5, got {eval_fraction}")
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(strata):
        members.setdefault(key, []).append(i)
    held: set[int] = set()
    for indexes in members.values():
        count = min(math.ceil(eval_fraction * len(indexes)), len(indexes) - 1)
        held.update(sorted(indexes, key=lambda i: (digests[i], i))[:count])
    if eval_fraction and not held:
        raise ValueError(
            f"--eval-fraction {eval_fraction} holds out no example: each class has one example "
            "only (a class keeps at least one to train on); give more examples or --eval-input"
        )
    train = [i for i in range(len(strata)) if i not in held]
    return train, sorted(held)


@dataclass(frozen=True)
class Tokenized:
    """A split's examples: token ids and class ids, in order."""

    tokens: list[np.ndarray]
    labels: list[tuple[int, ...]]

    def subset(self, indexes: Sequence[int]) -> Tokenized:
        return Tokenized([self.tokens[i] for i in indexes], [self.labels[i] for i in indexes])


def _tokenize(
    tokenizer: tokenizing.HfTokenizer, records: Sequence[Record], ids: Mapping[str, int]
) -> Tokenized:
    dtype = data.dtype_for_vocab(tokenizer.vocab_size)
    tokens = []
    for record in records:
        found = tokenizer.tok(record.text)["input_ids"]
        if not found:
            raise tokenizing.InputError(f"{record.where}: field 'text' tokenizes to no tokens")
        tokens.append(np.asarray(found, dtype=dtype))
    return Tokenized(tokens, [tuple(ids[name] for name in r.labels) for r in records])


def label_array(labels: Sequence[tuple[int, ...]], num_labels: int, multi: bool) -> np.ndarray:
    """A split's labels as stored: ``int32`` ids, or (``multi``) a ``uint8`` 0/1 matrix."""
    if not multi:
        return np.asarray([ls[0] for ls in labels], dtype=np.int32)
    out = np.zeros((len(labels), num_labels), dtype=np.uint8)
    for row, ls in enumerate(labels):
        out[row, list(ls)] = 1
    return out


def class_counts(array: np.ndarray, names: Sequence[str]) -> dict[str, int]:
    """Examples of each class (multi-label: examples that have it), by name."""
    if array.ndim == 2:
        counts = array.sum(axis=0, dtype=np.int64)
    else:
        counts = np.bincount(array, minlength=len(names))
    return {name: int(c) for name, c in zip(names, counts, strict=True)}


def _digest(tokens: np.ndarray, labels: tuple[int, ...]) -> bytes:
    h = hashlib.sha256(np.asarray(tokens, dtype="<u4").tobytes())
    h.update(np.asarray(sorted(labels), dtype="<u4").tobytes())
    return h.digest()


def _write_npy(path: Path, array: np.ndarray) -> str:
    np.save(path, array, allow_pickle=False)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tail_tokens(tokenizer: tokenizing.HfTokenizer) -> int:
    """How many special tokens ``tokenizer`` appends after a text (BERT's ``[SEP]``: 1; a
    decoder's tokenizer, which adds at most a BOS: 0): what follows a probe's own tokens in its
    tokenization with special tokens."""
    probe = "a"
    full = list(tokenizer.tok(probe)["input_ids"])
    bare = list(tokenizer.tok(probe, add_special_tokens=False)["input_ids"])
    for at in range(len(full) - len(bare) + 1):
        if bare and full[at : at + len(bare)] == bare:
            return len(full) - at - len(bare)
    return 0


def cut_row(tokens: np.ndarray, seq_len: int, tail: int) -> np.ndarray:
    """A document's ``tokens`` cut to ``seq_len``: its first tokens and, where it is longer, its
    last ``tail`` (the special tokens the tokenizer appended, kept as transformers' truncation
    keeps them; none where ``seq_len`` leaves no room for a text token)."""
    if tokens.size <= seq_len:
        return tokens
    if not 0 < tail < seq_len:
        return tokens[:seq_len]
    return np.concatenate([tokens[: seq_len - tail], tokens[tokens.size - tail :]])


def _cut(tokens: Sequence[np.ndarray], seq_len: int) -> CutReport:
    lengths = np.asarray([t.size for t in tokens], dtype=np.int64)
    return cut_report(lengths, np.minimum(lengths, seq_len), seq_len)


def _checked_options(eval_input: Path | None, eval_fraction: float | None, seq_len: int) -> float:
    """The held-out fraction :func:`prepare` takes (``eval_fraction``, default
    :data:`DEFAULT_EVAL_FRACTION`), once its options are checked, before any reading.

    Raises:
        tokenizing.InputError: ``eval_input`` with ``eval_fraction``.
        ValueError: ``eval_fraction`` outside [0, 0.5]; ``seq_len`` below 0.
    """
    if eval_input is not None and eval_fraction is not None:
        raise tokenizing.InputError(
            "--eval-input and --eval-fraction exclude each other: the file's examples are the "
            "held-out split"
        )
    fraction = DEFAULT_EVAL_FRACTION if eval_fraction is None else eval_fraction
    if not 0.0 <= fraction <= 0.5:
        raise ValueError(f"--eval-fraction must be between 0 and 0.5, got {fraction}")
    if seq_len < 0:
        raise ValueError(f"--seq-len must be >= 1 (0: the model's default), got {seq_len}")
    return fraction


def prepare(
    out: Path,
    tokenizer_dir: str | Path,
    input_path: Path,
    *,
    eval_fraction: float | None = None,
    eval_input: Path | None = None,
    seq_len: int = 0,
    shard_tokens: int = 1 << 24,
) -> dict[str, object]:
    """``trn-train prepare-data --format classify``: writes the dataset of ``input_path``'s
    labelled documents under ``out`` (see the module's documentation) and returns its manifest.
    The held-out split is ``eval_input``'s documents, or else the stratified ``eval_fraction``
    (default :data:`DEFAULT_EVAL_FRACTION`) of the input's. At ``seq_len`` (default: as
    :func:`trainer.tokenizing.default_seq_len`) the manifest records how many documents are cut
    (a document keeps its first ``seq_len`` tokens).

    Raises:
        tokenizing.InputError: see :func:`read_records` and
            :class:`~trainer.tokenizing.HfTokenizer`; an ``eval_input`` of the other kind
            (multi-label or not) than the input; ``eval_input`` with ``eval_fraction``; fewer
            than two classes.
        ValueError: ``eval_fraction`` out of range or holding out nothing; ``seq_len`` below 0.
    """
    fraction = _checked_options(eval_input, eval_fraction, seq_len)
    records, multi = read_records(input_path)
    held_records: list[Record] = []
    if eval_input is not None:
        held_records, held_multi = read_records(eval_input)
        if held_multi != multi:
            raise tokenizing.InputError(
                f"--eval-input {eval_input} is {'' if held_multi else 'not '}multi-label and "
                f"--input {input_path} is {'' if multi else 'not '}: both take one kind"
            )
    names = sorted({n for r in [*records, *held_records] for n in r.labels})
    if len(names) < 2:
        raise tokenizing.InputError(
            f"--input {input_path}: {len(names)} class ({', '.join(names) or 'none'}); a "
            "classifier needs at least two"
        )
    ids = {name: i for i, name in enumerate(names)}
    tokenizer = tokenizing.HfTokenizer(tokenizer_dir, needs_eos=False)
    pad_token_id(tokenizer)  # before any work: a tokenizer that cannot pad fails here
    seq_len = seq_len or tokenizing.default_seq_len(tokenizer_dir)
    examples = _tokenize(tokenizer, records, ids)
    if eval_input is None:
        strata = [stratum(ls, multi) for ls in examples.labels]
        digests = [_digest(t, ls) for t, ls in zip(examples.tokens, examples.labels, strict=True)]
        train_ids, held_ids = stratified_split(strata, digests, fraction)
        train, held = examples.subset(train_ids), examples.subset(held_ids)
    else:
        train, held = examples, _tokenize(tokenizer, held_records, ids)
    return _write(out, tokenizer, names, multi, train, held, seq_len, shard_tokens)


def pad_token_id(tokenizer: tokenizing.HfTokenizer) -> int:
    """The id rows are padded with: the tokenizer's pad token, else its EOS (as fine-tuning
    recipes set ``tokenizer.pad_token = tokenizer.eos_token`` for decoders without one).

    Raises:
        tokenizing.InputError: the tokenizer has neither.
    """
    pad = tokenizer.tok.pad_token_id
    if pad is not None:
        return int(pad)
    if tokenizer.eos_id is None:
        raise tokenizing.InputError(
            f"--tokenizer {tokenizer.directory} has neither a pad nor an EOS token "
            "(pad_token, eos_token in tokenizer_config.json): rows are padded with one"
        )
    return tokenizer.eos_id


def _write(
    out: Path,
    tokenizer: tokenizing.HfTokenizer,
    names: list[str],
    multi: bool,
    train: Tokenized,
    held: Tokenized,
    seq_len: int,
    shard_tokens: int,
) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    (out / LABELS_FILE).write_text(json.dumps(names, indent=2) + "\n")
    files = [{"name": LABELS_FILE, "sha256": _sha256(out / LABELS_FILE)}]
    arrays, counts = {}, {}
    for split, part in (("train", train), ("eval", held)):
        array = label_array(part.labels, len(names), multi)
        name = LABEL_ARRAYS[split]
        arrays[split] = {"name": name, "sha256": _write_npy(out / name, array)}
        files.append(arrays[split])
        counts[split] = class_counts(array, names)
    classify = {
        "labels": LABELS_FILE,
        "num_labels": len(names),
        "multi_label": multi,
        "pad_token_id": pad_token_id(tokenizer),
        "tail_tokens": tail_tokens(tokenizer),
        "label_arrays": arrays,
        "class_counts": counts,
    }
    cuts = {"train": _cut(train.tokens, seq_len), "eval": _cut(held.tokens, seq_len)}
    return data.write_examples_dataset(
        out,
        [(t, None) for t in train.tokens],
        [(t, None) for t in held.tokens],
        vocab_size=tokenizer.vocab_size,
        identity={**tokenizer.identity, "eos_token_id": tokenizer.eos_id},
        shard_tokens=shard_tokens,
        extra={
            "task": TASK,
            TASK: classify,
            "files": files,
            "cut_at_seq_len": {"seq_len": seq_len, **{s: r.as_dict() for s, r in cuts.items()}},
        },
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def counts_line(manifest: Mapping[str, Any]) -> str:
    """One line of the classes and their training (and held-out) counts, for prepare-data."""
    counts = manifest[TASK]["class_counts"]
    kind = "multi-label, " if manifest[TASK]["multi_label"] else ""
    parts = [
        f"{name} {n}" + (f"/{counts['eval'][name]}" if counts["eval"] else "")
        for name, n in counts["train"].items()
    ]
    held = " (train/eval)" if any(counts["eval"].values()) else ""
    return f"classes ({kind}{len(parts)}){held}: " + ", ".join(parts)


@dataclass(frozen=True)
class Labels:
    """A classification dataset's classes: their names, whether it is multi-label, the pad
    token id of its rows, each split's label array in stored order (``eval`` None when it has no
    held-out split), and the special tokens a cut row keeps at its end (``tail``, default 0: a
    dataset prepared before the manifest recorded them)."""

    names: tuple[str, ...]
    multi_label: bool
    pad_token_id: int
    train: np.ndarray
    eval: np.ndarray | None
    tail: int = 0

    @property
    def num_labels(self) -> int:
        return len(self.names)

    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.names))


def open_labels(root: str | Path, *, verify: bool = True) -> Labels:
    """The :class:`Labels` of a dataset written by :func:`prepare`, each file checked against
    the manifest's SHA-256 (``verify``, default True) and each array against its split's
    example count.

    Raises:
        LabelsError: the dataset is not of classification, or a label file is missing, fails
            its checksum or does not fit the examples.
    """
    root = Path(root)
    manifest = json.loads((root / data.MANIFEST).read_text())
    entry = manifest.get(TASK)
    if manifest.get("task") != TASK or not isinstance(entry, dict):
        raise LabelsError(
            f"--data {root} holds no classification labels (its manifest has no 'classify' "
            "entry): prepare it with `trn-train prepare-data --format classify`"
        )
    for file in manifest.get("files", []):
        path = root / file["name"]
        if not path.is_file():
            raise LabelsError(f"{path}: missing")
        if verify and _sha256(path) != file["sha256"]:
            raise LabelsError(f"{path}: checksum mismatch (SHA-256 differs from the manifest)")
    names = tuple(json.loads((root / entry["labels"]).read_text()))
    arrays = {}
    for split, file in entry["label_arrays"].items():
        array = np.load(root / file["name"], allow_pickle=False)
        expected = int(manifest["examples"][split])
        rows_ok = array.shape[0] == expected
        shape_ok = (
            array.ndim == 2 and array.shape[1] == len(names)
            if entry["multi_label"]
            else array.ndim == 1
        )
        if not (rows_ok and shape_ok):
            raise LabelsError(
                f"{root / file['name']}: shape {array.shape} does not fit {expected} {split} "
                f"examples of {len(names)} classes"
            )
        arrays[split] = array
    held = arrays.get("eval")
    return Labels(
        names,
        bool(entry["multi_label"]),
        int(entry["pad_token_id"]),
        arrays["train"],
        held if held is not None and held.shape[0] else None,
        int(entry.get("tail_tokens", 0)),
    )


class ClassifySampler:
    """Rows of one example each, with their labels (see the module's documentation).

    Each step's global batch is ``micro_batch * world_size * grad_accum`` rows of the epoch's
    order; micro-step ``m`` of rank ``r`` reads block ``m * world_size + r``. ``shuffle``
    False (eval) keeps the stored order. ``tail`` (default 0): the special tokens a row cut to
    ``seq_len`` keeps at its end (:func:`cut_row`).

    Raises:
        ValueError: the dataset is not of examples, or ``labels`` does not have a row per
            example.
    """

    def __init__(
        self,
        dataset: data.Dataset,
        labels: np.ndarray,
        *,
        pad_token_id: int,
        seq_len: int,
        micro_batch: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        grad_accum: int = 1,
        shuffle: bool = True,
        tail: int = 0,
    ) -> None:
        if dataset.index is None:
            raise ValueError(f"{dataset.root} is a token stream, not a dataset of examples")
        self.dataset, self.labels, self.pad = dataset, labels, pad_token_id
        self.seq_len, self.micro_batch, self.seed = seq_len, micro_batch, seed
        self.rank, self.world_size, self.grad_accum = rank, world_size, grad_accum
        self.shuffle, self.tail = shuffle, tail
        shards, starts, ends = [], [], []
        for s, offsets in enumerate(dataset.index):
            bounds = np.asarray(offsets, dtype=np.int64)
            shards.append(np.full(bounds.size - 1, s, dtype=np.int64))
            starts.append(bounds[:-1])
            ends.append(bounds[1:])
        self._shard = np.concatenate(shards)
        self._start, self._end = np.concatenate(starts), np.concatenate(ends)
        if labels.shape[0] != self._shard.size:
            raise ValueError(
                f"{labels.shape[0]} labels for {self._shard.size} examples in {dataset.root}"
            )
        self.rows_per_step = micro_batch * world_size * grad_accum

    @property
    def examples(self) -> int:
        return int(self._shard.size)

    def steps_in(self, epoch: int) -> int:
        """Steps of one epoch (the same for every epoch): every example once."""
        return math.ceil(self.examples / self.rows_per_step)

    def steps_for(self, epochs: int) -> int:
        return epochs * self.steps_in(0)

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.examples)
        rng = np.random.Generator(np.random.PCG64([self.seed, epoch, _ORDER_STREAM]))
        return rng.permutation(self.examples)

    def step_examples(self, step: int) -> np.ndarray:
        """The example of each row of the step's global batch, -1 for an empty row."""
        per_epoch = self.steps_in(0)
        epoch, k = divmod(step, per_epoch)
        picked = self._order(epoch)[k * self.rows_per_step : (k + 1) * self.rows_per_step]
        return np.concatenate([picked, np.full(self.rows_per_step - picked.size, -1)])

    def trained_targets(self, step: int) -> int:
        """Rows of the step's global batch that hold an example (all ranks, all micro-steps)."""
        return int(np.count_nonzero(self.step_examples(step) >= 0))

    def batch(
        self, step: int, micro_step: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's rows: int64 ``(micro_batch, seq_len)`` token ids, the labels (int64
        class ids, or float32 0/1 ``(micro_batch, classes)`` multi-label; zeros in an empty
        row) and a bool ``(micro_batch,)`` that is True where a row holds an example."""
        import torch

        block = micro_step * self.world_size + self.rank
        picks = self.step_examples(step)[block * self.micro_batch : (block + 1) * self.micro_batch]
        rows = np.full((self.micro_batch, self.seq_len), self.pad, dtype=np.int64)
        label_shape = (self.micro_batch, *self.labels.shape[1:])
        labels = np.zeros(label_shape, dtype=np.float32 if self.labels.ndim == 2 else np.int64)
        for i, example in enumerate(picks):
            if example < 0:
                continue
            start, end = int(self._start[example]), int(self._end[example])
            row = cut_row(
                self.dataset.shards[self._shard[example]][start:end], self.seq_len, self.tail
            )
            rows[i, : row.size] = row
            labels[i] = self.labels[example]
        return torch.from_numpy(rows), torch.from_numpy(labels), torch.from_numpy(picks >= 0)
