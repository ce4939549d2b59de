"""trnctl compare as a decision document: metrics files compared with no AWS configuration, run
labels, the JSON against the table, the cost of runs on 1, 2 and 4 nodes worked out by hand, the
verdict, and the HTML page as headless Chromium renders and prints it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.browser import chromium

STARTED = "2026-11-30T20:00:00+00:00"


def _header(instance_type: str | None, nodes: int, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "run",
        "instance_type": instance_type,
        "nodes": nodes,
        "world_size": 4 * nodes,
        "device": "cpu",
        "precision": "fp32",
        "model": "tiny",
        "global_batch_tokens": 1000,
        "seq_len": 100,
        "flops_per_token": 1.0e6,
        "peak_flops_per_rank": 1.0e9,
        "started_at": STARTED,
        **extra,
    }


def _write(
    path: Path,
    header: dict[str, Any],
    *,
    tokens_per_s: float,
    steps: int = 10,
    loss_drop: float = 0.2,
    first: float = 30.0,
) -> Path:
    """A metrics file: a record per step of 1,000 tokens at ``tokens_per_s``, the first at
    ``first`` seconds (set-up and compilation), the loss falling by ``loss_drop`` a step."""
    lines = [json.dumps(header)]
    for step in range(1, steps + 1):
        elapsed = first + (step - 1) * 1000 / tokens_per_s
        record = {
            "step": step,
            "loss": 5.0 - loss_drop * step,
            "tokens": 1000 * step,
            "tokens_per_s": tokens_per_s,
            "elapsed_s": elapsed,
        }
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return path


def _table(stdout: str) -> dict[str, list[str]]:
    """The terminal table's rows by their first cell."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0]:
            rows[cells[0]] = cells[1:]
    return rows


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AWS configuration at all: no region, no credentials, no config files."""
    for name in (
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))


def test_local_metrics_compare_with_no_aws_configuration(
    trnctl: Any, no_aws: None, tmp_path: Path
) -> None:
    a = _write(tmp_path / "a.jsonl", _header("trn2.48xlarge", 1), tokens_per_s=100.0)
    b = _write(tmp_path / "b.jsonl", _header(None, 1), tokens_per_s=50.0)

    plain = trnctl("compare", str(a), str(b))
    priced = trnctl("compare", str(a), str(b), "--price", "trn2.48xlarge=40")

    assert plain.exit_code == priced.exit_code == 0, plain.stderr + priced.stderr
    assert "2 runs, prices for no region: --price only" in plain.stdout
    assert _table(priced.stdout)["On-Demand $/instance-h"] == ["$40.00", "n/a"]
    # Rows that no run has a figure for are left out instead of shown as rows of n/a.
    assert "Capacity Block $/instance-h" not in _table(priced.stdout)
    assert "On-Demand $/instance-h" not in _table(plain.stdout)
    assert (
        f"{a}: Capacity Block: no AWS region to look up trn2.48xlarge in: pass --region or "
        "--price trn2.48xlarge:cb=USD" in priced.stdout
    )
    live = trnctl("compare", str(a), "--live")
    assert live.exit_code == 2
    assert "--live needs a region: pass --region or set AWS_REGION" in live.stderr


def test_labels_name_the_runs_and_bad_ones_are_refused(
    trnctl: Any, no_aws: None, tmp_path: Path
) -> None:
    a = _write(tmp_path / "a.jsonl", _header(None, 1), tokens_per_s=100.0)
    b = _write(tmp_path / "b.jsonl", _header(None, 1), tokens_per_s=50.0)

    run = trnctl("compare", str(a), str(b), "--label", f"{a}=Trainium", "--label", f"{b}=H100")

    assert run.exit_code == 0, run.stderr
    header = next(line for line in run.stdout.splitlines() if "┃" in line)
    assert [c.strip() for c in header.split("┃")[1:-1]] == ["", "Trainium", "H100"]
    assert "mean |loss - Trainium|" in _table(run.stdout)
    for labels, message in (
        ([f"{tmp_path}/c.jsonl=x"], "expected RUN=NAME where RUN is one of the runs given"),
        ([f"{a}="], "expected RUN=NAME"),
        ([f"{a}=x", f"{a}=y"], f"run {str(a)!r} is labelled twice"),
        ([f"{a}=same", f"{b}=same"], "two runs share the label 'same'"),
    ):
        flags = [item for label in labels for item in ("--label", label)]
        refused = trnctl("compare", str(a), str(b), *flags)
        assert refused.exit_code == 2, labels
        assert message in refused.stderr, refused.stderr


RATE = 40.0
TOKENS_PER_S = 500.0  # the whole job's, every run


@pytest.fixture
def node_runs(tmp_path: Path) -> list[Path]:
    """Runs of the same job on 1, 2 and 4 trn2.48xlarge nodes, each at the same tokens/s."""
    return [
        _write(
            tmp_path / f"n{nodes}.jsonl",
            _header("trn2.48xlarge", nodes, environment="trn-dev", job=f"n{nodes}"),
            tokens_per_s=TOKENS_PER_S,
        )
        for nodes in (1, 2, 4)
    ]


def test_runs_on_1_2_and_4_nodes_are_costed_with_their_node_count(
    trnctl: Any, no_aws: None, node_runs: list[Path]
) -> None:
    args = [str(p) for p in node_runs]
    table_run = trnctl("compare", *args, "--price", f"trn2.48xlarge={RATE}")
    json_run = trnctl("compare", *args, "--price", f"trn2.48xlarge={RATE}", "--json")
    assert table_run.exit_code == json_run.exit_code == 0, table_run.stderr + json_run.stderr
    table = _table(table_run.stdout)
    document = json.loads(json_run.stdout)

    # By hand: 10 records, 1,000 tokens each, the first at 30 s, then 2 s apart.
    run_s = 30.0 + 9 * 1000 / TOKENS_PER_S
    for i, nodes in enumerate((1, 2, 4)):
        figures = document["runs"][i]["figures"]
        per_million = RATE * nodes / 3600 / TOKENS_PER_S * 1e6  # $22.22 x nodes
        whole = RATE * nodes * run_s / 3600
        assert figures["instance"] == {"nodes": nodes, "type": "trn2.48xlarge"}
        assert figures["run_time_s"] == pytest.approx(run_s)
        assert figures["instance_hours"] == pytest.approx(nodes * run_s / 3600)
        assert figures["on_demand_usd_per_million_tokens"] == pytest.approx(per_million)
        assert figures["on_demand_usd_for_the_run"] == pytest.approx(whole)
        assert table["On-Demand $ per 1M tokens"][i] == f"${per_million:,.2f}"
        assert _formatted(whole, table["On-Demand $ for the run"][i])
        assert table["instance"][i] == f"{nodes} x trn2.48xlarge"
    assert [table["On-Demand $ per 1M tokens"][i] for i in range(3)] == [
        "$22.22",
        "$44.44",
        "$88.89",
    ]


def test_json_holds_every_figure_of_the_table(
    trnctl: Any, no_aws: None, node_runs: list[Path]
) -> None:
    args = [str(p) for p in node_runs]
    flags = ["--price", f"trn2.48xlarge={RATE}", "--to-tokens", "5000", "--to-loss", "4.1"]
    table = _table(trnctl("compare", *args, *flags).stdout)
    document = json.loads(trnctl("compare", *args, *flags, "--json").stdout)

    assert {row["name"]: row["cells"] for row in document["rows"]} == table
    for row in document["rows"]:
        for run, cell in zip(document["runs"], row["cells"], strict=True):
            value = run["figures"][row["key"]]
            assert _cell(value) == cell or _formatted(value, cell), (row["name"], value, cell)
    assert document["verdict"]["goal"] == {"kind": "loss", "value": 4.1}
    assert document["verdict"]["sentences"] == [
        line for line in trnctl("compare", *args, *flags).stdout.splitlines()[:2]
    ]


def _cell(value: Any) -> str:
    return "n/a" if value is None else str(value)


def _formatted(value: Any, cell: str) -> bool:
    """Whether ``cell`` shows ``value`` (a number the table rounds, or a structured value)."""
    if isinstance(value, dict):
        return all(str(v) in cell for v in value.values() if v is not None)
    if isinstance(value, str):
        return value[:10] in cell  # an ISO time shown to the minute
    text = re.sub(r"[$,%s]", "", cell)
    decimals = len(text.partition(".")[2])
    scale = 100 if cell.endswith("%") else 1
    if cell.startswith("$") and value < 1:  # four significant digits
        return bool(float(text) == pytest.approx(value * scale, rel=5e-4))
    return bool(abs(float(text) - value * scale) <= 0.5 * 10**-decimals + 1e-12)


def test_the_verdict_names_the_cheaper_run_and_how_much_longer_it_takes(
    trnctl: Any, no_aws: None, tmp_path: Path
) -> None:
    # A: 1 x trn2 at $40/h, 100 tokens/s; B: 1 x p5en at $60/h, 300 tokens/s. Both lose 0.2 a
    # step and reach loss 4.0 at step 5: A after 30 + 4 x 10 s = 70 s, B after 30 + 4 x 3.33 s.
    a = _write(tmp_path / "a.jsonl", _header("trn2.48xlarge", 1), tokens_per_s=100.0)
    b = _write(tmp_path / "b.jsonl", _header("p5en.48xlarge", 1), tokens_per_s=300.0)
    flags = ["--price", "trn2.48xlarge=40", "--price", "p5en.48xlarge=60", "--to-loss", "4.0"]
    labels = ["--label", f"{a}=trn", "--label", f"{b}=gpu"]

    run = trnctl("compare", str(a), str(b), *flags, *labels)

    assert run.exit_code == 0, run.stderr
    a_s, b_s = 70.0, 30.0 + 4 * 1000 / 300
    a_usd, b_usd = 40 * a_s / 3600, 60 * b_s / 3600
    assert run.stdout.splitlines()[0] == (
        f"On this job, trn reaches loss 4 in {a_s:.0f} s for ${a_usd:.4g} and gpu in "
        f"{b_s:.0f} s for ${b_usd:.4g}: gpu costs {(a_usd - b_usd) / a_usd * 100:.0f}% less and "
        f"is {(a_s - b_s) / a_s * 100:.0f}% faster."
    )
    never = trnctl("compare", str(a), str(b), *labels, "--to-loss", "0")
    assert never.stdout.splitlines()[0] == "On this job, trn and gpu did not reach loss 0."


def test_the_report_renders_in_chromium_with_its_verdict_and_every_plot(
    trnctl: Any, no_aws: None, tmp_path: Path
) -> None:
    a = _write(
        tmp_path / "a.jsonl",
        _header("trn2.48xlarge", 2, capacity="capacity-block"),
        tokens_per_s=200.0,
    )
    b = _write(tmp_path / "b.jsonl", _header("p5en.48xlarge", 1), tokens_per_s=300.0)
    out = tmp_path / "report.html"
    flags = ["--price", "trn2.48xlarge:cb=30", "--price", "p5en.48xlarge=60", "--out", str(out)]
    run = trnctl("compare", str(a), str(b), *flags, "--label", f"{a}=Trainium")
    assert run.exit_code == 0, run.stderr
    verdict = run.stdout.splitlines()[0]

    with chromium() as page:
        page.open(out.as_uri())
        shown = page.run(
            "return {verdict: document.querySelector('#verdict').innerText,"
            " title: document.title,"
            " images: [...document.images].map(i => ({alt: i.alt, complete: i.complete,"
            " width: i.naturalWidth, height: i.naturalHeight,"
            " shown: i.getBoundingClientRect().width}))};"
        )
        pdf = page.print_pdf()

    assert verdict.startswith("On this job, Trainium reaches 10,000 tokens in ")
    assert verdict in shown["verdict"]
    assert (
        "Trainium: Capacity Block $30.00/instance-h (--price trn2.48xlarge:cb (given))"
        in (shown["verdict"])
    )
    assert [i["alt"] for i in shown["images"]] == [
        "Loss vs tokens",
        "Tokens/s vs time",
        "Loss vs cost",
    ]
    for image in shown["images"]:
        assert image["complete"] and image["width"] > 300 and image["height"] > 200, image
        assert image["shown"] > 300, image
    assert pdf.startswith(b"%PDF-")
    assert len(re.findall(rb"/Type\s*/Page\b", pdf)) >= 1


def _classifier(path: Path, header: dict[str, Any], examples_per_s: float, accuracy: float) -> Path:
    """A classification run's metrics file: :func:`_write`'s train records with
    ``examples_per_s`` (10 examples of 100 tokens a step) and two eval records, the later one
    at ``accuracy``."""
    _write(path, header, tokens_per_s=100 * examples_per_s)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for record in lines[1:]:
        record["examples_per_s"] = examples_per_s
    evals = [
        {"kind": "eval", "step": step, "eval_loss": loss, "eval_accuracy": acc,
         "eval_macro_f1": acc - 0.05, "eval_micro_f1": acc, "eval_examples": 40,
         "per_class": {}, "confusion": [[1]]}
        for step, loss, acc in ((5, 0.9, accuracy - 0.2), (10, 0.4, accuracy))
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in [*lines, *evals]))
    return path


def test_classification_runs_compare_examples_per_s_and_their_metric(
    trnctl: Any, no_aws: None, tmp_path: Path
) -> None:
    a = _classifier(tmp_path / "a.jsonl", _header("trn2.48xlarge", 1), 40.0, 0.95)
    b = _classifier(tmp_path / "b.jsonl", _header("p5en.48xlarge", 1), 80.0, 0.9)
    out = tmp_path / "report.html"
    flags = ["--price", "trn2.48xlarge=36", "--price", "p5en.48xlarge=72", "--out", str(out)]

    run = trnctl("compare", str(a), str(b), *flags)
    document = json.loads(trnctl("compare", str(a), str(b), *flags, "--json").stdout)

    assert run.exit_code == 0, run.stderr
    table = _table(run.stdout)
    assert table["steady examples/s"] == ["40.0", "80.0"]
    assert table["steady tokens/s"] == ["4,000.0", "8,000.0"]
    assert table["last eval at step"] == ["10", "10"]
    assert table["eval accuracy"] == ["95.00%", "90.00%"]
    assert table["eval macro F1"] == ["0.9000", "0.8500"]
    assert table["eval loss"] == ["0.4000", "0.4000"]
    # $36/h over 40 examples/s: 36 / 3600 / 40 * 1e6 = $250 per 1M examples; $72/h, 80/s: $250.
    assert table["On-Demand $ per 1M examples"] == ["$250.00", "$250.00"]
    assert "eval exact match" not in table  # no run is multi-label
    figures = [r["figures"] for r in document["runs"]]
    assert [f["steady_examples_per_s"] for f in figures] == [40.0, 80.0]
    assert [f["eval_accuracy"] for f in figures] == [0.95, 0.9]
    assert {row["name"]: row["cells"] for row in document["rows"]} == table
    page = out.read_text()
    for name in ("steady examples/s", "eval accuracy", "eval macro F1", "$ per 1M examples"):
        assert name in page
    assert "<td>95.00%</td><td>90.00%</td>" in page


def test_recommendation_runs_compare_examples_per_s_and_their_ranking_figures(
    trnctl: Any, no_aws: None, tmp_path: Path
) -> None:
    """A two-tower run's records (trainer.recommend): examples/s (an interaction a "token"),
    and its last eval's recall@10, NDCG@10 and MRR."""
    a = _write(tmp_path / "a.jsonl", _header("trn2.48xlarge", 1), tokens_per_s=500.0)
    lines = [json.loads(line) for line in a.read_text().splitlines()]
    for record in lines[1:]:
        record["examples_per_s"] = 500.0
    last = {"kind": "eval", "step": 10, "eval_loss": 3.5, "eval_recall@10": 0.458}
    last.update({"eval_ndcg@10": 0.2165, "eval_mrr": 0.1767, "eval_examples": 360})
    a.write_text("".join(json.dumps(r) + "\n" for r in [*lines, last]))

    table = _table(trnctl("compare", str(a), "--price", "trn2.48xlarge=36").stdout)

    assert table["steady examples/s"] == ["500.0"]
    assert table["eval recall@10"] == ["45.80%"]
    assert table["eval NDCG@10"] == ["0.2165"]
    assert table["eval MRR"] == ["0.1767"]
    # $36/h over 500 interactions/s: 36 / 3600 / 500 * 1e6 = $20 per 1M.
    assert table["On-Demand $ per 1M examples"] == ["$20.00"]
    assert "eval accuracy" not in table


def test_a_causal_lm_run_shows_no_classification_rows(
    trnctl: Any, no_aws: None, tmp_path: Path
) -> None:
    a = _write(tmp_path / "a.jsonl", _header(None, 1), tokens_per_s=100.0)

    table = _table(trnctl("compare", str(a)).stdout)

    assert "steady tokens/s" in table
    assert not {"steady examples/s", "eval accuracy", "last eval at step"} & set(table)
