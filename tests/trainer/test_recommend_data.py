"""``prepare-data --format interactions``: sorted id maps, the split by time, each row's history
and features, JSON lines, CSV and Parquet alike (byte for byte), the files' checks and staging
list, every validation message, and the rows the sampler makes of them."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import ROOT
from trainer import cli, data
from trainer.recommend import data as rdata
from trainer.tokenizing import InputError

GROUPS = 10


def interactions(
    users: int = 120, items: int = 200, per_user: int = 30, seed: int = 0
) -> list[dict[str, Any]]:
    """A preference structure: user ``u`` belongs to group ``u % 10`` and nine times in ten
    picks an item of its group (items ``i`` with ``i % 10`` the group), else any item; a user
    feature (``region``) names the group, an item feature (``category``) the item's group; the
    times are random, so the latest interactions are a random tenth of each user's."""
    rng = random.Random(seed)
    out = []
    for u in range(users):
        group = u % GROUPS
        for _ in range(per_user):
            if rng.random() < 0.9:
                item = group + GROUPS * rng.randrange(items // GROUPS)
            else:
                item = rng.randrange(items)
            out.append(
                {
                    "user_id": f"u{u}",
                    "item_id": item,
                    "timestamp": rng.uniform(0, 1e6),
                    "region": f"r{group}",
                    "category": f"c{item % GROUPS}",
                }
            )
    return out


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_csv(path: Path, records: list[dict[str, Any]], columns: list[str]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for record in records:
            writer.writerow({c: "" if record.get(c) is None else record[c] for c in columns})
    return path


SMALL = [
    {"user_id": "bob", "item_id": 7, "timestamp": 30, "region": "eu", "category": "book"},
    {"user_id": "ann", "item_id": "x", "timestamp": "1970-01-01T00:00:10+00:00", "region": None},
    {"user_id": "bob", "item_id": "x", "timestamp": 20.5, "region": "us", "category": "toy"},
    {"user_id": "ann", "item_id": 7, "timestamp": 40, "region": "eu", "category": "book"},
    {"user_id": "bob", "item_id": "y", "timestamp": 50},
]


def _prepared(tmp_path: Path, source: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "out"
    args = ["prepare-data", "--format", "interactions", "--input", str(source), "--out", str(out)]
    assert (
        cli.main([*args, "--user-features", "region", "--item-features", "category", *extra]) == 0
    )
    return json.loads((out / data.MANIFEST).read_text())


def _open(root: Path) -> rdata.Interactions:
    return rdata.open_interactions(data.open_dataset(root))


def test_ids_are_sorted_names_and_the_latest_interactions_are_held_out(tmp_path: Path) -> None:
    manifest = _prepared(
        tmp_path,
        write_jsonl(tmp_path / "i.jsonl", SMALL),
        "--history",
        "2",
        "--eval-fraction",
        "0.4",
    )
    got = _open(tmp_path / "out")
    assert got.maps.users == ("ann", "bob")
    assert got.maps.items == ("7", "x", "y")  # sorted as strings
    assert got.maps.features == {"region": ("eu", "us"), "category": ("book", "toy")}
    # Time order: ann x (10), bob x (20.5), bob 7 (30) | ann 7 (40), bob y (50) held out.
    assert manifest["recommend"]["split"] == {"by": "timestamp", "eval_from": 40.0}
    # [user, item, history (latest first, id + 1), region (id + 1)]
    np.testing.assert_array_equal(got.train, [[0, 1, 0, 0, 0], [1, 1, 0, 0, 2], [1, 0, 2, 0, 1]])
    assert got.eval is not None
    np.testing.assert_array_equal(got.eval, [[0, 0, 2, 0, 1], [1, 2, 1, 2, 0]])
    np.testing.assert_array_equal(got.item_features, [[1], [2], [0]])  # y: unknown
    np.testing.assert_array_equal(got.item_counts, [1, 2, 0])  # training interactions only
    assert "users 2, items 3, history 2" in rdata.summary_line(manifest)


def test_csv_makes_the_same_dataset_as_json_lines(tmp_path: Path) -> None:
    records = interactions(users=20, per_user=5)
    columns = ["user_id", "item_id", "timestamp", "region", "category"]
    as_json = tmp_path / "j"
    as_json.mkdir()
    as_csv = tmp_path / "c"
    as_csv.mkdir()
    _prepared(as_json, write_jsonl(tmp_path / "i.jsonl", records))
    # CSV holds the times as text: repr keeps every digit, so both read the same floats.
    texts = [{**r, "timestamp": repr(r["timestamp"])} for r in records]
    _prepared(as_csv, write_csv(tmp_path / "i.csv", texts, columns))
    a, b = _open(as_json / "out"), _open(as_csv / "out")
    assert a.maps == b.maps
    np.testing.assert_array_equal(a.train, b.train)
    np.testing.assert_array_equal(a.item_features, b.item_features)


def write_parquet(path: Path, columns: dict[str, pa.Array]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def test_json_lines_csv_and_parquet_make_byte_identical_datasets(tmp_path: Path) -> None:
    records = interactions(users=20, per_user=5)
    columns = ["user_id", "item_id", "timestamp", "region", "category"]
    texts = [{**r, "timestamp": repr(r["timestamp"])} for r in records]
    parquet = {
        "user_id": pa.array([r["user_id"] for r in records], pa.large_string()),
        "item_id": pa.array([r["item_id"] for r in records], pa.int32()),
        "timestamp": pa.array([r["timestamp"] for r in records], pa.float64()),
        # As pandas writes a categorical: a dictionary of strings.
        "region": pa.array([r["region"] for r in records]).dictionary_encode(),
        "category": pa.array([r["category"] for r in records]),
    }
    sources = {
        "j": write_jsonl(tmp_path / "i.jsonl", records),
        "c": write_csv(tmp_path / "i.csv", texts, columns),
        "p": write_parquet(tmp_path / "i.parquet", parquet),
    }
    for name, source in sources.items():
        (tmp_path / name).mkdir()
        _prepared(tmp_path / name, source)
    want = _files(tmp_path / "j" / "out")
    assert "manifest.json" in want and "items.json" in want
    assert _files(tmp_path / "c" / "out") == want
    assert _files(tmp_path / "p" / "out") == want


@pytest.mark.parametrize(
    ("unit", "zone"), [("ms", None), ("us", "UTC"), ("ns", "Europe/Paris"), ("s", None)]
)
def test_a_parquet_timestamp_column_is_the_iso_time_of_the_same_instant(
    tmp_path: Path, unit: str, zone: str | None
) -> None:
    rng = random.Random(1)
    start = datetime(2026, 11, 2, tzinfo=UTC)
    step = timedelta(seconds=1) if unit == "s" else timedelta(milliseconds=1)
    times = [start + rng.randrange(10**7) * step for _ in range(60)]
    records = [{"user_id": k % 7, "item_id": k % 11} for k in range(60)]
    # JSON lines hold them without a zone (read as UTC); Parquet as instants in `zone`.
    texts = [t.replace(tzinfo=None).isoformat() for t in times]
    write_jsonl(
        tmp_path / "i.jsonl", [{**r, "timestamp": t} for r, t in zip(records, texts, strict=True)]
    )
    kind = pa.timestamp(unit, tz=zone)
    stored = [t if zone else t.replace(tzinfo=None) for t in times]
    columns = {k: pa.array([r[k] for r in records], pa.int64()) for k in ("user_id", "item_id")}
    write_parquet(tmp_path / "i.parquet", {**columns, "timestamp": pa.array(stored, kind)})
    for name in ("jsonl", "parquet"):
        rdata.prepare(tmp_path / name, tmp_path / f"i.{name}", history=3, eval_fraction=0.3)
    assert _files(tmp_path / "parquet") == _files(tmp_path / "jsonl")


PARQUET_ROWS = {
    "user_id": pa.array(["a", "b", "c"]),
    "item_id": pa.array([1, 2, 3]),
    "timestamp": pa.array([1.0, 2.0, 3.0]),
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"timestamp": None},
            r"schema's columns \['user_id', 'item_id', 'region'\] lack \['timestamp'\]",
        ),
        (
            {"item_id": pa.array([1.0, 2.0, 3.0])},
            r"column 'item_id' is of Parquet type double; allowed: an integer or string column",
        ),
        (
            {"timestamp": pa.array([1, 2, 3], pa.date32())},
            r"column 'timestamp' is of Parquet type date32\[day\]; allowed: a timestamp, int",
        ),
        (
            {"timestamp": pa.array([None, None, None], pa.null())},
            r"column 'timestamp' is of Parquet type null; allowed: a timestamp",
        ),
        (
            {"region": pa.array([True, False, True])},
            r"column 'region' is of Parquet type bool; allowed: an integer or string column, a "
            r"dictionary of either, or nulls",
        ),
        (
            {"user_id": pa.array(["a", None, " "])},
            r"2 problem\(s\): .*i.parquet:row 2: field 'user_id' is None; allowed: a non-empty "
            r"string or an integer; .*i.parquet:row 3: field 'user_id' is ' '",
        ),
        (
            {"timestamp": pa.array(["1", "yesterday", "1970-01-01T00:00:03"])},
            r"i.parquet:row 2: field 'timestamp' is 'yesterday'; allowed: seconds since the epoch",
        ),
        (
            {"timestamp": pa.array([1.0, float("nan"), 3.0])},
            r"i.parquet:row 2: field 'timestamp' is nan; allowed: seconds since the epoch",
        ),
    ],
)
def test_parquet_columns_and_rows_that_are_not_allowed_are_named(
    tmp_path: Path, change: dict[str, pa.Array | None], message: str
) -> None:
    columns = {**PARQUET_ROWS, "region": pa.array(["eu", None, "us"]), **change}
    kept = {k: v for k, v in columns.items() if v is not None}
    source = write_parquet(tmp_path / "i.parquet", kept)
    with pytest.raises(rdata.InteractionsError, match=message):
        rdata.prepare(tmp_path / "out", source, user_features=["region"])


def test_a_parquet_column_name_held_twice_is_refused_by_name(tmp_path: Path) -> None:
    """pyarrow finds no column by a name two columns hold; the message names it."""
    names = [*PARQUET_ROWS, "user_id"]
    table = pa.Table.from_arrays([*PARQUET_ROWS.values(), pa.array(["x", "y", "z"])], names=names)
    pq.write_table(table, tmp_path / "i.parquet")
    with pytest.raises(
        rdata.InteractionsError,
        match=r"i.parquet: the Parquet schema's columns \['user_id', 'item_id', 'timestamp', "
        r"'user_id'\] hold \['user_id'\] more than once; allowed: each needed column once",
    ):
        rdata.prepare(tmp_path / "out", tmp_path / "i.parquet")


def test_parquet_is_read_a_batch_at_a_time_with_rows_counted_across_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rdata, "PARQUET_BATCH_ROWS", 4)
    records = interactions(users=3, per_user=5)
    users = [r["user_id"] for r in records]
    users[9] = ""
    columns = {
        "user_id": pa.array(users),
        "item_id": pa.array([r["item_id"] for r in records]),
        "timestamp": pa.array([r["timestamp"] for r in records]),
        "region": pa.array([None] * len(records), pa.null()),  # all unknown
    }
    source = write_parquet(tmp_path / "i.parquet", columns)
    with pytest.raises(rdata.InteractionsError, match=r"1 problem\(s\): .*i.parquet:row 10: "):
        rdata.prepare(tmp_path / "out", source, user_features=["region"])
    users[9] = "u0"
    write_parquet(source, {**columns, "user_id": pa.array(users)})
    rdata.prepare(tmp_path / "out", source, user_features=["region"])
    got = _open(tmp_path / "out")
    assert got.maps.features == {"region": ()}
    assert got.train.shape[0] + (0 if got.eval is None else got.eval.shape[0]) == len(records)


def test_without_pyarrow_parquet_is_refused_with_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = write_parquet(tmp_path / "i.parquet", PARQUET_ROWS)
    # None in sys.modules: the import raises ImportError, as where pyarrow is not installed.
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(
        rdata.InteractionsError,
        match=r"i.parquet: reading Parquet needs pyarrow .*"
        r"pip install 'trn-platform-ops\[parquet\]'.*pip install pyarrow==26.0.1",
    ):
        rdata.prepare(tmp_path / "out", source)


def test_the_wheel_extra_the_message_names_installs_the_pinned_pyarrow() -> None:
    project = tomllib.loads((ROOT / "ops" / "pyproject.toml").read_text())["project"]
    assert project["name"] == "trn-platform-ops"
    assert project["optional-dependencies"]["parquet"] == ["pyarrow>=26,<27"]
    assert "pyarrow==26.0.1\n" in (ROOT / "requirements-dev.txt").read_text()


def test_the_trainer_imports_without_pyarrow() -> None:
    code = (
        "import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.parquet'] = None; "
        "import trainer.cli, trainer.recommend.data"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_files_are_checked_and_staged(tmp_path: Path) -> None:
    manifest = _prepared(tmp_path, write_jsonl(tmp_path / "i.jsonl", SMALL))
    names = {name for name, _ in data.dataset_files(manifest)}
    assert {"users.json", "items.json", "features.json", "item_features.npy"} <= names
    assert "item_counts.npy" in names
    (tmp_path / "out" / "items.json").write_text('["7", "x", "z"]\n')
    with pytest.raises(rdata.InteractionsError, match=r"items.json: checksum mismatch"):
        _open(tmp_path / "out")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            {"item_id": 1, "timestamp": 1},
            r"i.jsonl:2: field 'user_id' is None; allowed: a non-empty string or an integer",
        ),
        (
            {"user_id": "a", "item_id": True, "timestamp": 1},
            r"i.jsonl:2: field 'item_id' is True; allowed: a non-empty string or an integer",
        ),
        (
            {"user_id": "a", "item_id": 1, "timestamp": "yesterday"},
            r"i.jsonl:2: field 'timestamp' is 'yesterday'; allowed: seconds since the epoch",
        ),
        (
            {"user_id": "a", "item_id": 1, "timestamp": 1, "region": 1.5},
            r"i.jsonl:2: field 'region' is 1.5; allowed: a string or an integer, or null",
        ),
    ],
)
def test_each_bad_field_is_named_with_its_line_value_and_what_is_allowed(
    tmp_path: Path, line: dict[str, Any], message: str
) -> None:
    source = write_jsonl(tmp_path / "i.jsonl", [SMALL[0], line])
    with pytest.raises(rdata.InteractionsError, match=message):
        rdata.prepare(tmp_path / "out", source, user_features=["region"])


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    bad = [{"user_id": "", "item_id": 1, "timestamp": float("nan")} for _ in range(12)]
    source = write_jsonl(tmp_path / "i.jsonl", [SMALL[0], *bad])
    with pytest.raises(rdata.InteractionsError, match=r"24 problem\(s\) \(and 14 more\)"):
        rdata.prepare(tmp_path / "out", source)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("i.parquet", "", r"i.parquet: not a readable Parquet file \("),
        ("i.txt", "", r"suffix '.txt' is not one this reads; allowed: .jsonl, .ndjson, .csv, .p"),
        ("i.jsonl", "[1, 2]\n", r"i.jsonl:1: expected a JSON object, got list"),
        ("i.jsonl", "{oops\n", r"i.jsonl:1: not valid JSON"),
        ("i.jsonl", "\n", r"holds no interactions"),
        ("i.csv", "user_id,item_id\na,1\n", r"i.csv:1: the CSV header .* lacks column\(s\)"),
        ("i.csv", "user_id,item_id,timestamp\na,,3\n", r"i.csv:2: field 'item_id' is ''"),
    ],
)
def test_files_that_cannot_be_read_are_named(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(InputError, match=message):  # InteractionsError, or a JSON line's
        rdata.prepare(tmp_path / "out", tmp_path / name)


def test_an_item_feature_must_not_differ_between_lines(tmp_path: Path) -> None:
    lines = [SMALL[0], {**SMALL[3], "category": "toy"}]
    source = write_jsonl(tmp_path / "i.jsonl", lines)
    with pytest.raises(
        rdata.InteractionsError,
        match=r"i.jsonl:2: item '7' has 'category' 'toy', but 'book' at .*i.jsonl:1",
    ):
        rdata.prepare(tmp_path / "out", source, item_features=["category"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"history": -1}, r"--history must be >= 0"),
        ({"eval_fraction": 0.6}, r"--eval-fraction must be between 0 and 0.5, got 0.6"),
        ({"user_features": ["timestamp"]}, r"feature column 'timestamp' is not allowed"),
        ({"user_features": ["a"], "item_features": ["a"]}, r"\['a'\] named twice"),
    ],
)
def test_options_are_checked(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    source = write_jsonl(tmp_path / "i.jsonl", SMALL)
    with pytest.raises(rdata.InteractionsError, match=message):
        rdata.prepare(tmp_path / "out", source, **options)


def test_a_held_out_share_that_leaves_nothing_to_train_is_refused(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "i.jsonl", SMALL[:1])
    with pytest.raises(rdata.InteractionsError, match=r"leaving none to train on"):
        rdata.prepare(tmp_path / "out", source, eval_fraction=0.5)


def test_the_cli_refuses_flags_of_other_formats(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "i.jsonl", SMALL)
    args = ["prepare-data", "--format", "interactions", "--out", str(tmp_path / "o")]
    assert cli.main([*args, "--input", str(source), "--tokenizer", "x"]) == cli.USAGE
    assert cli.main(args) == cli.USAGE


def test_an_epoch_visits_every_interaction_once_across_ranks(tmp_path: Path) -> None:
    rows = np.arange(50 * 3, dtype=np.int64).reshape(50, 3)
    seen = []
    for step in range(4):  # 50 rows, 16 a step over two ranks: 4 steps, the last part empty
        for rank in range(2):
            sampler = rdata.InteractionSampler(
                rows, micro_batch=4, seed=3, rank=rank, world_size=2, grad_accum=2
            )
            for micro in range(2):
                batch, real = sampler.batch(step, micro)
                seen.extend(batch[real][:, 0].tolist())
                assert not batch[~real].any()
    assert sorted(seen) == rows[:, 0].tolist()
