"""Interactions for the two-tower recommender: ``trn-train prepare-data --format interactions``,
the id maps and item tables beside the shards, and the batches the towers train on.

Input: JSON lines (``.jsonl``, ``.ndjson``), CSV with a header row (``.csv``) or Parquet
(``.parquet``), one interaction a line (a row): ``user_id`` and ``item_id`` (a non-empty string,
or in JSON and Parquet an integer), ``timestamp`` (seconds since the epoch, or an ISO-8601
date-time; one without a zone is read as UTC), and the categorical features named by
``--user-features`` and ``--item-features`` (a string or, in JSON and Parquet, an integer;
missing, ``null`` or an empty CSV cell means unknown). Every line is checked; the problems are
reported together, each with its file, line, field, value and what is allowed.

Parquet is read with pyarrow, imported only for a ``.parquet`` input: it is pinned in
requirements-dev.txt, where data is prepared, and the trainer's image does not carry it. A
Parquet column's values are those JSON lines would hold: an integer or string column (or a
dictionary of either) for the ids and features, a column of nulls for a feature; for the
timestamp also a floating-point column, or a timestamp column (any unit; its instants, a zone or
none, as seconds since the epoch, so one without a zone is UTC as above). A column of another
type is refused by name before any row is read.

Ids: the users, the items and each feature's values, sorted as strings, are ``users.json``,
``items.json`` and ``features.json``; id ``i`` is the ``i``-th name, so the ids do not depend on
the order of the lines. An item feature belongs to the item: its value must not differ between
the lines of one item (``item_features.npy``, a row per item, holds it).

Split by time: the interactions sorted by timestamp (ties in file order), the latest
``ceil(eval_fraction * n)`` (default 10%) are held out. Each interaction carries the user's
``history`` (default 8) previous items, the latest first, from every earlier interaction of
that user, held out or not (they happened before it).

Storage: each interaction is one example of a manifest-format-3 dataset (:mod:`trainer.data`)
of fixed width, ``[user, item, history..., user features...]``: user and item are ids, history
items and feature values are ``id + 1`` with 0 for none. Beside the shards: the three id maps,
``item_features.npy`` (``int64``, items by item features, ``id + 1``, 0 unknown) and
``item_counts.npy`` (each item's training interactions: the popularity the logQ correction
reads), named with their SHA-256 in the manifest's ``files`` so that ``trnctl data stage``
uploads and checks them.

Batches (:class:`InteractionSampler`): each row one interaction; epoch ``e`` visits every
training interaction once in an order drawn from ``(seed, e)``; its last step is filled up with
empty rows, which no loss counts.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainer import data, tokenizing

if TYPE_CHECKING:
    import torch

TASK = "recommend"
FORMAT = "interactions"
TOKENIZER = "interactions-v1"  # the manifest's tokenizer field: what the "tokens" are
DEFAULT_EVAL_FRACTION = 0.1
DEFAULT_HISTORY = 8
ID_FILES = {"users": "users.json", "items": "items.json", "features": "features.json"}
ARRAYS = {"item_features": "item_features.npy", "item_counts": "item_counts.npy"}
REQUIRED = ("user_id", "item_id", "timestamp")
SUFFIXES = {".jsonl": "json", ".ndjson": "json", ".csv": "csv", ".parquet": "parquet"}
# Rows of a Parquet file read at a time: memory bounded by the batch, not by the file.
PARQUET_BATCH_ROWS = 65536
# A Parquet timestamp column's values per second, by its unit.
_PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
# Reported at most, of the problems of one input; the count of the rest follows them.
MAX_REPORTED = 10
# The third word of the epoch order's PCG64 seed, so the stream is not the other samplers'.
_ORDER_STREAM = 0x72656373  # "recs"
_FEATURE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


class InteractionsError(tokenizing.InputError):
    """Interactions that cannot be prepared, or a prepared directory that fails its checks;
    the message names the file (and line, field and value where there is one). A line that is
    not a JSON object raises :class:`~trainer.tokenizing.InputError` itself, as every JSON-lines
    input of prepare-data does."""


@dataclass(frozen=True)
class Interaction:
    """One line: where it is, its user, item and time, and its user and item feature values
    (None: unknown) in the order of the flags that named them."""

    where: str
    user: str
    item: str
    time: float
    user_features: tuple[str | None, ...]
    item_features: tuple[str | None, ...]


def _id(value: object) -> str | None:
    """An id as its string: a non-empty string, or an integer (not a bool); None otherwise."""
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _time(value: object) -> float | None:
    """Seconds since the epoch of a finite number, a numeric string or an ISO-8601 date-time
    (without a zone: UTC); None when it is none of them."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        number = float(value)
    except ValueError:
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            return None
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    return number if math.isfinite(number) else None


def _feature(value: object) -> tuple[bool, str | None]:
    """Whether a feature value is allowed, and its string (None: unknown)."""
    if value is None or value == "":
        return True, None
    found = _id(value)
    return found is not None, found


class _Problems:
    """The problems found in one input, reported together."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, where: str, field: str, value: object, allowed: str) -> None:
        self.lines.append(f"{where}: field {field!r} is {value!r:.60}; allowed: {allowed}")

    def raise_any(self, path: Path) -> None:
        if not self.lines:
            return
        shown = self.lines[:MAX_REPORTED]
        more = len(self.lines) - len(shown)
        tail = f" (and {more} more)" if more else ""
        raise InteractionsError(f"{path}: {len(self.lines)} problem(s){tail}: " + "; ".join(shown))


def _records(path: Path, columns: Sequence[str]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each line of ``path`` as (where, its fields), JSON lines, CSV or Parquet by the file's
    suffix.

    Raises:
        InteractionsError: an unknown suffix, a CSV header or Parquet schema without a needed
            column, see :func:`_parquet_records`.
        trainer.tokenizing.InputError: a line that is not a JSON object.
    """
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise InteractionsError(
            f"{path}: suffix {path.suffix!r} is not one this reads; allowed: {', '.join(SUFFIXES)}"
        )
    if kind == "csv":
        yield from _csv_records(path, columns)
    elif kind == "parquet":
        yield from _parquet_records(path, columns)
    else:
        yield from tokenizing._json_lines(path)


def _csv_records(path: Path, columns: Sequence[str]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in columns if c not in header]
        if missing:
            raise InteractionsError(
                f"{path}:1: the CSV header {header} lacks column(s) {missing}; needed: "
                f"{', '.join(columns)}"
            )
        for row in reader:
            yield f"{path}:{reader.line_num}", row


def _parquet_records(path: Path, columns: Sequence[str]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each row of a Parquet file as (where: ``file:row N``, its fields as JSON would hold
    them), :data:`PARQUET_BATCH_ROWS` rows read at a time.

    Raises:
        InteractionsError: pyarrow is not installed, the file is not readable Parquet, or its
            schema lacks a needed column or has one of a type not allowed.
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as error:
        raise InteractionsError(
            f"{path}: reading Parquet needs pyarrow ({error}): install it where data is prepared "
            "(`pip install 'trn-platform-ops[parquet]'` with the ops wheel, or `pip install "
            "pyarrow==26.0.1` as requirements-dev.txt pins it; the trainer's image does not carry "
            "it), or write the interactions as JSON lines (.jsonl) or CSV (.csv)"
        ) from error
    try:
        with pq.ParquetFile(path) as source:
            convert = _parquet_columns(path, source.schema_arrow, columns)
            row = 0
            for batch in source.iter_batches(PARQUET_BATCH_ROWS, columns=list(columns)):
                values = {name: convert[name](batch.column(name)) for name in columns}
                for k in range(batch.num_rows):
                    row += 1
                    yield f"{path}:row {row}", {name: values[name][k] for name in columns}
    except pa.ArrowException as error:
        raise InteractionsError(f"{path}: not a readable Parquet file ({error})") from error


def _parquet_columns(
    path: Path, schema: Any, columns: Sequence[str]
) -> dict[str, Callable[[Any], list[Any]]]:
    """For each needed column of a Parquet ``schema``, what turns one batch's column into the
    values JSON lines would hold (see the module's documentation).

    Raises:
        InteractionsError: a needed column missing or held by two columns (all of them
            named), or of a type not allowed (the first named, with its type and the allowed
            ones).
    """
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise InteractionsError(
            f"{path}: the Parquet schema's columns {schema.names} lack {missing}; needed: "
            f"{', '.join(columns)}"
        )
    # pyarrow reads a name held by two columns as no column at all: refused here by name.
    twice = [c for c in columns if len(schema.get_all_field_indices(c)) > 1]
    if twice:
        raise InteractionsError(
            f"{path}: the Parquet schema's columns {schema.names} hold {twice} more than once; "
            "allowed: each needed column once"
        )
    convert = {}
    for name in columns:
        reader = _parquet_reader(name, schema.field(name).type)
        if reader is None:
            raise InteractionsError(
                f"{path}: column {name!r} is of Parquet type {schema.field(name).type}; allowed: "
                + _PARQUET_ALLOWED.get(name, _PARQUET_ALLOWED["feature"])
            )
        convert[name] = reader
    return convert


def _parquet_reader(name: str, kind: Any) -> Callable[[Any], list[Any]] | None:
    """What reads column ``name`` of Arrow type ``kind`` as JSON lines would hold it; None for
    a type the column may not have."""
    import pyarrow as pa  # installed: only _parquet_columns calls this

    types = pa.types
    if name == "timestamp":
        if types.is_timestamp(kind):
            return _parquet_seconds(_PER_SECOND[kind.unit])
        allowed = types.is_integer(kind) or types.is_floating(kind) or _is_text(kind)
    else:
        if types.is_dictionary(kind):
            kind = kind.value_type  # pandas' categoricals: read as their values
        unknown = name not in REQUIRED and types.is_null(kind)  # a feature never known
        allowed = types.is_integer(kind) or _is_text(kind) or unknown
    return _parquet_values if allowed else None


def _is_text(kind: Any) -> bool:
    import pyarrow as pa  # installed: only _parquet_reader calls this

    return bool(
        pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
    )


_PARQUET_ALLOWED = {
    "user_id": "an integer or string column, or a dictionary of either",
    "item_id": "an integer or string column, or a dictionary of either",
    "timestamp": "a timestamp, integer, floating-point or string column",
    "feature": "an integer or string column, a dictionary of either, or nulls",
}


def _parquet_values(column: Any) -> list[Any]:
    return list(column.to_pylist())


def _parquet_seconds(per_second: int) -> Callable[[Any], list[Any]]:
    """A timestamp column's values as seconds since the epoch: its stored integers (instants in
    UTC, whatever its zone) over ``per_second``, a correctly rounded quotient, as
    ``datetime.timestamp`` gives for an ISO-8601 string of the same instant."""

    import pyarrow as pa  # installed: only _parquet_reader calls this

    def seconds(column: Any) -> list[Any]:
        counts = column.cast(pa.int64()).to_pylist()
        return [None if n is None else n / per_second for n in counts]

    return seconds


def read_interactions(
    path: Path, user_features: Sequence[str], item_features: Sequence[str]
) -> list[Interaction]:
    """Every interaction of ``path`` (see the module's documentation for what each field
    takes).

    Raises:
        InteractionsError: a missing or empty file, a line that cannot be read, or fields that
            are not allowed (all of them reported, the first :data:`MAX_REPORTED` named).
    """
    if not path.is_file():
        raise InteractionsError(f"--input {str(path)!r} is not a file")
    problems, found = _Problems(), []
    for where, raw in _records(path, [*REQUIRED, *user_features, *item_features]):
        parsed = _interaction(where, raw, user_features, item_features, problems)
        if parsed is not None:
            found.append(parsed)
    problems.raise_any(path)
    if not found:
        raise InteractionsError(f"--input {str(path)!r} holds no interactions")
    return found


def _interaction(
    where: str,
    raw: Mapping[str, Any],
    user_features: Sequence[str],
    item_features: Sequence[str],
    problems: _Problems,
) -> Interaction | None:
    ok = True
    ids = {}
    for field in ("user_id", "item_id"):
        ids[field] = _id(raw.get(field))
        if ids[field] is None:
            allowed = "a non-empty string or an integer"
            problems.add(where, field, raw.get(field), allowed)
            ok = False
    time = _time(raw.get("timestamp"))
    if time is None:
        allowed = "seconds since the epoch (a finite number) or an ISO-8601 date-time"
        problems.add(where, "timestamp", raw.get("timestamp"), allowed)
        ok = False
    values: dict[str, str | None] = {}
    for name in [*user_features, *item_features]:
        allowed_value, values[name] = _feature(raw.get(name))
        if not allowed_value:
            allowed = "a string or an integer, or null/empty for unknown"
            problems.add(where, name, raw.get(name), allowed)
            ok = False
    if not ok:
        return None
    return Interaction(
        where,
        str(ids["user_id"]),
        str(ids["item_id"]),
        float(time),  # type: ignore[arg-type]
        tuple(values[n] for n in user_features),
        tuple(values[n] for n in item_features),
    )


def check_feature_names(user_features: Sequence[str], item_features: Sequence[str]) -> None:
    """Checks the feature columns the flags name.

    Raises:
        InteractionsError: a name that is not an identifier-like column name, one of
            :data:`REQUIRED`, or named twice.
    """
    names = [*user_features, *item_features]
    for name in names:
        if not _FEATURE_NAME.fullmatch(name) or name in REQUIRED:
            raise InteractionsError(
                f"feature column {name!r} is not allowed: a column name of letters, digits, "
                f"'_', '.' or '-' (not starting with a digit), other than {', '.join(REQUIRED)}"
            )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InteractionsError(
            f"feature column(s) {twice} named twice in --user-features/--item-features"
        )


@dataclass(frozen=True)
class IdMaps:
    """The sorted names of the users, the items and each feature's values."""

    users: tuple[str, ...]
    items: tuple[str, ...]
    features: dict[str, tuple[str, ...]]

    @classmethod
    def of(
        cls,
        found: Sequence[Interaction],
        user_features: Sequence[str],
        item_features: Sequence[str],
    ) -> IdMaps:
        features = {}
        for k, name in enumerate(user_features):
            features[name] = _sorted_names(i.user_features[k] for i in found)
        for k, name in enumerate(item_features):
            features[name] = _sorted_names(i.item_features[k] for i in found)
        users = tuple(sorted({i.user for i in found}))
        return cls(users, tuple(sorted({i.item for i in found})), features)

    def sizes(self) -> dict[str, int]:
        return {name: len(values) for name, values in self.features.items()}


def _sorted_names(values: Iterable[str | None]) -> tuple[str, ...]:
    return tuple(sorted({v for v in values if v is not None}))


def item_feature_table(
    found: Sequence[Interaction], maps: IdMaps, item_features: Sequence[str]
) -> np.ndarray:
    """Items by item features, ``id + 1`` of each value (0: unknown on every line).

    Raises:
        InteractionsError: an item whose feature differs between two lines (both named).
    """
    table = np.zeros((len(maps.items), len(item_features)), dtype=np.int64)
    seen: dict[tuple[int, int], str] = {}
    item_ids = {name: i for i, name in enumerate(maps.items)}
    lookups = [{v: j + 1 for j, v in enumerate(maps.features[n])} for n in item_features]
    problems = []
    for record in found:
        row = item_ids[record.item]
        for k, value in enumerate(record.item_features):
            if value is None:
                continue
            code = lookups[k][value]
            if table[row, k] and table[row, k] != code:
                problems.append(
                    f"{record.where}: item {record.item!r} has {item_features[k]!r} {value!r}, "
                    f"but {maps.features[item_features[k]][table[row, k] - 1]!r} at "
                    f"{seen[(row, k)]}"
                )
                continue
            table[row, k], seen[(row, k)] = code, record.where
    if problems:
        raise InteractionsError(
            f"an item feature must be the same on every line of its item: {len(problems)} "
            "line(s) differ: " + "; ".join(problems[:MAX_REPORTED])
        )
    return table


def time_split(count: int, eval_fraction: float) -> int:
    """How many of ``count`` time-ordered interactions train: all but the latest
    ``ceil(eval_fraction * count)``.

    Raises:
        InteractionsError: ``eval_fraction`` outside [0, 0.5], or nothing left to train on.
    """
    if not 0.0 <= eval_fraction <= 0.5:
        raise InteractionsError(f"--eval-fraction must be between 0 and 0.5, got {eval_fraction}")
    held = math.ceil(eval_fraction * count)
    if held >= count:
        raise InteractionsError(
            f"--eval-fraction {eval_fraction} of {count} interactions holds out {held}, leaving "
            "none to train on; give more interactions or a smaller fraction"
        )
    return count - held


def rows_of(
    found: Sequence[Interaction], maps: IdMaps, user_features: Sequence[str], history: int
) -> np.ndarray:
    """The stored rows of ``found`` (already in time order): ``[user, item, history...,
    user features...]`` (see the module's documentation)."""
    users = {name: i for i, name in enumerate(maps.users)}
    items = {name: i for i, name in enumerate(maps.items)}
    lookups = [{v: j + 1 for j, v in enumerate(maps.features[n])} for n in user_features]
    rows = np.zeros((len(found), 2 + history + len(user_features)), dtype=np.int64)
    past: dict[int, list[int]] = {}
    for r, record in enumerate(found):
        user, item = users[record.user], items[record.item]
        before = past.setdefault(user, [])
        recent = before[::-1][:history]
        rows[r, 0], rows[r, 1] = user, item
        rows[r, 2 : 2 + len(recent)] = np.asarray(recent, dtype=np.int64) + 1
        for k, value in enumerate(record.user_features):
            rows[r, 2 + history + k] = 0 if value is None else lookups[k][value]
        before.append(item)
    return rows


def prepare(
    out: Path,
    input_path: Path,
    *,
    user_features: Sequence[str] = (),
    item_features: Sequence[str] = (),
    history: int = DEFAULT_HISTORY,
    eval_fraction: float | None = None,
    shard_tokens: int = 1 << 24,
) -> dict[str, object]:
    """``trn-train prepare-data --format interactions``: writes the dataset of ``input_path``'s
    interactions under ``out`` (see the module's documentation) and returns its manifest.
    ``eval_fraction`` (default :data:`DEFAULT_EVAL_FRACTION`) of the latest are held out.

    Raises:
        InteractionsError: see :func:`read_interactions`, :func:`check_feature_names`,
            :func:`item_feature_table` and :func:`time_split`; ``history`` below 0.
    """
    if history < 0:
        raise InteractionsError(f"--history must be >= 0 (0: no history), got {history}")
    check_feature_names(user_features, item_features)
    fraction = DEFAULT_EVAL_FRACTION if eval_fraction is None else eval_fraction
    found = read_interactions(input_path, user_features, item_features)
    train_count = time_split(len(found), fraction)
    ordered = sorted(found, key=lambda i: i.time)  # stable: ties stay in file order
    maps = IdMaps.of(ordered, user_features, item_features)
    table = item_feature_table(ordered, maps, item_features)
    rows = rows_of(ordered, maps, user_features, history)
    counts = np.bincount(rows[:train_count, 1], minlength=len(maps.items)).astype(np.int64)
    layout = Layout(history, tuple(user_features), tuple(item_features))
    first_held = ordered[train_count].time if train_count < len(ordered) else None
    return _write(out, maps, layout, rows, train_count, table, counts, first_held, shard_tokens)


@dataclass(frozen=True)
class Layout:
    """The columns of a stored row: ``history`` items, then ``user_features``; and the item
    features of ``item_features.npy``."""

    history: int
    user_features: tuple[str, ...]
    item_features: tuple[str, ...]

    @property
    def width(self) -> int:
        return 2 + self.history + len(self.user_features)

    def as_dict(self) -> dict[str, object]:
        return {
            "history": self.history,
            "user_features": list(self.user_features),
            "item_features": list(self.item_features),
        }


def _write(
    out: Path,
    maps: IdMaps,
    layout: Layout,
    rows: np.ndarray,
    train_count: int,
    table: np.ndarray,
    counts: np.ndarray,
    first_held: float | None,
    shard_tokens: int,
) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for key, value in (("users", maps.users), ("items", maps.items), ("features", maps.features)):
        path = out / ID_FILES[key]
        path.write_text(json.dumps(value, indent=1) + "\n")
        files.append({"name": ID_FILES[key], "sha256": _sha256(path)})
    for key, array in (("item_features", table), ("item_counts", counts)):
        np.save(out / ARRAYS[key], array, allow_pickle=False)
        files.append({"name": ARRAYS[key], "sha256": _sha256(out / ARRAYS[key])})
    entry = {
        "num_users": len(maps.users),
        "num_items": len(maps.items),
        "feature_sizes": maps.sizes(),
        **layout.as_dict(),
        "split": {"by": "timestamp", "eval_from": first_held},
    }
    vocab = max(len(maps.users), len(maps.items) + 1, *[n + 1 for n in maps.sizes().values()])
    width = layout.width
    per_shard = max(width, shard_tokens - shard_tokens % width)
    return data.write_examples_dataset(
        out,
        [(r, None) for r in rows[:train_count]],
        [(r, None) for r in rows[train_count:]],
        vocab_size=vocab,
        identity={"tokenizer": TOKENIZER},
        shard_tokens=per_shard,
        extra={"task": TASK, TASK: entry, "files": files},
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def summary_line(manifest: Mapping[str, Any]) -> str:
    """One line of the users, items and features of a prepared dataset, for prepare-data."""
    entry = manifest[TASK]
    features = ", ".join(f"{n} {k}" for n, k in entry["feature_sizes"].items()) or "none"
    return (
        f"users {entry['num_users']}, items {entry['num_items']}, history {entry['history']}, "
        f"features: {features}; held out the interactions from timestamp "
        f"{entry['split']['eval_from']} on"
    )


@dataclass(frozen=True)
class Interactions:
    """A prepared interactions dataset: its id maps and layout, the item feature table and
    the training counts, and each split's rows (``eval`` None without a held-out split)."""

    root: Path
    maps: IdMaps
    layout: Layout
    item_features: np.ndarray
    item_counts: np.ndarray
    train: np.ndarray
    eval: np.ndarray | None

    @property
    def num_users(self) -> int:
        return len(self.maps.users)

    @property
    def num_items(self) -> int:
        return len(self.maps.items)


def is_interactions_data(root: str | Path) -> bool:
    """Whether ``root`` holds data of ``prepare-data --format interactions``."""
    path = Path(root) / data.MANIFEST
    try:
        return bool(json.loads(path.read_text()).get("task") == TASK)
    except (OSError, ValueError, AttributeError):
        return False


def manifest_entry(root: str | Path) -> dict[str, Any]:
    """The ``recommend`` entry of ``root``'s manifest: its tables' sizes and its layout.

    Raises:
        InteractionsError: ``root`` holds no data of ``prepare-data --format interactions``.
    """
    path = Path(root) / data.MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise InteractionsError(f"{path}: unreadable ({error})") from error
    entry = manifest.get(TASK) if isinstance(manifest, dict) else None
    if manifest.get("task") != TASK or not isinstance(entry, dict):
        raise InteractionsError(
            f"--data {root} holds no interactions (its manifest has no 'recommend' entry): "
            "prepare it with `trn-train prepare-data --format interactions`"
        )
    return entry


def open_interactions(dataset: data.Dataset, *, verify: bool = True) -> Interactions:
    """The :class:`Interactions` of ``dataset`` (opened by :func:`trainer.data.open_dataset`),
    each file beside the shards checked against the manifest's SHA-256 (``verify``, default
    True) and each array against the data's sizes.

    Raises:
        InteractionsError: the dataset is not of interactions, or a file is missing, fails its
            checksum or does not fit the data.
    """
    root = dataset.root
    entry = manifest_entry(root)
    manifest = json.loads((root / data.MANIFEST).read_text())
    for file in manifest.get("files", []):
        path = root / file["name"]
        if not path.is_file():
            raise InteractionsError(f"{path}: missing")
        if verify and _sha256(path) != file["sha256"]:
            raise InteractionsError(
                f"{path}: checksum mismatch (SHA-256 differs from the manifest)"
            )
    features = json.loads((root / ID_FILES["features"]).read_text())
    maps = IdMaps(
        tuple(json.loads((root / ID_FILES["users"]).read_text())),
        tuple(json.loads((root / ID_FILES["items"]).read_text())),
        {name: tuple(values) for name, values in features.items()},
    )
    layout = Layout(
        int(entry["history"]), tuple(entry["user_features"]), tuple(entry["item_features"])
    )
    table = np.load(root / ARRAYS["item_features"], allow_pickle=False)
    counts = np.load(root / ARRAYS["item_counts"], allow_pickle=False)
    if table.shape != (len(maps.items), len(layout.item_features)) or counts.shape != (
        len(maps.items),
    ):
        raise InteractionsError(
            f"{root}: item_features.npy {table.shape} or item_counts.npy {counts.shape} does "
            f"not fit {len(maps.items)} items and {len(layout.item_features)} item features"
        )
    train = _rows(dataset, layout.width)
    held = None if dataset.eval_split is None else _rows(dataset.eval_split, layout.width)
    return Interactions(root, maps, layout, table, counts, train, held)


def _rows(split: data.Dataset, width: int) -> np.ndarray:
    """A split's rows, ``(n, width)`` in the stored dtype (unsigned, 2 or 4 bytes; batches are
    made int64), in stored order, read into host memory.

    Raises:
        InteractionsError: a shard whose tokens are not whole rows.
    """
    parts = []
    for name, shard in zip(split.names, split.shards, strict=True):
        if shard.size % width:
            raise InteractionsError(
                f"{split.root / name}: {shard.size} values are not whole rows of {width}"
            )
        parts.append(np.asarray(shard).reshape(-1, width))
    return np.concatenate(parts)


class InteractionSampler:
    """Rows of one interaction each (see the module's documentation).

    Each step's global batch is ``micro_batch * world_size * grad_accum`` rows of the epoch's
    order; micro-step ``m`` of rank ``r`` reads block ``m * world_size + r``. ``shuffle`` False
    (eval) keeps the stored order.
    """

    def __init__(
        self,
        rows: np.ndarray,
        *,
        micro_batch: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        grad_accum: int = 1,
        shuffle: bool = True,
    ) -> None:
        self.rows, self.micro_batch, self.seed = rows, micro_batch, seed
        self.rank, self.world_size, self.grad_accum = rank, world_size, grad_accum
        self.shuffle = shuffle
        self.rows_per_step = micro_batch * world_size * grad_accum

    @property
    def examples(self) -> int:
        return int(self.rows.shape[0])

    def steps_in(self, epoch: int) -> int:
        """Steps of one epoch (the same for every epoch): every interaction once."""
        return math.ceil(self.examples / self.rows_per_step)

    def steps_for(self, epochs: int) -> int:
        return epochs * self.steps_in(0)

    def step_examples(self, step: int) -> np.ndarray:
        """The interaction of each row of the step's global batch, -1 for an empty row."""
        epoch, k = divmod(step, self.steps_in(0))
        if self.shuffle:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch, _ORDER_STREAM]))
            order = rng.permutation(self.examples)
        else:
            order = np.arange(self.examples)
        picked = order[k * self.rows_per_step : (k + 1) * self.rows_per_step]
        return np.concatenate([picked, np.full(self.rows_per_step - picked.size, -1)])

    def batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows: int64 ``(micro_batch, width)`` (zeros in an empty row) and a bool
        ``(micro_batch,)`` that is True where a row holds an interaction."""
        import torch

        block = micro_step * self.world_size + self.rank
        picks = self.step_examples(step)[block * self.micro_batch : (block + 1) * self.micro_batch]
        real = picks >= 0
        rows = np.zeros((self.micro_batch, self.rows.shape[1]), dtype=np.int64)
        rows[real] = self.rows[picks[real]]
        return torch.from_numpy(rows), torch.from_numpy(real)
