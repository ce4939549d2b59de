"""Choosing the device backend: what ``auto`` picks, and what a backend refuses."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from trainer import device, stacks
from trainer.config import PRESETS
from trainer.model import GPT


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A machine with neither TorchNeuron nor CUDA, torch_xla installed, and an empty /dev."""
    monkeypatch.setattr(device, "_installed", lambda module: module == "torch_xla")
    monkeypatch.setattr(device.NeuronBackend, "available", classmethod(lambda cls: False))
    monkeypatch.setattr(device.CudaBackend, "available", classmethod(lambda cls: False))
    monkeypatch.delenv("NEURON_STACK", raising=False)
    monkeypatch.setattr(device, "DEV_DIR", tmp_path)
    return tmp_path


def test_auto_picks_xla_in_the_xla_image(machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_STACK", "xla")
    assert device.select("auto") is device.XlaBackend


def test_auto_picks_xla_where_neuron_devices_show(machine: Path) -> None:
    (machine / "neuron0").touch()
    assert device.select("auto") is device.XlaBackend


def test_auto_leaves_torch_xla_alone_without_neuron(machine: Path) -> None:
    """torch_xla also runs on CPU (PJRT_DEVICE=CPU); there it is only used when named."""
    (machine / "nvme0").touch()
    assert device.select("auto") is device.Backend
    assert device.select("xla") is device.XlaBackend


def test_a_native_image_is_not_taken_for_xla(
    machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURON_STACK", "native")
    (machine / "neuron0").touch()
    assert device.select("auto") is device.Backend  # NeuronBackend is unavailable in this fake


def test_a_named_backend_that_is_missing_is_an_error(machine: Path) -> None:
    with pytest.raises(ValueError, match=r"device 'neuron' is not available on this machine"):
        device.select("neuron")
    with pytest.raises(ValueError, match=r"device 'tpu' is unknown; known: auto, neuron"):
        device.select("tpu")


def test_the_device_is_bound_by_start_not_by_resolve() -> None:
    backend = device.resolve("cpu")
    assert not hasattr(backend, "device")  # nothing bound before the process group exists
    assert backend.start().device == device.torch.device("cpu")


def test_torchneuron_refuses_trainium1_naming_the_xla_stack() -> None:
    with pytest.raises(ValueError, match=r"trn1\.32xlarge is Trainium1.*NEURON_STACK=xla"):
        device.NeuronBackend.check_instance("trn1.32xlarge")
    device.NeuronBackend.check_instance("trn2.48xlarge")
    device.NeuronBackend.check_instance("trn3.48xlarge")
    device.XlaBackend.check_instance("trn1.32xlarge")


def test_each_stack_names_a_backend() -> None:
    assert {s.device for s in stacks.STACKS.values()} <= set(device.BACKENDS)


# Per-chip dense BF16 TFLOPS and physical NeuronCores per chip, from the Neuron architecture
# pages (Trainium, Trainium2, Trainium3), written out here rather than read from the catalog.
TRN1, TRN2, TRN3 = (190.0, 2), (667.0, 8), (671.0, 8)


@pytest.mark.parametrize(
    ("instance_type", "lnc_env", "chip", "lnc"),
    [
        ("trn1.32xlarge", None, TRN1, 1),  # Trn1: one physical core per rank
        ("trn1n.32xlarge", None, TRN1, 1),
        ("trn2.48xlarge", None, TRN2, 2),  # LNC=2 by default: 4 logical cores a chip
        ("trn2.48xlarge", "1", TRN2, 1),
        ("trn2.3xlarge", None, TRN2, 2),  # one chip: the same per-rank peak
        ("trn2u.48xlarge", None, TRN2, 2),
        ("trn3.48xlarge", None, TRN3, 2),
        ("trn3.48xlarge", "1", TRN3, 1),
    ],
)
def test_a_ranks_peak_is_its_logical_cores_share_of_the_chip(
    instance_type: str,
    lnc_env: str | None,
    chip: tuple[float, int],
    lnc: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One rank per logical NeuronCore, whatever the number of ranks on the node: the peak of a
    rank is the chip's x the logical core's physical cores / the chip's physical cores."""
    if lnc_env is None:
        monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    else:
        monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", lnc_env)
    tflops, cores = chip
    peak = device.neuron_peak_flops(instance_type, device.logical_nc_config(instance_type))
    assert peak == pytest.approx(tflops * lnc / cores * 1e12, rel=1e-12)


def test_the_xla_stack_asks_neuronx_cc_for_bf16_matmuls() -> None:
    """neuronx-cc's --auto-cast defaults to none since Neuron 2.27: without the flag the xla
    stack's matmuls run in FP32."""
    assert device.compiler_precision(stacks.STACKS["xla"].cc_flags) == "bf16 matmult auto-cast"
    assert device.compiler_precision(stacks.STACKS["native"].cc_flags) == "fp32"  # torch casts


@pytest.mark.parametrize(
    ("flags", "precision"),
    [
        ("", "fp32"),
        ("--model-type transformer", "fp32"),
        ("--auto-cast=matmult", "bf16 matmult auto-cast"),
        ("--auto-cast matmult --auto-cast-type fp16", "fp16 matmult auto-cast"),
        ("--auto-cast=all --auto-cast-type=fp8_e4m3", "fp8_e4m3 all auto-cast"),
        ("--auto-cast=matmult -O1 --auto-cast=none", "fp32"),  # the right-most one wins
    ],
)
def test_precision_follows_the_compiler_flags(flags: str, precision: str) -> None:
    assert device.compiler_precision(flags) == precision


def test_an_unknown_auto_cast_mode_is_an_error() -> None:
    with pytest.raises(
        ValueError, match=r"NEURON_CC_FLAGS --auto-cast=matmul is unknown; use one of none, "
    ):
        device.compiler_precision("--auto-cast=matmul")


def _unstarted(cls: type[device.Backend]) -> device.Backend:
    """A backend object without its device modules (TorchNeuron and CUDA are not here)."""
    return cls.__new__(cls)


@pytest.mark.parametrize(("visible", "index"), [(1, 0), (64, 5)])
def test_a_neuron_rank_takes_the_core_it_sees(
    visible: int, index: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one core visible per rank (TorchNeuron's NEURON_RT_VISIBLE_CORES=LOCAL_RANK) local
    rank 5 is on index 0, where asking for index 5 would fail; seeing the node's cores, on 5."""
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: visible)
    backend = _unstarted(device.NeuronBackend)
    backend.local_rank = 5

    assert isinstance(backend, device.NeuronBackend) and backend.device_index() == index


def test_a_neuron_rank_that_sees_too_few_cores_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 2)
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "4-5")
    backend = _unstarted(device.NeuronBackend)
    backend.local_rank = 5

    assert isinstance(backend, device.NeuronBackend)
    with pytest.raises(
        ValueError,
        match=r"^local rank 5 sees 2 NeuronCores \(NEURON_RT_VISIBLE_CORES='4-5'\): neither its "
        r"own core alone nor the node's$",
    ):
        backend.device_index()


def test_xla_on_neuron_needs_the_instance_type_and_on_cpu_none(
    machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's instance type is empty unless given. PyTorch/XLA on CPU runs without one
    (no Neuron memory to size against); on a Neuron node it is refused, as for native."""
    device.XlaBackend.check_instance("")
    device.XlaBackend.check_plan(
        strategy="ddp", model="preset 'tiny'", num_params=10**6, instance_type=""
    )
    monkeypatch.setenv("NEURON_STACK", "xla")
    with pytest.raises(ValueError, match=r"^the xla stack needs the node's Trainium instance type"):
        device.XlaBackend.check_instance("")
    device.XlaBackend.check_instance("trn1.32xlarge")


def test_cpu_trains_in_fp32_and_cuda_and_neuron_in_bf16_autocast() -> None:
    assert device.Backend().precision() == "fp32"
    assert _unstarted(device.NeuronBackend).precision() == "bf16 autocast"
    assert _unstarted(device.CudaBackend).precision() == "bf16 autocast"


def test_fsdp_gathers_bf16_and_reduces_fp32_where_the_backend_autocasts() -> None:
    cpu = device.Backend().mixed_precision()
    assert cpu.param_dtype is None and cpu.reduce_dtype is None  # FP32 throughout on CPU
    policy = _unstarted(device.NeuronBackend).mixed_precision()
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32


def _num_params(name: str) -> int:
    with torch.device("meta"):
        return GPT(PRESETS[name].model).num_params()


def test_xla_refuses_fsdp() -> None:
    """torch-neuronx (PyTorch/XLA) does not support FSDP2."""
    with pytest.raises(
        ValueError, match=r"parallel 'fsdp' is not available on device 'xla'.*--parallel ddp"
    ):
        device.XlaBackend.check_plan(
            strategy="fsdp", model="preset 'tiny'", num_params=1000, instance_type="trn1.32xlarge"
        )


def test_xla_refuses_a_preset_a_trn1_core_cannot_hold() -> None:
    """Unsharded AdamW in FP32 keeps 16 bytes per parameter; a Trn1 NeuronCore has half of a
    32 GiB chip."""
    n = _num_params("1b")
    needed, available = n * 16, 32 * 2**30 // 2
    assert needed > available
    with pytest.raises(
        ValueError,
        match=rf"preset '1b' needs {needed:,} bytes of device memory per NeuronCore .*"
        rf"a NeuronCore of trn1\.32xlarge has {available:,}",
    ):
        device.XlaBackend.check_plan(
            strategy="ddp", model="preset '1b'", num_params=n, instance_type="trn1.32xlarge"
        )
    device.XlaBackend.check_plan(
        strategy="ddp",
        model="preset '125m'",
        num_params=_num_params("125m"),
        instance_type="trn1.32xlarge",
    )


def test_a_model_run_s_plan_names_the_model_directory() -> None:
    """A --model run is labelled by its directory, not as a preset named like the path."""
    from trainer import loop
    from trainer.config import TrainConfig

    label = loop._model_label(TrainConfig(model_dir="/models/llama-8b"))
    assert label == "model '/models/llama-8b'"
    with pytest.raises(ValueError, match=r"^model '/models/llama-8b' needs .* use a smaller model"):
        device.XlaBackend.check_plan(
            strategy="ddp", model=label, num_params=8 * 10**9, instance_type="trn1.32xlarge"
        )


def _torchneuron(monkeypatch: pytest.MonkeyPatch, compile_backend: str) -> device.Backend:
    """A NeuronBackend made as the trainer makes it, with an empty torch_neuronx module in place
    of the package (not installed here)."""
    monkeypatch.setitem(sys.modules, "torch_neuronx", types.ModuleType("torch_neuronx"))
    return device.NeuronBackend(compile_backend=compile_backend)


@pytest.mark.parametrize(
    ("asked", "sharded", "runs"),
    [
        ("auto", True, None),
        ("auto", False, "neuron"),
        ("none", True, None),
        ("neuron", False, "neuron"),
    ],
)
def test_torchneuron_runs_a_sharded_model_eager(
    asked: str, sharded: bool, runs: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TorchNeuron's torch.compile supports SimpleFSDP, FSDP2 only in eager mode: FSDP2 over
    several ranks defaults to eager; one rank or DDP compiles as before."""
    backend = _torchneuron(monkeypatch, asked)
    backend.fit_compile(sharded=sharded)
    assert backend.compile_backend == runs


def test_torchneuron_refuses_a_compiled_fsdp2_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _torchneuron(monkeypatch, "neuron")
    with pytest.raises(
        ValueError, match=r"^--compile neuron with --parallel fsdp on several ranks: .*SimpleFSDP"
    ):
        backend.fit_compile(sharded=True)
    cpu = device.Backend(compile_backend="inductor")
    cpu.fit_compile(sharded=True)  # elsewhere FSDP2 compiles per block, as before
    assert cpu.compile_backend == "inductor"


def test_the_cpu_peak_is_the_best_product_on_all_threads_or_on_one_times_the_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every product of PEAK_PRODUCTS is timed on the process's threads and on one thread; the
    peak is the best of those rates, one thread's times the thread count; the thread count is
    the process's again afterwards."""
    threads = torch.get_num_threads()
    timed: list[tuple[tuple[int, int, int], int, float]] = []
    product_flops = device._product_flops

    def recorded(rows: int, inner: int, columns: int, repeats: int) -> float:
        rate = product_flops(rows, inner, columns, repeats)
        timed.append(((rows, inner, columns), torch.get_num_threads(), rate))
        return rate

    monkeypatch.setattr(device, "_product_flops", recorded)
    peak = device.cpu_peak_flops.__wrapped__(repeats=1)

    assert torch.get_num_threads() == threads
    shapes = device.PEAK_PRODUCTS
    assert sorted((shape, n) for shape, n, _ in timed) == sorted(
        [(shape, threads) for shape in shapes] + [(shape, 1) for shape in shapes]
    )
    assert peak == max(rate * (threads if n == 1 else 1) for _, n, rate in timed)


def test_the_cpu_backends_peak_is_the_one_cpu_peak() -> None:
    """The run header's peak on CPU (see test_loop) and the bench's are this one figure."""
    assert device.Backend().peak_flops(instance_type="") == device.cpu_peak_flops()
