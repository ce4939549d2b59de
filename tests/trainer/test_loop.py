"""The loop end to end on the tiny preset: loss, resume after kill -9, SIGTERM, compiled graphs."""

from __future__ import annotations

import gc
import json
import shutil
import signal
import subprocess
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import warm
from trainer import cli, device, metrics, optim, parallel, report
from trainer.checkpoint import Checkpointer, LocalStore
from trainer.config import TrainConfig
from trainer.loop import train

RUN = (
    "run",
    "--preset",
    "tiny",
    "--device",
    "cpu",
    "--compile",
    "none",
    "--log-every",
    "1",
    "--seed",
    "3",
)


def test_a_cpu_run_measures_its_mfu_against_the_one_cpu_peak(
    corpus_dir: Path, tmp_path: Path
) -> None:
    """Without --peak-flops the run header's peak is the CPU peak that `make bench` uses too
    (trainer.device.cpu_peak_flops), and each record's MFU is over it."""
    out = tmp_path / "m.jsonl"
    cfg = TrainConfig(
        preset="tiny",
        device="cpu",
        compile="none",
        data=str(corpus_dir),
        max_steps=2,
        log_every=1,
        metrics=str(out),
    )
    train(cfg)
    (header,) = metrics.headers(out)
    assert header["peak_flops_per_rank"] == device.cpu_peak_flops()
    for r in metrics.read(out):
        achieved = r["tokens_per_s"] * header["flops_per_token"]
        assert r["mfu"] == pytest.approx(achieved / device.cpu_peak_flops(), rel=1e-12)


def test_loss_falls(corpus_dir: Path, tmp_path: Path) -> None:
    cfg = TrainConfig(
        preset="tiny",
        device="cpu",
        compile="none",
        data=str(corpus_dir),
        max_steps=40,
        log_every=5,
        metrics=str(tmp_path / "m.jsonl"),
        peak_flops=1e11,
    )
    result = train(cfg)
    records = metrics.read(tmp_path / "m.jsonl")
    assert [r["step"] for r in records] == list(range(5, 45, 5))
    assert records[-1]["loss"] < 0.7 * records[0]["loss"]
    assert result.last_loss == records[-1]["loss"] and not result.preempted
    for key in ("loss", "lr", "tokens_per_s", "mfu", "step_time_s", "grad_norm"):
        assert records[-1][key] > 0
    # What the MFU is measured against: the CPU trains in FP32 against an FP32 matmul peak.
    assert {r["precision"] for r in records} == {"fp32"}
    assert report.title(tmp_path / "m.jsonl", records) == "m.jsonl (fp32)"


def test_process_group_comes_before_the_device(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TorchNeuron's order: the instance is checked, the group initialised, then the device
    bound (for every backend, so that no backend's order is special)."""
    calls: list[str] = []
    check, start = device.Backend.check_instance, device.Backend.start

    def checked(cls: type[device.Backend], instance_type: str) -> None:
        calls.append("check instance")
        check(instance_type)

    def started(self: device.Backend) -> device.Backend:
        calls.append("bind device")
        return start(self)

    monkeypatch.setattr(device.Backend, "check_instance", classmethod(checked))
    monkeypatch.setattr(device.Backend, "start", started)
    monkeypatch.setattr(parallel, "init", lambda ranks, backend: calls.append(f"init {backend}"))
    train(TrainConfig(preset="tiny", device="cpu", data=str(corpus_dir), max_steps=1))
    assert calls == ["check instance", "init gloo", "bind device"]


def _wait_for_step(metrics_file: Path, proc: warm.Started, step: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if metrics_file.exists():
            lines = metrics_file.read_text().splitlines()
            if lines and json.loads(lines[-1]).get("step", -1) >= step:
                return
        assert proc.poll() is None, "the trainer ended before it could be signalled"
        time.sleep(0.01)
    raise AssertionError(f"step {step} never logged")


def _final_state(checkpoint_dir: Path, step: int) -> dict[str, torch.Tensor]:
    state = Checkpointer(LocalStore(checkpoint_dir)).load(f"step_{step:08d}")
    assert state["step"] == step
    return state["model"]


@pytest.fixture(scope="module")
def uninterrupted(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference run, in this process: the killed and resumed runs are `trn-train`
    processes, and training is deterministic wherever it runs (one thread each)."""
    out = tmp_path_factory.mktemp("reference")
    argv = [*RUN, "--data", str(corpus_dir), "--max-steps", "40", "--checkpoint-every", "5"]
    argv += ["--checkpoint-dir", str(out / "ck"), "--metrics", str(out / "m.jsonl")]
    assert cli.main(argv) == 0
    return out


@pytest.mark.slow
def test_kill_9_then_resume_is_bit_identical(
    corpus_dir: Path,
    tmp_path: Path,
    uninterrupted: Path,
    launch: Callable[..., warm.Started],
    run_trainer: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    args = [
        *RUN,
        "--data",
        str(corpus_dir),
        "--max-steps",
        "40",
        "--checkpoint-every",
        "5",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--metrics",
        str(tmp_path / "m.jsonl"),
    ]
    proc = launch(*args)
    _wait_for_step(tmp_path / "m.jsonl", proc, 12)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert max(metrics.read(tmp_path / "m.jsonl"), key=lambda r: r["step"])["step"] < 40
    logged_before = len((tmp_path / "m.jsonl").read_text().splitlines())
    checkpoint = max(int(p.name.removeprefix("step_")) for p in (tmp_path / "ck").glob("step_*"))
    assert 10 <= checkpoint < 40

    resumed = run_trainer(*args)
    assert resumed.returncode == 0, resumed.stderr
    # Training is deterministic, so a run that retrained from step 0 would match the reference
    # too: the resumed run must start after the newest checkpoint and train only the rest.
    lines = (tmp_path / "m.jsonl").read_text().splitlines()[logged_before:]
    header, *steps = [json.loads(line) for line in lines]
    assert header["kind"] == "run"  # each start of a run opens with its own header
    assert [record["step"] for record in steps] == list(range(checkpoint + 1, 41))
    expected = {r["step"]: r["loss"] for r in metrics.read(uninterrupted / "m.jsonl")}
    got = {r["step"]: r["loss"] for r in metrics.read(tmp_path / "m.jsonl")}
    assert got == expected  # every step's loss, bit for bit (JSON floats round-trip exactly)
    final, reference = _final_state(tmp_path / "ck", 40), _final_state(uninterrupted / "ck", 40)
    assert all(torch.equal(final[k], reference[k]) for k in reference)


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_and_exits_0(
    corpus_dir: Path, tmp_path: Path, launch: Callable[..., warm.Started]
) -> None:
    args = [
        *RUN,
        "--data",
        str(corpus_dir),
        "--max-steps",
        "100000",
        "--checkpoint-every",
        "1000",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--metrics",
        str(tmp_path / "m.jsonl"),
    ]
    proc = launch(*args)
    _wait_for_step(tmp_path / "m.jsonl", proc, 3)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    summary = json.loads(stderr.strip().splitlines()[-1])
    assert summary["preempted"] is True
    step = summary["steps_done"]
    assert 3 <= step < 1000
    assert summary["checkpoint"] == f"step_{step:08d}"
    assert (tmp_path / "ck" / f"step_{step:08d}" / "meta.json").is_file()


@pytest.mark.slow
def test_compiled_path_one_graph_no_breaks_no_recompiles(corpus_dir: Path, tmp_path: Path) -> None:
    """aot_eager runs the same Dynamo front end as the Neuron backend. fail_on_recompile turns any
    recompile after the first step into an error; the checkpoint saves in between must not
    disturb the guards either."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cfg = TrainConfig(
        preset="tiny",
        device="cpu",
        compile="aot_eager",
        data=str(corpus_dir),
        max_steps=6,
        log_every=2,
        grad_accum=2,
        fail_on_recompile=True,
        peak_flops=1e11,
        checkpoint_dir=str(tmp_path / "ck"),
        checkpoint_every=3,
    )
    try:
        result = train(cfg)
        assert result.steps_done == 6
        assert counters["stats"]["unique_graphs"] == 1  # one graph over 12 forward passes
        assert counters["aot_autograd"]["total"] == 1  # one forward+backward compile
        assert not counters["graph_break"]
    finally:
        torch._dynamo.reset()


def test_resume_reads_the_checkpoint_and_trains_without_it(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On resume DCP reads the state tensor by tensor into the model and optimizer, and drops
    what it read: no loaded tensor is alive at any step. A staging directory left by a save killed
    midway is removed when the run starts."""
    cfg = TrainConfig(
        preset="tiny",
        device="cpu",
        compile="none",
        data=str(corpus_dir),
        max_steps=4,
        checkpoint_every=2,
        checkpoint_dir=str(tmp_path / "ck"),
    )
    train(cfg)
    # As if stopped after step 2: the same run (same schedule) resumes there.
    shutil.rmtree(tmp_path / "ck" / "step_00000004")
    stale = tmp_path / "ck" / ".staging-killed"
    stale.mkdir()
    (stale / "state.pt").write_bytes(b"\0" * 4096)

    loaded: list[weakref.ref[torch.Tensor]] = []
    real_load = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        value = real_load(*args, **kwargs)
        if isinstance(value, torch.Tensor):  # not the optimizer's hyperparameters
            loaded.append(weakref.ref(value))
        return value

    alive: list[bool] = []
    real_set_lr = optim.set_lr

    def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:  # once per step
        gc.collect()
        alive.append(any(ref() is not None for ref in loaded))
        real_set_lr(optimizer, lr)

    monkeypatch.setattr(torch, "load", load)
    monkeypatch.setattr(optim, "set_lr", set_lr)
    result = train(cfg)

    assert result.steps_done == 4
    assert loaded
    assert alive == [False, False]
    assert not stale.exists()
