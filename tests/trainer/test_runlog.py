"""trainer.runlog, the metrics a `-- COMMAND` job's own code writes for `trnctl compare`: nothing
without TRN_METRICS_FILE or off rank 0; the trainer's header and train records with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer import runlog
from trnctl import compare

HEADER = {
    "model": "mine",
    "device": "cuda",
    "precision": "bf16 autocast",
    "global_batch_tokens": 4096,
    "seq_len": 512,
    "flops_per_token": 6.0e6,
}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_nothing_is_written_outside_a_job_or_off_rank_0(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"

    assert runlog.start(**HEADER, env={}) is None  # type: ignore[arg-type]
    env = {"TRN_METRICS_FILE": str(path), "RANK": "1", "WORLD_SIZE": "2"}
    assert runlog.start(**HEADER, env=env) is None  # type: ignore[arg-type]
    assert not path.exists()


def test_the_records_are_the_trainers_and_compare_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "fsx" / "checkpoints" / "run-p5" / "metrics.jsonl"
    env = {
        "TRN_METRICS_FILE": str(path),
        "RANK": "0",
        "WORLD_SIZE": "16",
        "LOCAL_WORLD_SIZE": "8",
        "TRN_GPU_INSTANCE_TYPE": "p5.48xlarge",
    }
    started = runlog.start(**HEADER, env=env)  # type: ignore[arg-type]
    assert started is not None
    started.close()
    # The header start() wrote, then records timed by a clock the test moves.
    clock = Clock()
    timed = tmp_path / "timed.jsonl"
    log = runlog.RunLog(str(timed), _header_of(path), started=clock.now, clock=clock)
    for step in (10, 20, 30):
        clock.now += 2.0
        log.step(step, 3.0 - step / 100, step * 4096)
    log.close()

    run = compare.parse(timed.read_text(), "run-p5")
    assert run.restarts == 0
    assert run.header["instance_type"] == "p5.48xlarge"
    assert (run.header["nodes"], run.header["world_size"]) == (2, 16)
    assert run.header["peak_flops_per_rank"] == 989.5e12  # H100 SXM, dense BF16
    assert [r["tokens_per_s"] for r in run.records] == [10 * 4096 / 2.0] * 3
    assert [r["elapsed_s"] for r in run.records] == [2.0, 4.0, 6.0]
    assert compare.target_of(run) == "gpu"
    assert compare.mfu(run, 20480.0) == pytest.approx(20480.0 / 16 * 6.0e6 / 989.5e12)


def _header_of(path: Path) -> dict[str, object]:
    header: dict[str, object] = json.loads(path.read_text().splitlines()[0])
    return header


def test_a_resumed_start_counts_only_its_own_tokens(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "m.jsonl"
    log = runlog.RunLog(str(path), {"kind": "run"}, start_tokens=1000, started=100.0, clock=clock)
    clock.now = 101.0

    log.step(3, 2.0, 1500)

    record = json.loads(path.read_text().splitlines()[1])
    assert record == {
        "step": 3,
        "loss": 2.0,
        "tokens": 1500,
        "tokens_per_s": 500.0,
        "elapsed_s": 1.0,
    }


def test_tokens_that_go_back_are_refused(tmp_path: Path) -> None:
    log = runlog.RunLog(str(tmp_path / "m.jsonl"), {"kind": "run"}, start_tokens=1000)

    with pytest.raises(ValueError, match=r"^tokens 10 is below the previous record's 1000: pass"):
        log.step(1, 2.0, 10)


@pytest.mark.parametrize(
    ("instance_type", "env", "peak"),
    [
        ("p5.48xlarge", {}, 989.5e12),
        # trn3: 671 TFLOPS BF16 per chip of 8 cores, a rank per logical core of 2 (default).
        ("trn3.48xlarge", {}, 671e12 * 2 / 8),
        ("trn3.48xlarge", {"NEURON_LOGICAL_NC_CONFIG": "1"}, 671e12 / 8),
        ("m7i.large", {}, None),
    ],
)
def test_the_peak_per_rank_is_the_catalogs(
    instance_type: str, env: dict[str, str], peak: float | None
) -> None:
    assert runlog.catalog_peak_flops_per_rank(instance_type, env) == peak
