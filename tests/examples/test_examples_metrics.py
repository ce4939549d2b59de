"""The examples write the metrics `trnctl compare` reads where a job sets TRN_METRICS_FILE (the
platform's trainer.runlog), on CPU here; and compare reads them, figures checked by hand."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from trnctl import compare
from trnctl.cli import app

ROOT = Path(__file__).resolve().parents[2]
PLAIN = ROOT / "examples" / "plain_pytorch" / "train.py"
HF = ROOT / "examples" / "hf_trainer" / "train.py"
TINY = ["--device", "cpu", "--batch-size", "4", "--seq-len", "32", "--log-every", "5"]


def run_example(script: Path, metrics: Path, cwd: Path, *args: str, **extra: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    for name in ("TRN_CHECKPOINT_DIR", "TRN_INSTANCE_TYPE", "TRN_GPU_INSTANCE_TYPE"):
        env.pop(name, None)
    env.update(OMP_NUM_THREADS="1", TRN_METRICS_FILE=str(metrics), **extra)
    done = subprocess.run(
        [sys.executable, str(script), *TINY, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def test_compare_reads_the_plain_examples_metrics(tmp_path: Path) -> None:
    metrics = tmp_path / "fsx" / "checkpoints" / "run-plain" / "metrics.jsonl"
    # Labelled as a p5 node the way the cuda-torch runtime labels its pods.
    run_example(PLAIN, metrics, tmp_path, "--steps", "20", TRN_GPU_INSTANCE_TYPE="p5.48xlarge")

    run = compare.parse(metrics.read_text(), "run-plain")

    header = run.header
    assert header["instance_type"] == "p5.48xlarge"
    assert (header["device"], header["precision"], header["model"]) == ("cpu", "fp32", "tiny-lm")
    assert (header["nodes"], header["world_size"]) == (1, 1)
    assert header["global_batch_tokens"] == 4 * 32
    assert header["peak_flops_per_rank"] == 989.5e12  # the catalog's, for the labelled type
    assert [r["step"] for r in run.records] == [5, 10, 15, 20]
    assert [r["tokens"] for r in run.records] == [s * 4 * 32 for s in (5, 10, 15, 20)]
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


def test_compare_puts_both_examples_side_by_side(tmp_path: Path) -> None:
    plain, hf = tmp_path / "plain.jsonl", tmp_path / "hf.jsonl"
    run_example(PLAIN, plain, tmp_path, "--steps", "15")
    run_example(HF, hf, tmp_path, "--max-steps", "15", "--output-dir", str(tmp_path / "hf"))
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
    hf_run = compare.parse(hf.read_text(), "hf")
    assert hf_run.header["model"] == "tiny-llama"
    assert [r["step"] for r in hf_run.records] == [5, 10, 15]
    assert [r["tokens"] for r in hf_run.records] == [s * 4 * 32 for s in (5, 10, 15)]
    assert "local" in result.output  # neither run names an instance type: local runs
    assert "Loss vs tokens" in report.read_text()


# Runs a script as __main__ where the platform's trainer package cannot be imported.
WITHOUT_TRAINER = (
    "import runpy, sys; sys.modules['trainer'] = None; script = sys.argv[1]; "
    "sys.argv = sys.argv[1:]; runpy.run_path(script, run_name='__main__')"
)


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
        done = subprocess.run(
            [sys.executable, *argv, *TINY, "--steps", "5"],
            env={**env, **extra},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert '"step": 5' in done.stdout
    assert list(tmp_path.iterdir()) == []
