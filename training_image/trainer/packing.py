"""Rows of whole examples for datasets of examples (``prepare-data --format jsonl|chat``).

A row is ``seq_len`` positions holding whole examples one after another, then padding. Each
example attends only to itself and its positions restart at 0 (the model derives a
block-diagonal causal mask from the positions, see :func:`trainer.model.document_mask`); the
target of an example's last token is :data:`~trainer.data.IGNORE_INDEX`, never the next
example's first token, and padding is never a target. Every step has the same shape, so a
compiled graph is traced once.

Cutting, at a run's ``seq_len`` (the stated rule; prepare-data reports the counts for its own
``--seq-len``): an example that fits is kept whole. A longer conversation (an example with a
loss mask) keeps its longest prefix that fits and ends where an assistant reply ends (a token
whose mask is 1 followed by one whose mask is 0): whole turns from the start, never a reply
without its prompt or cut inside; one whose first reply does not fit is dropped. A longer
document (no mask) keeps its first ``seq_len`` tokens.

Epochs: epoch ``e`` visits every kept example once, in an order drawn from ``(seed, e)``, and
packs them in that order by best fit over a window of open rows (:func:`pack_rows`); the
epoch's rows then go ``ranks x micro batch x grad accum`` to a step, the last step of an epoch
filled with empty rows. So each step's global batch is a function of ``(seed, step)`` and the
data alone, as with :class:`trainer.data.WindowSampler`: a resumed run sees the batches it would
have seen, and ranks and micro-steps split one global batch however they are laid out.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from trainer.data import IGNORE_INDEX, Dataset

if TYPE_CHECKING:
    import torch

# Rows kept open while packing: an example goes to the open row it fills best; a new row opens
# when none has room, and the fullest open row is closed when there are more than this many.
# Our choice: at 64, packed chat rows of the benchmark's varied lengths are over 95% examples.
OPEN_ROWS = 64
# The third word of the packing order's PCG64 seed, so the stream is not WindowSampler's.
_ORDER_STREAM = 0x7061636B  # "pack"
# What a run records (trainer.checkpoint.run_config): a resume refuses another layout.
LAYOUT = "packed-v1"


def kept_length(length: int, mask: np.ndarray | None, seq_len: int) -> int:
    """Tokens of an example of ``length`` tokens (``mask`` its loss mask, or None) kept in a row
    of ``seq_len`` by the module's cutting rule; 0 when it is dropped."""
    if length <= seq_len:
        return length
    if mask is None:
        return seq_len
    head = np.asarray(mask[: seq_len + 1], dtype=np.int8)
    ends = np.flatnonzero((head[:-1] == 1) & (head[1:] == 0))
    return int(ends[-1]) + 1 if ends.size else 0


@dataclass(frozen=True)
class CutReport:
    """What the cutting rule did to a split's examples at ``seq_len``: ``cut`` were shortened,
    ``dropped`` left out; ``examples`` counts them all."""

    seq_len: int
    examples: int
    cut: int
    dropped: int

    def as_dict(self) -> dict[str, int]:
        return {"examples": self.examples, "cut": self.cut, "dropped": self.dropped}

    def line(self, split: str) -> str:
        """``120 train examples at seq_len 64: 3 cut, 1 dropped`` (``split`` "train")."""
        return (
            f"{self.examples} {split} examples at seq_len {self.seq_len}: {self.cut} cut, "
            f"{self.dropped} dropped"
        )


def cut_report(lengths: np.ndarray, kept: np.ndarray, seq_len: int) -> CutReport:
    """The :class:`CutReport` of examples of ``lengths`` tokens of which ``kept`` are kept."""
    return CutReport(
        seq_len=seq_len,
        examples=int(lengths.size),
        cut=int(np.count_nonzero((kept > 0) & (kept < lengths))),
        dropped=int(np.count_nonzero(kept == 0)),
    )


@dataclass(frozen=True)
class Rows:
    """An epoch's rows: row ``r`` holds examples ``members[starts[r]:starts[r + 1]]``;
    ``tokens`` and ``trained`` are each row's example tokens and trained targets."""

    starts: np.ndarray
    members: np.ndarray
    tokens: np.ndarray
    trained: np.ndarray

    @property
    def count(self) -> int:
        return int(self.starts.size - 1)

    def of(self, row: int) -> np.ndarray:
        """The examples of ``row``; none for a row past the last (an empty row)."""
        if row >= self.count:
            return self.members[:0]
        return self.members[self.starts[row] : self.starts[row + 1]]


def pack_rows(
    lengths: np.ndarray, order: np.ndarray, capacity: int, open_rows: int = OPEN_ROWS
) -> list[list[int]]:
    """Examples ``order`` (indices into ``lengths``, each at most ``capacity``) packed into rows
    of ``capacity`` tokens, in order: each goes to the open row with the least room that still
    holds it, else to a new row; a row that is full, or the fullest when more than
    ``open_rows`` (default :data:`OPEN_ROWS`) are open, is closed. Rows come out as they close,
    then the open ones in the order they opened. Deterministic."""
    rows: list[list[int]] = []
    members: dict[int, list[int]] = {}
    room: list[tuple[int, int]] = []  # (room left, row id), sorted
    for example in order.tolist():
        size = int(lengths[example])
        at = bisect.bisect_left(room, (size, -1))
        if at < len(room):
            left, row = room.pop(at)
        else:
            if len(room) == open_rows:
                rows.append(members.pop(room.pop(0)[1]))
            row, left = len(rows) + len(members), capacity
            members[row] = []
        members[row].append(example)
        if left - size:
            bisect.insort(room, (left - size, row))
        else:
            rows.append(members.pop(row))
    rows.extend(members[row] for row in sorted(members))
    return rows


@dataclass(frozen=True)
class _Examples:
    """Every example of a dataset: its shard, start and length, and what a row keeps of it."""

    shard: np.ndarray
    start: np.ndarray
    length: np.ndarray
    kept: np.ndarray
    trained: np.ndarray


def _examples(dataset: Dataset, seq_len: int) -> _Examples:
    if dataset.index is None:
        raise ValueError(
            f"{dataset.root} is a token stream, not a dataset of examples "
            "(prepare-data --format jsonl or chat writes one)"
        )
    shard = np.concatenate([np.full(i.size - 1, s) for s, i in enumerate(dataset.index)])
    start = np.concatenate([np.asarray(i[:-1], dtype=np.int64) for i in dataset.index])
    length = np.concatenate([np.diff(np.asarray(i, dtype=np.int64)) for i in dataset.index])
    kept = length.copy()
    for e in np.flatnonzero(length > seq_len).tolist():
        mask = None if dataset.masks is None else dataset.masks[shard[e]]
        window = None if mask is None else mask[start[e] : start[e] + length[e]]
        kept[e] = kept_length(int(length[e]), window, seq_len)
    return _Examples(shard, start, length, kept, _trained(dataset, shard, start, kept))


def _trained(
    dataset: Dataset, shard: np.ndarray, start: np.ndarray, kept: np.ndarray
) -> np.ndarray:
    """Each example's trained targets as kept: its tokens after the first whose mask is 1 (all
    of them without a mask)."""
    trained: np.ndarray = np.maximum(kept - 1, 0)
    if dataset.masks is None:
        return trained
    for s, mask in enumerate(dataset.masks):
        mine = np.flatnonzero(shard == s)
        sums = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
        first, end = start[mine] + 1, start[mine] + kept[mine]
        trained[mine] = np.where(kept[mine] > 0, sums[np.maximum(end, first)] - sums[first], 0)
    return trained


class PackedSampler:
    """Rows of whole examples of ``dataset`` (see the module's documentation), ``micro_batch``
    rows of ``seq_len`` positions per batch. Each step's global batch is ``micro_batch *
    world_size * grad_accum`` rows; micro-step ``m`` of rank ``r`` reads block
    ``m * world_size + r`` of ``micro_batch`` rows, as :class:`trainer.data.WindowSampler`.
    ``shuffle`` False (for evaluation) packs the examples in their stored order, the same rows
    in every epoch.

    Raises:
        ValueError: the dataset is a token stream, or no example of it fits ``seq_len``.
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
        shuffle: bool = True,
    ) -> None:
        self.dataset, self.seq_len, self.micro_batch = dataset, seq_len, micro_batch
        self.seed, self.rank, self.world_size, self.grad_accum = seed, rank, world_size, grad_accum
        self.shuffle = shuffle
        self.examples = _examples(dataset, seq_len)
        self.report = cut_report(self.examples.length, self.examples.kept, seq_len)
        self._pool = np.flatnonzero(self.examples.kept)
        if not self._pool.size:
            raise ValueError(
                f"no example of {dataset.root} fits seq_len {seq_len}: all "
                f"{self.report.examples} dropped (a conversation whose first reply ends past "
                "seq_len is dropped); use a longer --seq-len"
            )
        self._steps: list[int] = []  # steps of epochs 0, 1, ... as far as counted
        self._cached: dict[int, Rows] = {}
        self._positions = np.arange(seq_len, dtype=np.int64)

    @property
    def rows_per_step(self) -> int:
        return self.micro_batch * self.world_size * self.grad_accum

    @property
    def kept_examples(self) -> int:
        return int(self._pool.size)

    def rows(self, epoch: int) -> Rows:
        """Epoch ``epoch``'s rows (the two most recent epochs are kept)."""
        if epoch not in self._cached:
            order = self._pool
            if self.shuffle:
                rng = np.random.Generator(np.random.PCG64([self.seed, epoch, _ORDER_STREAM]))
                order = rng.permutation(self._pool)
            packed = pack_rows(self.examples.kept, order, self.seq_len)
            starts = np.cumsum([0, *(len(r) for r in packed)], dtype=np.int64)
            members = np.fromiter((e for r in packed for e in r), np.int64, int(starts[-1]))
            rows = Rows(
                starts,
                members,
                np.add.reduceat(self.examples.kept[members], starts[:-1]),
                np.add.reduceat(self.examples.trained[members], starts[:-1]),
            )
            self._cached = {e: r for e, r in self._cached.items() if e == epoch - 1}
            self._cached[epoch] = rows
        return self._cached[epoch]

    def steps_in(self, epoch: int) -> int:
        """Steps of epoch ``epoch``: its rows over the rows per step, rounded up."""
        while len(self._steps) <= epoch:
            rows = self.rows(len(self._steps)).count
            self._steps.append(math.ceil(rows / self.rows_per_step))
        return self._steps[epoch]

    def steps_for(self, epochs: int) -> int:
        """Steps of epochs ``0 .. epochs - 1``."""
        return sum(self.steps_in(e) for e in range(epochs))

    def locate(self, step: int) -> tuple[int, int]:
        """The epoch of ``step`` and the step's place in it."""
        epoch = 0
        while step >= self.steps_in(epoch):
            step -= self.steps_in(epoch)
            epoch += 1
        return epoch, step

    def _step_rows(self, step: int) -> tuple[Rows, int]:
        epoch, local = self.locate(step)
        return self.rows(epoch), local * self.rows_per_step

    def trained_targets(self, step: int) -> int:
        """Trained targets of the step's whole global batch (every rank, every micro-step), from
        ``(seed, step)`` and the data alone, so that every rank knows it without talking."""
        rows, first = self._step_rows(step)
        return int(rows.trained[first : first + self.rows_per_step].sum())

    def tokens(self, step: int) -> int:
        """Example (non-padding) tokens of the step's whole global batch."""
        rows, first = self._step_rows(step)
        return int(rows.tokens[first : first + self.rows_per_step].sum())

    def batch(
        self, step: int, micro_step: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Inputs, targets and positions, int64 ``(micro_batch, seq_len)`` CPU tensors, for this
        rank: untrained targets (prompt tokens, each example's last token, padding) are
        :data:`~trainer.data.IGNORE_INDEX`; positions restart at 0 at each example and at the
        padding."""
        rows, first = self._step_rows(step)
        first += (micro_step * self.world_size + self.rank) * self.micro_batch
        shape = (self.micro_batch, self.seq_len)
        inputs = np.zeros(shape, dtype=np.int64)
        targets = np.full(shape, IGNORE_INDEX, dtype=np.int64)
        positions = np.empty(shape, dtype=np.int64)
        for i in range(self.micro_batch):
            at = 0
            for example in rows.of(first + i).tolist():
                at = self._place(example, at, inputs[i], targets[i], positions[i])
            positions[i, at:] = self._positions[: self.seq_len - at]
        # Imported here, as in trainer.data: prepare-data counts cuts without torch.
        import torch

        return torch.from_numpy(inputs), torch.from_numpy(targets), torch.from_numpy(positions)

    def _place(
        self, example: int, at: int, inputs: np.ndarray, targets: np.ndarray, positions: np.ndarray
    ) -> int:
        """Writes ``example`` into a row from position ``at``; returns where it ends."""
        ex = self.examples
        shard, start, size = int(ex.shard[example]), int(ex.start[example]), int(ex.kept[example])
        tokens = self.dataset.shards[shard][start : start + size]
        end = at + size
        inputs[at:end] = tokens
        targets[at : end - 1] = tokens[1:]
        if self.dataset.masks is not None:
            untrained = self.dataset.masks[shard][start + 1 : start + size] == 0
            targets[at : end - 1][untrained] = IGNORE_INDEX
        positions[at:end] = self._positions[:size]
        return end
