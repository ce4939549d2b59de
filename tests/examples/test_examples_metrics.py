"""The examples write the metrics `trnctl compare` reads where a job sets TRN_METRICS_FILE (the
platform's trainer.runlog), on CPU here; and compare reads them, figures checked by hand."""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import pytest
from example_runs import SHARED, STEPS, ExampleRun
from typer.testing import CliRunner

from tests import warm
from trnctl import compare
from trnctl.cli import app

ROOT = Path(__file__).resolve().parents[2]
PLAIN = ROOT / "examples" / "plain_pytorch" / "train.py"
TINY = ["--device", "cpu", "--batch-size", "4", "--seq-len", "32", "--log-every", "5"]
EVERY_5 = list(range(5, STEPS + 1, 5))  # the logged steps of the shared runs


@pytest.mark.slow
@pytest.mark.xdist_group(SHARED)
def test_compare_reads_the_plain_examples_metrics(plain_run: ExampleRun) -> None:
    """The shared plain run (tests/examples/conftest.py), labelled as a p5 node the way the
    cuda-torch runtime labels its pods."""
    run = compare.parse(plain_run.metrics.read_text(), "run-plain")

    header = run.header
    assert header["instance_type"] == "p5.48xlarge"
    assert (header["device"], header["precision"], header["model"]) == ("cpu", "fp32", "tiny-lm")
    assert (header["nodes"], header["world_size"]) == (1, 1)
    assert header["global_batch_tokens"] == 4 * 32
    assert header["peak_flops_per_rank"] == 989.5e12  # the catalog's, for the labelled type
    assert [r["step"] for r in run.records] == EVERY_5
    assert [r["tokens"] for r in run.records] == [s * 4 * 32 for s in EVERY_5]
    # tokens/s per interval: its tokens over the time between its record and the previous one.
    times = [0.0] + [r["time_s"] for r in run.records]
    for record, before, previous_tokens in zip(
        run.records, times, [0] + [r["tokens"] for r in run.records], strict=False
    ):
        expected = (record["tokens"] - previous_tokens) / (record["time_s"] - before)
        assert abs(record["tokens_per_s"] - expected) <= 1e-6 * expected
    steady = statistics.median(r["tokens_per_s"] for r in run.records[1:])
    assert compare.steady_tokens_per_s(run, None) == steady
    assert compare.mfu(run, steady) == steady * header["flops_per_token"] / 989.5e12
    assert compare.target_of(run) == "gpu"


@pytest.mark.slow
@pytest.mark.xdist_group(SHARED)
def test_compare_puts_both_examples_side_by_side(
    plain_run: ExampleRun, hf_run: ExampleRun, tmp_path: Path
) -> None:
    plain, hf = plain_run.metrics, hf_run.metrics
    report = tmp_path / "report.html"

    result = CliRunner().invoke(
        app,
        [
            *["compare", str(plain), str(hf), "--out", str(report)],
            *["--price", "p5.48xlarge=55.04", "--region", "us-east-2"],
        ],
        catch_exceptions=False,
    )

    assert result.exit_code == 0, result.output
    parsed = compare.parse(hf.read_text(), "hf")
    assert parsed.header["model"] == "tiny-llama"
    assert [r["step"] for r in parsed.records] == EVERY_5
    assert [r["tokens"] for r in parsed.records] == [s * 4 * 32 for s in EVERY_5]
    assert "local" in result.output  # the Hugging Face run names no instance type: a local run
    assert "Loss vs tokens" in report.read_text()


# Runs a script as __main__ where the platform's trainer package cannot be imported.
WITHOUT_TRAINER = (
    "import runpy, sys; sys.modules['trainer'] = None; script = sys.argv[1]; "
    "sys.argv = sys.argv[1:]; runpy.run_path(script, run_name='__main__')"
)


@pytest.mark.slow
def test_off_the_platform_the_examples_run_unchanged(tmp_path: Path) -> None:
    """Without TRN_METRICS_FILE, or without the platform's trainer package (an image of your
    own, a laptop), the examples train as before and write no metrics."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRN_METRICS_FILE", "RANK")}
    env["OMP_NUM_THREADS"] = "1"
    metrics = tmp_path / "metrics.jsonl"
    for argv, extra in (
        ([str(PLAIN)], {}),
        (["-c", WITHOUT_TRAINER, str(PLAIN)], {"TRN_METRICS_FILE": str(metrics)}),
    ):
        done = warm.run(
            [sys.executable, *argv, *TINY, "--steps", "5"],
            env={**env, **extra},
            cwd=tmp_path,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert '"step": 5' in done.stdout
    assert list(tmp_path.iterdir()) == []
