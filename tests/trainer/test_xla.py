"""The legacy PyTorch/XLA backend (the trn1 stack) on PyTorch/XLA's CPU device.

Needs torch_xla 2.9 (a 7 GB environment): ``make test-xla`` installs it in ``.tools/xla`` and runs
this file with ``PJRT_DEVICE=CPU``; elsewhere it is skipped. On the CPU device each process is its
own XLA world (its collectives reach no other process), so the multi-rank test checks how the
gradients are reduced, not what the reduction sums.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainer import device, metrics, validate_node
from trainer.config import PRESETS, TrainConfig
from trainer.loop import train
from trainer.model import GPT

pytestmark = [
    pytest.mark.xla,
    # `make test-xla` sets TRN_REQUIRE_XLA, so that a broken install fails there, never skips.
    pytest.mark.skipif(
        importlib.util.find_spec("torch_xla") is None and not os.environ.get("TRN_REQUIRE_XLA"),
        reason="torch_xla is not installed",
    ),
]


@pytest.fixture(autouse=True)
def _xla_on_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PJRT_DEVICE", os.environ.get("PJRT_DEVICE", "CPU"))
    # Set, then removed: the backend writes the flags, and the undo removes what it wrote.
    monkeypatch.setenv("NEURON_CC_FLAGS", "")
    monkeypatch.delenv("NEURON_CC_FLAGS")
    yield


def _backend() -> device.XlaBackend:
    backend = device.resolve("xla", compile_backend="none").start()
    assert isinstance(backend, device.XlaBackend)
    return backend


def test_tiny_trains_on_xla_without_recompiling(corpus_dir: Path, tmp_path: Path) -> None:
    import torch_xla.debug.metrics as xla_metrics

    cfg = TrainConfig(
        preset="tiny",
        device="xla",
        data=str(corpus_dir),
        max_steps=2,
        log_every=1,
        metrics=str(tmp_path / "m.jsonl"),
    )
    train(cfg)
    compiles = xla_metrics.metric_data("CompileTime")[0]
    train(dataclasses.replace(cfg, max_steps=6, metrics=str(tmp_path / "m2.jsonl")))
    # Steps 3-6 reuse the graphs of steps 1-2: the step graph is traced once, not per step.
    assert xla_metrics.metric_data("CompileTime")[0] == compiles
    records = metrics.read(tmp_path / "m2.jsonl")
    assert records[-1]["loss"] < records[0]["loss"]
    # Off Neuron no compiler casts and no peak is known.
    assert {r["precision"] for r in records} == {"fp32"}
    assert {r["mfu"] for r in records} == {None}


TWO_RANKS = """
import json, sys
from pathlib import Path
import torch
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl

seen = {"reduce_gradients": 0, "ddp": 0, "loaders": 0}

def counted(name, real):
    def call(*args, **kwargs):
        seen[name] += 1
        return real(*args, **kwargs)
    return call

xm.reduce_gradients = counted("reduce_gradients", xm.reduce_gradients)
ddp_init = torch.nn.parallel.DistributedDataParallel.__init__
torch.nn.parallel.DistributedDataParallel.__init__ = counted("ddp", ddp_init)
pl.MpDeviceLoader = type("Counted", (pl.MpDeviceLoader,), {
    "__init__": counted("loaders", pl.MpDeviceLoader.__init__)})

from trainer import parallel
from trainer.config import TrainConfig
from trainer.loop import train

result = train(TrainConfig(**json.loads(sys.argv[1])))
seen["steps"] = result.steps_done
Path(sys.argv[2], f"rank-{parallel.ranks_from_env().rank}.json").write_text(json.dumps(seen))
"""


def test_two_ranks_reduce_gradients_once_per_step_without_ddp(
    corpus_dir: Path, tmp_path: Path, trainer_env: dict[str, str]
) -> None:
    """Under torchrun on the xla process group: the batches come through MpDeviceLoader and the
    gradients are reduced once per step by ``xm.reduce_gradients``; DDP, which would reduce them
    a second time during backward, is never built."""
    (tmp_path / "train.py").write_text(TWO_RANKS)
    cfg = {
        "preset": "tiny",
        "device": "xla",
        "data": str(corpus_dir),
        "max_steps": 3,
        "micro_batch": 4,
        "grad_accum": 2,
        "log_every": 100,
        "parallel": "ddp",
    }
    done = subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
            *("--nproc-per-node", "2", str(tmp_path / "train.py")),
            *(json.dumps(cfg), str(tmp_path)),
        ],
        env={**trainer_env, "PJRT_DEVICE": "CPU"},
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert seen == {"steps": 3, "reduce_gradients": 3, "ddp": 0, "loaders": 1}


def test_the_head_is_tied_again_after_the_move() -> None:
    backend = _backend()
    moved = GPT(PRESETS["tiny"].model).to(backend.device)
    assert moved.head.weight is not moved.tok.weight  # what the move does on its own
    model = backend.prepare_model(GPT(PRESETS["tiny"].model))
    assert isinstance(model, GPT)
    assert model.head.weight is model.tok.weight
    assert model.head.weight.device.type == "xla"


def test_the_backend_asks_the_compiler_for_bf16_matmuls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Started outside the image's launcher, the backend still sets --auto-cast=matmult, since
    neuronx-cc's default (none since Neuron 2.27) keeps FP32 matmuls in FP32; a job's own
    --auto-cast is left alone."""
    monkeypatch.setenv("NEURON_CC_FLAGS", "--model-type transformer")
    _backend()
    assert os.environ["NEURON_CC_FLAGS"] == "--model-type transformer --auto-cast=matmult"
    monkeypatch.setenv("NEURON_CC_FLAGS", "--auto-cast none")
    _backend()
    assert os.environ["NEURON_CC_FLAGS"] == "--auto-cast none"


def test_peak_and_precision_on_neuron_and_off_it(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _backend()
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    assert backend.peak_flops(instance_type="trn1.32xlarge") is None  # the CPU device
    assert backend.precision() == "fp32"
    monkeypatch.setattr(backend.xm, "xla_device_hw", lambda d: "NEURON")
    # A Trainium chip: 190 dense BF16 TFLOPS over 2 NeuronCores, one rank each.
    assert backend.peak_flops(instance_type="trn1.32xlarge") == pytest.approx(95e12)
    assert backend.precision() == "bf16 matmult auto-cast"  # set by the backend (see above)
    monkeypatch.setenv("NEURON_CC_FLAGS", "--auto-cast=none")
    assert backend.precision() == "fp32"


def test_fsdp_is_refused_before_anything_runs(corpus_dir: Path) -> None:
    cfg = TrainConfig(preset="tiny", device="xla", data=str(corpus_dir), parallel="fsdp")
    with pytest.raises(ValueError, match=r"parallel 'fsdp' is not available on device 'xla'"):
        train(cfg)


def test_validate_node_runs_on_the_xla_group_compiling_outside_its_timed_windows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node check on the xla process group: its graphs are built in the warm-up round, none
    inside a timed window. (With one rank per XLA world on this CPU device the all-reduce itself
    is elided, so where the transfer runs is checked on the CPU backend, in
    test_validate_node.py.)"""
    import torch_xla.debug.metrics as xla_metrics

    compiles: list[int] = []
    real_clock = validate_node.time.perf_counter

    def clock() -> float:
        compiles.append(xla_metrics.metric_data("CompileTime")[0] or 0)
        return real_clock()

    monkeypatch.setattr(validate_node.time, "perf_counter", clock)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    result = validate_node.allreduce(1, 3, "xla")

    assert result["allreduce_ok"] is True and result["backend"] == "xla"
    # Clock reads: the warm-up round's start, then a start and an end for each timed round.
    assert len(compiles) == 1 + 2 * 3
    assert compiles[0] < compiles[1]  # the warm-up round compiled
    assert len(set(compiles[1:])) == 1


def test_auto_picks_xla_in_the_xla_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_STACK", "xla")
    assert device.select("auto") is device.XlaBackend
