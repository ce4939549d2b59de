"""trnctl compare on the metrics of two real short CPU runs of trn-train: every figure of the
table against a value computed here from the records, the HTML report, prices and errors."""

from __future__ import annotations

import base64
import json
import os
import re
import statistics
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
from test_trnctl_aws import OUTPUTS
from test_trnctl_cost import product

from tests import warm
from trainer import data
from trnctl import compare
from trnctl.errors import TrnctlError

# Two runs that differ in batch size and length; each is a few seconds on a CPU.
RUNS = {
    "a": {"type": "trn2.48xlarge", "micro_batch": "4", "max_steps": "12"},
    "b": {"type": "p5en.48xlarge", "micro_batch": "8", "max_steps": "8"},
}
TRN2_OD, TRN2_CB = 40.0, 30.0
P5EN_OD = 63.296  # the catalog's us-east-2 figure (trn_catalog/prices.py); no Capacity Block
# One worker runs this module's tests, so that the two runs of metrics_files happen once
# (tests/scheduling.py); they start early.
pytestmark = [pytest.mark.xdist_group("compare"), pytest.mark.slow]


@pytest.fixture(scope="module")
def metrics_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Runs trn-train twice (tiny preset, CPU, a record every 2 steps; warm, tests/warm.py) as
    the platform would, with TRN_INSTANCE_TYPE set; returns the metrics files."""
    root = tmp_path_factory.mktemp("compare")
    corpus = root / "corpus"
    data.prepare_corpus(corpus)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1")
    files = {}
    for name, run in RUNS.items():
        files[name] = root / f"{name}.jsonl"
        done = warm.run(
            [
                *(sys.executable, "-m", "trainer", "run", "--preset", "tiny", "--device", "cpu"),
                *("--compile", "none", "--data", str(corpus), "--log-every", "2", "--seed", "1"),
                *("--micro-batch", run["micro_batch"], "--max-steps", run["max_steps"]),
                *("--metrics", str(files[name]), "--no-progress"),
            ],
            env={**env, "TRN_INSTANCE_TYPE": run["type"]},
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-4000:]
    return files


def _records(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["kind"] == "run"
    return lines[0], [r for r in lines[1:] if "kind" not in r]


def _table(stdout: str) -> dict[str, list[str]]:
    """The table's rows by their first cell."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0]:
            rows[cells[0]] = cells[1:]
    return rows


def _number(cell: str) -> float:
    return float(re.sub(r"[$,%s ]", "", cell).removesuffix("s"))


def _hand(path: Path) -> dict[str, Any]:
    """The figures of one run, from its records."""
    header, records = _records(path)
    steady = statistics.median(r["tokens_per_s"] for r in records[1:])
    return {
        "header": header,
        "records": records,
        "first_step": records[0]["elapsed_s"],
        "tps": steady,
        "mfu": steady
        / header["world_size"]
        * header["flops_per_token"]
        / header["peak_flops_per_rank"],
        "run_time": records[-1]["elapsed_s"],
        "tokens": records[-1]["tokens"],
    }


def test_every_figure_of_the_table_matches_the_records(
    trnctl: Any, metrics_files: dict[str, Path], tmp_path: Path
) -> None:
    a, b = _hand(metrics_files["a"]), _hand(metrics_files["b"])
    to_tokens = b["records"][1]["tokens"] + 1  # inside b's third interval, a's later one
    run = trnctl(
        "compare",
        str(metrics_files["a"]),
        str(metrics_files["b"]),
        "--price",
        f"trn2.48xlarge={TRN2_OD}",
        "--price",
        f"trn2.48xlarge:cb={TRN2_CB}",
        "--to-tokens",
        str(to_tokens),
        "--out",
        str(tmp_path / "report.html"),
    )
    assert run.exit_code == 0, run.stderr
    table = _table(run.stdout)

    # Settings, from the headers.
    assert table["instance"] == ["1 x trn2.48xlarge", "1 x p5en.48xlarge"]
    assert table["device, precision"] == ["cpu, fp32", "cpu, fp32"]
    assert table["model"] == ["tiny", "tiny"]
    assert [_number(c) for c in table["global batch (tokens)"]] == [64 * 4, 64 * 8]
    # Time, throughput and MFU.
    for row, key, tolerance in (
        ("time to first step", "first_step", 0.051),
        ("run time", "run_time", 0.051),
        ("steady tokens/s", "tps", 0.051),
        ("tokens trained", "tokens", 0),
    ):
        got = [_number(c) for c in table[row]]
        assert got == pytest.approx([a[key], b[key]], abs=tolerance), row
    assert [_number(c) / 100 for c in table["MFU"]] == pytest.approx([a["mfu"], b["mfu"]], abs=5e-5)
    # Loss at matched token counts: a's counts inside both curves, b interpolated there.
    a_curve = [(r["tokens"], r["loss"]) for r in a["records"]]
    b_curve = [(r["tokens"], r["loss"]) for r in b["records"]]
    low, high = max(a_curve[0][0], b_curve[0][0]), min(a_curve[-1][0], b_curve[-1][0])
    grid = [t for t, _ in a_curve if low <= t <= high]
    a_at = [loss for t, loss in a_curve if low <= t <= high]
    b_at = np.interp(grid, *zip(*b_curve, strict=True))
    (loss_row,) = [name for name in table if name.startswith("loss at ")]
    assert loss_row == f"loss at {grid[-1]:,} tokens"
    assert [_number(c) for c in table[loss_row]] == pytest.approx([a_at[-1], b_at[-1]], abs=5e-5)
    difference = float(np.mean(np.abs(np.array(b_at) - np.array(a_at))))
    assert table[f"mean |loss - {metrics_files['a']}|"][0] == "0.0000"
    assert _number(table[f"mean |loss - {metrics_files['a']}|"][1]) == pytest.approx(
        difference, abs=5e-5
    )
    # Cost: $/h x nodes (1) over the steady throughput, and over the run's time.
    assert table["On-Demand $/instance-h"] == ["$40.00", "$63.30"]
    assert table["Capacity Block $/instance-h"] == ["$30.00", "n/a"]
    for market, a_rate, b_rate in (
        ("On-Demand", TRN2_OD, P5EN_OD),
        ("Capacity Block", TRN2_CB, None),
    ):
        per_million = table[f"{market} $ per 1M tokens"]
        whole = table[f"{market} $ for the run"]
        assert _number(per_million[0]) == pytest.approx(
            a_rate / 3600 / a["tps"] * 1e6, rel=1e-3, abs=0.005
        )
        assert _number(whole[0]) == pytest.approx(
            a_rate * a["run_time"] / 3600, rel=1e-3, abs=0.005
        )
        if b_rate is None:
            assert per_million[1] == whole[1] == "n/a"
        else:
            assert _number(per_million[1]) == pytest.approx(
                b_rate / 3600 / b["tps"] * 1e6, rel=1e-3, abs=0.005
            )
            assert _number(whole[1]) == pytest.approx(
                b_rate * b["run_time"] / 3600, rel=1e-3, abs=0.005
            )
    # Time (and cost) to a token count: the first record that has trained that many.
    reach = [
        next(r["elapsed_s"] for r in hand["records"] if r["tokens"] >= to_tokens) for hand in (a, b)
    ]
    assert [_number(c) for c in table[f"time to {to_tokens:,} tokens"]] == pytest.approx(
        reach, abs=0.051
    )
    assert _number(table[f"On-Demand $ to {to_tokens:,} tokens"][0]) == pytest.approx(
        TRN2_OD * reach[0] / 3600, rel=1e-3, abs=0.005
    )
    assert table[f"Capacity Block $ to {to_tokens:,} tokens"][1] == "n/a"
    # Where each rate comes from, and what to pass where there is none.
    assert f"{metrics_files['a']}: On-Demand: --price trn2.48xlarge (given)" in run.stdout
    assert (
        f"{metrics_files['b']}: On-Demand: us-east-2, as of 2026-08-06, unverified: "
        "dstack-pr-4110-2026-08" in run.stdout
    )
    assert (
        "no price for p5en.48xlarge in us-east-2: pass --price p5en.48xlarge:cb=USD" in run.stdout
    )


class _Report(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict[str, str]] = []
        self.captions: list[str] = []
        self.row_names: list[str] = []
        self._table: str | None = None
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if tag == "img":
            self.images.append(values)
        elif tag == "table":
            self._table = values.get("id")
        self._in = tag

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        self._in = None

    def handle_data(self, text: str) -> None:
        if self._in == "figcaption":
            self.captions.append(text)
        elif self._in == "th" and self._table == "summary" and text.strip():
            self.row_names.append(text)


def test_the_html_report_holds_both_plots_and_the_table(
    trnctl: Any, metrics_files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "report.html"
    args = [str(metrics_files["a"]), str(metrics_files["b"]), "--out", str(out)]
    run = trnctl("compare", *args, "--price", "trn2.48xlarge=40")
    assert run.exit_code == 0, run.stderr

    report = _Report()
    report.feed(out.read_text())
    assert [i["alt"] for i in report.images] == [
        "Loss vs tokens",
        "Tokens/s vs time",
        "Loss vs cost",
    ]
    assert report.captions == ["Loss vs tokens", "Tokens/s vs time", "Loss vs cost"]
    for image in report.images:
        prefix = "data:image/png;base64,"
        assert image["src"].startswith(prefix)
        assert base64.b64decode(image["src"].removeprefix(prefix))[:8] == b"\x89PNG\r\n\x1a\n"
    table = _table(run.stdout)
    # The header row names both runs; then every row of the terminal table, in order.
    assert report.row_names[:2] == [str(metrics_files["a"]), str(metrics_files["b"])]
    assert report.row_names[2:] == list(table)
    assert "dstack pull request 4110" in out.read_text()  # the price source, in full


def test_a_loss_never_reached_says_so(trnctl: Any, metrics_files: dict[str, Path]) -> None:
    _, a_records = _records(metrics_files["a"])
    _, b_records = _records(metrics_files["b"])
    target = min(r["loss"] for r in a_records)  # a reaches it at its best record
    args = [str(metrics_files["a"]), str(metrics_files["b"]), "--to-loss", repr(target)]
    run = trnctl("compare", *args, "--price", "trn2.48xlarge=40")
    assert run.exit_code == 0, run.stderr
    table = _table(run.stdout)

    times = table[f"time to loss {target:g}"]
    a_time = next(r["elapsed_s"] for r in a_records if r["loss"] <= target)
    assert _number(times[0]) == pytest.approx(a_time, abs=0.051)
    b_reach = [r["elapsed_s"] for r in b_records if r["loss"] <= target]
    if b_reach:
        assert _number(times[1]) == pytest.approx(b_reach[0], abs=0.051)
    else:
        assert times[1] == "not reached"
        assert table[f"On-Demand $ to loss {target:g}"][1] == "not reached"

    never = trnctl("compare", *args[:2], "--to-loss", "0")
    assert never.exit_code == 0, never.stderr
    assert _table(never.stdout)["time to loss 0"] == ["not reached", "not reached"]
    # No Capacity Block price for either run: no such row; a run without a price shows n/a.
    assert "Capacity Block $ to loss 0" not in _table(never.stdout)
    assert _table(never.stdout)["On-Demand $ to loss 0"] == ["n/a", "not reached"]


@pytest.mark.parametrize(
    "value",
    ["p5.48xlarge", "p5.48xlarge=abc", "=12", "p5.48xlarge=-1", "p5.48xlarge:spot=5", "x=inf"],
)
def test_bad_price_values_name_the_flag_and_the_value(
    trnctl: Any, metrics_files: dict[str, Path], value: str
) -> None:
    run = trnctl("compare", str(metrics_files["a"]), "--price", value)
    assert run.exit_code == 2
    assert f"trnctl: --price {value!r}: expected TYPE=USD_PER_HOUR (On-Demand) or " in run.stderr


def test_a_run_that_is_neither_a_file_nor_a_job_fails_clearly(
    trnctl: Any, deployed: None, tmp_path: Path
) -> None:
    missing = str(tmp_path / "nope.jsonl")
    run = trnctl("compare", missing)
    assert run.exit_code == 2
    assert f"RUN {missing!r} is not a metrics file; to read a job's metrics, pass its name" in (
        run.stderr
    )
    run = trnctl("compare", missing, "--env", "trn-dev")
    assert run.exit_code == 2
    assert f"RUN {missing!r} is neither a metrics file nor a job name" in run.stderr
    run = trnctl("compare", "ghost", "--env", "trn-dev")
    assert run.exit_code == 4
    assert "job 'ghost' has no metrics at s3://trn-dev-checkpoints/ghost/metrics.jsonl" in (
        run.stderr
    )


@pytest.fixture
def deployed(moto: None) -> None:
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=OUTPUTS.to_json(), Type="String"
    )
    boto3.client("s3").create_bucket(
        Bucket=OUTPUTS.checkpoints_bucket,
        CreateBucketConfiguration={"LocationConstraint": OUTPUTS.region},
    )


def test_a_job_name_with_env_reads_its_metrics_from_the_checkpoints_bucket(
    trnctl: Any, deployed: None, metrics_files: dict[str, Path]
) -> None:
    # Where FSx exports /fsx/checkpoints/train-a/metrics.jsonl (trnctl.jobs.metrics_path).
    boto3.client("s3").put_object(
        Bucket=OUTPUTS.checkpoints_bucket,
        Key="train-a/metrics.jsonl",
        Body=metrics_files["a"].read_bytes(),
    )
    by_job = trnctl("compare", "train-a", str(metrics_files["b"]), "--env", "trn-dev")
    by_file = trnctl("compare", str(metrics_files["a"]), str(metrics_files["b"]))
    assert by_job.exit_code == by_file.exit_code == 0, by_job.stderr + by_file.stderr
    job_table, file_table = _table(by_job.stdout), _table(by_file.stdout)
    header = next(line for line in by_job.stdout.splitlines() if "┃" in line)
    assert [cell.strip() for cell in header.split("┃")[1:-1]][1] == "train-a"
    for row in ("time to first step", "steady tokens/s", "MFU", "run time", "tokens trained"):
        assert job_table[row] == file_table[row], row


def test_live_prices_on_demand_from_the_pricing_api(
    trnctl: Any, clients: Any, stub: Any, metrics_files: dict[str, Path]
) -> None:
    pricing = stub(clients("pricing", "us-east-1"))
    pricing.add_response("get_products", {"PriceList": [product("44.0000000000")]})
    run = trnctl("compare", str(metrics_files["a"]), "--live")
    assert run.exit_code == 0, run.stderr
    assert _table(run.stdout)["On-Demand $/instance-h"] == ["$44.00"]
    assert "On-Demand: AWS Pricing API, us-east-2, now" in run.stdout
    pricing.assert_no_pending_responses()


def _lines(*records: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


HEADER = {
    "kind": "run",
    "instance_type": None,
    "nodes": 1,
    "world_size": 2,
    "device": "cpu",
    "precision": "fp32",
    "model": "tiny",
    "global_batch_tokens": 100,
    "seq_len": 50,
    "flops_per_token": 10.0,
    "peak_flops_per_rank": None,
    "started_at": "2026-11-30T20:00:00+00:00",
}


def _train(step: int, elapsed: float, loss: float = 1.0) -> dict[str, Any]:
    return {
        "step": step,
        "loss": loss,
        "tokens": step * 100,
        "tokens_per_s": 50.0,
        "elapsed_s": elapsed,
    }


def test_a_resumed_run_adds_its_starts_times_and_keeps_the_later_step() -> None:
    text = _lines(
        HEADER, _train(1, 5.0), _train(2, 6.0), HEADER, _train(2, 4.0, 0.5), _train(3, 5.0)
    )
    run = compare.parse(text, "m.jsonl")
    assert [(r["step"], r["time_s"], r["loss"]) for r in run.records] == [
        (1, 5.0, 1.0),
        (2, 10.0, 0.5),
        (3, 11.0, 1.0),
    ]
    assert run.restarts == 1
    # No peak in the header: MFU is unknown, not 0.
    assert compare.mfu(run, 50.0) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_lines(_train(1, 1.0)), r"m.jsonl: no run header \(a first line with \"kind\": \"run\"\)"),
        (_lines(HEADER), "m.jsonl: no train records yet"),
        ("{not json\n", "m.jsonl:1: not a JSON line"),
        (_lines(HEADER, {"step": 1}), "m.jsonl:2: a train record without 'elapsed_s'"),
        (
            _lines({k: v for k, v in HEADER.items() if k != "peak_flops_per_rank"}),
            "m.jsonl: the run header lacks peak_flops_per_rank",
        ),
    ],
)
def test_files_compare_cannot_read_are_refused(text: str, message: str) -> None:
    with pytest.raises(TrnctlError, match=message):
        compare.parse(text, "m.jsonl")


def test_no_steady_interval_leaves_throughput_and_costs_unknown() -> None:
    run = compare.parse(_lines(HEADER, _train(1, 5.0), _train(2, 6.0)), "m.jsonl")
    assert compare.steady_tokens_per_s(run, warmup_steps=2) is None
    assert compare.steady_tokens_per_s(run, warmup_steps=1) == 50.0
    rate = compare.Rate(10.0, "given")
    assert compare.cost_per_million(rate, 1, None) is None


def _multi_node_run(path: Path, nodes: int, tokens_per_s: float, ends_at: float) -> Path:
    """Metrics of a run on ``nodes`` trn2.48xlarge: three records at the same whole-job
    throughput, the last at ``ends_at`` seconds."""
    header = HEADER | {"instance_type": "trn2.48xlarge", "nodes": nodes, "world_size": 64 * nodes}
    records = [
        {"step": step, "loss": 1.0, "tokens": step * 100_000, "tokens_per_s": tokens_per_s}
        | {"elapsed_s": ends_at * share}
        for step, share in ((1, 1 / 6), (2, 1 / 2), (3, 1.0))
    ]
    path.write_text(_lines(header, *records))
    return path


def test_costs_of_multi_node_runs_count_every_node(trnctl: Any, tmp_path: Path) -> None:
    """At $36 per instance-hour: 2 nodes at 100,000 tokens/s for an hour cost $0.02 a second,
    $0.20 per 1M tokens and $72 for the run, $36 to their 200,000th token (half an hour in);
    4 nodes at 400,000 tokens/s for half an hour cost $0.04 a second, $0.10 per 1M tokens,
    $72 for the run and $36 to the same token (a quarter of an hour in)."""
    two = _multi_node_run(tmp_path / "two.jsonl", nodes=2, tokens_per_s=100_000, ends_at=3600)
    four = _multi_node_run(tmp_path / "four.jsonl", nodes=4, tokens_per_s=400_000, ends_at=1800)

    run = trnctl(
        "compare", str(two), str(four), "--price", "trn2.48xlarge=36", "--to-tokens", "200000"
    )

    assert run.exit_code == 0, run.stderr
    table = _table(run.stdout)
    assert table["instance"] == ["2 x trn2.48xlarge", "4 x trn2.48xlarge"]
    assert table["steady tokens/s"] == ["100,000.0", "400,000.0"]
    assert table["On-Demand $ per 1M tokens"] == ["$0.2", "$0.1"]
    assert table["On-Demand $ for the run"] == ["$72.00", "$72.00"]
    assert table["On-Demand $ to 200,000 tokens"] == ["$36.00", "$36.00"]
