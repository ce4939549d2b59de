"""The device seam: one backend class per accelerator, chosen by name from :data:`BACKENDS`.

The loop talks to a backend through a few methods (prepare the model, compile, autocast, wrap the
loader, reduce gradients, mark a step boundary, synchronize, peak FLOPs) and never asks which
device it runs on. ``torch_neuronx`` and ``torch_xla`` are imported only by their backends.

A backend is made in two steps: :func:`resolve` imports what its process group needs, and
:meth:`Backend.start` binds this rank's device once the process group exists.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from trainer import stacks
from trainer.config import Parallel

# Inputs and targets, and for packed rows each token's position in its example.
Batch = tuple[torch.Tensor, ...]
# Where the Neuron device plugin puts a node's devices (/dev/neuron0, ...) in the container.
DEV_DIR = Path("/dev")


class Backend:
    """CPU defaults; subclasses override what differs. ``compile_backend=None`` runs eagerly."""

    name: ClassVar[str] = "cpu"
    dist_backend: ClassVar[str] = "gloo"
    default_compile: ClassVar[str | None] = None
    autocast_dtype: ClassVar[torch.dtype | None] = None
    # FSDP2's dtype for gradient reduce-scatters when parameters are gathered in autocast_dtype:
    # FP32, as torchtitan defaults, since BF16 sums over many ranks lose the small gradients.
    fsdp_reduce_dtype: ClassVar[torch.dtype] = torch.float32
    # DDP and FSDP2 all-reduce gradients during backward; a backend without them reduces in
    # reduce_gradients, and the model is then not wrapped.
    reduces_in_backward: ClassVar[bool] = True
    device: torch.device  # set by start()

    def __init__(self, *, compile_backend: str = "auto", local_rank: int = 0) -> None:
        self.local_rank = local_rank
        self.compile_asked = compile_backend
        self.compile_backend = (
            self.default_compile
            if compile_backend == "auto"
            else (None if compile_backend == "none" else compile_backend)
        )

    @classmethod
    def available(cls) -> bool:
        """Usable when named (``--device NAME``)."""
        return True

    @classmethod
    def detected(cls) -> bool:
        """Picked by ``auto``; stricter than :meth:`available` where a backend can run somewhere
        it should not be chosen by default."""
        return cls.available()

    def start(self) -> Backend:
        """Binds this rank's device. Call after the process group is initialised, the order of
        TorchNeuron's distributed guide (group first, then the device); it is safe for CUDA too,
        since NCCL binds a device only at the first collective, which comes later."""
        self.device = self._device()
        return self

    @classmethod
    def check_instance(cls, instance_type: str) -> None:
        """Raises ValueError when this backend cannot run on ``instance_type``."""

    @classmethod
    def check_plan(
        cls, *, strategy: Parallel, model: str, num_params: int, instance_type: str
    ) -> None:
        """Raises ValueError when this backend cannot train ``model`` (``num_params``
        parameters; the label its messages use: ``preset 'NAME'`` or ``model 'DIR'``) with
        ``strategy`` on ``instance_type``; every plan passes by default."""

    def fit_compile(self, *, sharded: bool) -> None:
        """Fits the compile choice to the plan (``sharded``: FSDP2 over several ranks); every
        choice fits by default."""

    def _device(self) -> torch.device:
        return torch.device("cpu")

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def compile(self, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        """Static shapes and one graph: a graph break or a dynamic shape is an error, not a
        silent slowdown (the Neuron backend rejects ``dynamic=True`` anyway)."""
        if self.compile_backend is None:
            return fn
        return torch.compile(fn, backend=self.compile_backend, fullgraph=True, dynamic=False)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def batches(self, source: Iterator[Batch]) -> Iterator[Batch]:
        for batch in source:
            yield tuple(t.to(self.device, non_blocking=True) for t in batch)

    def reduce_gradients(self, optimizer: torch.optim.Optimizer, world_size: int) -> None:
        """DDP and FSDP reduce during backward; only the XLA backend reduces here."""

    def step_boundary(self) -> None:
        """Where a lazy backend cuts the step's graph."""

    def synchronize(self) -> None:
        """Waits for queued device work, so that a wall-clock interval measures it."""

    def mixed_precision(self) -> Any:
        """FSDP2's :class:`~torch.distributed.fsdp.MixedPrecisionPolicy`: parameters gathered in
        :attr:`autocast_dtype` and gradients reduced in :attr:`fsdp_reduce_dtype` where the
        backend autocasts; no casting (FP32 throughout) where it does not, as on CPU."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.autocast_dtype is None:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(
            param_dtype=self.autocast_dtype, reduce_dtype=self.fsdp_reduce_dtype
        )

    def precision(self) -> str:
        """What the matmuls run in, for the metrics: ``fp32``, or the autocast dtype."""
        if self.autocast_dtype is None:
            return "fp32"
        return f"{dtype_name(self.autocast_dtype)} autocast"

    def frozen_dtype(self) -> torch.dtype | None:
        """The dtype frozen weights (LoRA's base) are kept in, None to keep them as loaded
        (FP32): the autocast dtype where the backend autocasts (BF16 on CUDA and Neuron), whose
        products then read the weights as they are, at half the memory; none on CPU and XLA,
        which compute in FP32 (XLA's compiler casts on its own)."""
        return self.autocast_dtype

    def peak_flops(self, *, instance_type: str) -> float | None:
        """Dense peak FLOP/s available to one rank, or None when unknown. CPU: the fp32 peak of
        :func:`cpu_peak_flops` (the model trains in fp32 there)."""
        return cpu_peak_flops()


def dtype_name(dtype: torch.dtype) -> str:
    """``bf16``, ``fp16`` or torch's name of ``dtype``, as the metrics write precisions."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


# The fp32 products (rows, inner, columns) the CPU peak is measured on: those of a transformer
# block at the CPU presets' width (2048 tokens of width 384: the MLP's up and down projections
# and a weight gradient) and a square one. A square product alone read below what the trainer's
# own products reach (issue 36: 173 GFLOP/s against 184 reached on a Xeon).
PEAK_PRODUCTS = ((2048, 384, 1536), (2048, 1536, 384), (384, 2048, 1536), (1024, 1024, 1024))


def _product_flops(rows: int, inner: int, columns: int, repeats: int) -> float:
    """Best-of-``repeats`` rate of one fp32 product on this process's threads, in FLOP/s."""
    a, b = torch.randn(rows, inner), torch.randn(inner, columns)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - began)
    return 2.0 * rows * inner * columns / best


@contextlib.contextmanager
def _threads(count: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@cache
def cpu_peak_flops(repeats: int = 3) -> float:
    """The fp32 matmul peak of this CPU for this process's torch threads, in FLOP/s: the best of
    :data:`PEAK_PRODUCTS`, each timed best-of-``repeats`` on all the threads and on one thread
    (that rate times the thread count: a core alone runs at least as fast as it does beside the
    others, and one thread is the less disturbed by other work on the machine). Measured once
    per process (about half a second); the run header's peak on CPU and ``make bench``'s.
    """
    threads = torch.get_num_threads()
    best = 0.0
    for shape in PEAK_PRODUCTS:
        best = max(best, _product_flops(*shape, repeats))
        with _threads(1):
            best = max(best, threads * _product_flops(*shape, repeats))
    return best


class CudaBackend(Backend):
    name = "cuda"
    dist_backend = "nccl"
    default_compile = "inductor"
    autocast_dtype = torch.bfloat16
    # Dense BF16 tensor-core peaks from NVIDIA's data sheets (SXM parts), keyed by a substring of
    # torch.cuda.get_device_name(): for a GPU outside the GPU catalog (a run off the platform).
    PEAK_BF16: ClassVar[dict[str, float]] = {
        "A100": 312e12,
        "H100": 989e12,
        "H200": 989e12,
        "B200": 2250e12,
    }

    @classmethod
    def available(cls) -> bool:
        return torch.cuda.is_available()

    def _device(self) -> torch.device:
        torch.cuda.set_device(self.local_rank)
        return torch.device("cuda", self.local_rank)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def peak_flops(self, *, instance_type: str) -> float | None:
        """The GPU catalog's dense BF16 peak per GPU of ``instance_type`` (one rank per GPU),
        the figure the platform's cost and capacity tools use; a type outside that catalog
        falls back to the device name's data-sheet figure, or None."""
        from trn_catalog.gpu_instances import GPU_CATALOG

        if instance_type in GPU_CATALOG:
            return GPU_CATALOG[instance_type].bf16_tflops_per_gpu * 1e12
        name = torch.cuda.get_device_name(self.device)
        return next((v for k, v in self.PEAK_BF16.items() if k in name), None)


class NeuronBackend(Backend):
    """TorchNeuron, the native PyTorch backend for Trn2/Trn3 (torch-neuronx 2.13/2.14): device
    ``neuron``, ``torch.compile(backend="neuron")``, process group ``neuron``, bf16 autocast."""

    name = "neuron"
    dist_backend = "neuron"
    default_compile = "neuron"
    autocast_dtype = torch.bfloat16

    def __init__(self, **kwargs: Any) -> None:
        importlib.import_module("torch_neuronx")  # registers the device and the compile backend
        super().__init__(**kwargs)

    @classmethod
    def available(cls) -> bool:
        try:
            importlib.import_module("torch_neuronx")
        except ImportError:
            return False
        accelerator = torch.accelerator.current_accelerator()
        return accelerator is not None and accelerator.type == "neuron"

    @classmethod
    def check_instance(cls, instance_type: str) -> None:
        """TorchNeuron runs on Trn2 and Trn3 only; Trn1 needs the XLA stack."""
        stacks.check_instance(stacks.STACKS["native"], instance_type)

    def fit_compile(self, *, sharded: bool) -> None:
        """FSDP2 runs eager on TorchNeuron: its ``torch.compile`` supports SimpleFSDP, not
        FSDP2 ("For eager mode, TorchNeuron supports all three: FSDPv1, FSDPv2, and SimpleFSDP.
        For torch.compile, TorchNeuron ... supports SimpleFSDP": the TorchNeuron overview's FAQ,
        frameworks/torch/pytorch-native-overview.rst). So with the model sharded, ``auto``
        compiles nothing, and a backend asked for by name is refused.

        Raises:
            ValueError: ``--compile`` names a backend for a sharded model.
        """
        if not sharded or self.compile_backend is None:
            return
        if self.compile_asked != "auto":
            raise ValueError(
                f"--compile {self.compile_asked} with --parallel fsdp on several ranks: "
                "TorchNeuron compiles FSDP2 models only in eager mode (torch.compile supports "
                "SimpleFSDP, the Neuron FAQ); use --compile auto or none (FSDP2 eager), or "
                "--parallel ddp to compile a full replica per rank"
            )
        self.compile_backend = None

    def _device(self) -> torch.device:
        index = self.device_index()
        torch.accelerator.set_device_index(index)
        return torch.device("neuron", index)

    def device_index(self) -> int:
        """This rank's NeuronCore among those it sees: index 0 where it sees one (TorchNeuron
        pins a rank to its core, ``NEURON_RT_VISIBLE_CORES=LOCAL_RANK``, as platform-facts has
        it; the Neuron guide to torch.distributed puts every rank's tensors on
        ``torch.device("neuron")``), its local rank where it sees the node's cores. Which of the
        two TorchNeuron 2.33 does has not been tried on a device here.

        Raises:
            ValueError: the process sees several cores, but not as many as its local rank needs.
        """
        count = torch.accelerator.device_count()
        if count == 1:
            return 0
        if self.local_rank < count:
            return self.local_rank
        raise ValueError(
            f"local rank {self.local_rank} sees {count} NeuronCores "
            f"(NEURON_RT_VISIBLE_CORES={os.environ.get('NEURON_RT_VISIBLE_CORES')!r}): neither "
            "its own core alone nor the node's"
        )

    def synchronize(self) -> None:
        torch.accelerator.synchronize(self.device)

    def peak_flops(self, *, instance_type: str) -> float | None:
        return neuron_peak_flops(instance_type, logical_nc_config(instance_type))


def logical_nc_config(instance_type: str) -> int:
    """Physical NeuronCores per logical core: ``NEURON_LOGICAL_NC_CONFIG``, else the catalog's
    default for the instance type (2 on Trn2/Trn3, 1 on Trn1).

    Raises:
        trn_catalog.UnknownInstanceTypeError: the instance type is not in the catalog.
    """
    import trn_catalog

    default = trn_catalog.get(instance_type).default_lnc
    return int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", default))


def neuron_peak_flops(instance_type: str, lnc: int) -> float:
    """The BF16 peak of one rank: the Neuron backends pin each rank to one logical NeuronCore
    of ``lnc`` physical cores, so a rank has ``lnc`` of its chip's cores, whatever the number
    of ranks on the node (the catalog's per-chip peak x lnc / physical cores per chip).

    Raises:
        trn_catalog.UnknownInstanceTypeError: the instance type is not in the catalog.
    """
    import trn_catalog

    spec = trn_catalog.get(instance_type)
    return spec.bf16_tflops_per_chip * 1e12 * lnc / spec.neuron_cores_per_chip


def device_memory_per_rank(instance_type: str, lnc: int) -> int:
    """Bytes of device memory (HBM) behind one logical NeuronCore of ``lnc`` physical cores.

    Raises:
        trn_catalog.UnknownInstanceTypeError: the instance type is not in the catalog.
    """
    import trn_catalog

    spec = trn_catalog.get(instance_type)
    return spec.device_memory_gib_per_chip * (1 << 30) * lnc // spec.neuron_cores_per_chip


# Bytes per parameter of unsharded AdamW training in FP32: the weight, its gradient and the two
# moment estimates.
TRAIN_STATE_BYTES_PER_PARAM = 4 + 4 + 4 + 4


class XlaBackend(Backend):
    """Legacy PyTorch/XLA (torch-neuronx <= 2.9, Neuron SDK <= 2.29 for training; the stack for
    Trn1; also CPU with ``PJRT_DEVICE=CPU``). Lazy tensors: the step is cut with ``mark_step``,
    the loader moves batches in the background, and gradients are all-reduced once, by
    ``xm.reduce_gradients`` before clipping: the model is never wrapped in DDP here, and FSDP2,
    which torch-neuronx does not support, is refused (:meth:`check_plan`).

    Precision: the model stays FP32 and no autocast runs here; the compiler casts. Since Neuron
    2.27 neuronx-cc's ``--auto-cast`` defaults to ``none`` (FP32 matmuls at a quarter of the BF16
    rate), so the backend appends ``--auto-cast=matmult`` to ``NEURON_CC_FLAGS`` when the flags
    name no ``--auto-cast`` (the xla stack's launcher flags already carry it), and reports what
    the flags ask for in :meth:`precision`. MFU is measured against the BF16 peak."""

    name = "xla"
    dist_backend = "xla"
    default_compile = None
    reduces_in_backward = False

    def __init__(self, **kwargs: Any) -> None:
        flags = os.environ.get("NEURON_CC_FLAGS", "")
        if compiler_auto_cast(flags) is None:
            os.environ["NEURON_CC_FLAGS"] = f"{flags} {XLA_AUTO_CAST}".strip()
        self.xm = importlib.import_module("torch_xla.core.xla_model")
        self.pl = importlib.import_module("torch_xla.distributed.parallel_loader")
        importlib.import_module("torch_xla.distributed.xla_backend")  # registers the "xla" group
        super().__init__(**kwargs)

    @classmethod
    def available(cls) -> bool:
        return _installed("torch_xla")

    @classmethod
    def detected(cls) -> bool:
        """torch_xla alone also runs on CPU, so ``auto`` takes it only for Neuron: when the image
        says its stack is xla, or when the node shows Neuron devices and the image does not say
        it is native."""
        stack = os.environ.get("NEURON_STACK", "")
        if stack == "native" or not cls.available():
            return False
        return stack == "xla" or any(DEV_DIR.glob("neuron[0-9]*"))

    @classmethod
    def check_instance(cls, instance_type: str) -> None:
        """On Neuron (:meth:`detected`) the node's type must be named, as for the native stack;
        PyTorch/XLA on CPU needs none.

        Raises:
            ValueError: no instance type on a Neuron node.
        """
        if not instance_type and cls.detected():
            stacks.check_instance(stacks.STACKS["xla"], instance_type)

    @classmethod
    def check_plan(
        cls, *, strategy: Parallel, model: str, num_params: int, instance_type: str
    ) -> None:
        """Each rank holds a full replica: refuses ``fsdp`` and a model whose FP32 weights,
        gradients and AdamW state outgrow one NeuronCore's device memory (not sized without an
        instance type: PyTorch/XLA on CPU).

        Raises:
            ValueError: naming the strategy, or the model (its label ``model``), the bytes it
                needs and those available.
            trn_catalog.UnknownInstanceTypeError: the instance type is not in the catalog.
        """
        if strategy == "fsdp":
            raise ValueError(
                "parallel 'fsdp' is not available on device 'xla': torch-neuronx (PyTorch/XLA) "
                "does not support FSDP2; use --parallel ddp (a full replica per NeuronCore), "
                "or the native stack on trn2/trn3 to shard"
            )
        if not instance_type:
            return  # off Neuron (check_instance refuses a Neuron node without one)
        needed = num_params * TRAIN_STATE_BYTES_PER_PARAM
        available = device_memory_per_rank(instance_type, logical_nc_config(instance_type))
        if needed > available:
            raise ValueError(
                f"{model} needs {needed:,} bytes of device memory per NeuronCore "
                f"({num_params:,} parameters x {TRAIN_STATE_BYTES_PER_PARAM} bytes of FP32 "
                f"weights, gradients and AdamW state) before activations, but a NeuronCore of "
                f"{instance_type} has {available:,}; the xla stack cannot shard: use a smaller "
                f"model, or trn2/trn3 with the native stack and --parallel fsdp"
            )

    def _device(self) -> torch.device:
        device: torch.device = self.xm.xla_device()
        return device

    def prepare_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        # Moving to an XLA device silently unties shared parameters.
        tie = getattr(model, "tie_weights", None)
        if tie is not None:
            tie()
        return model

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def batches(self, source: Iterator[Batch]) -> Iterator[Batch]:
        loader: Iterator[Batch] = iter(self.pl.MpDeviceLoader(_Reiterable(source), self.device))
        return loader

    def reduce_gradients(self, optimizer: torch.optim.Optimizer, world_size: int) -> None:
        if world_size > 1:
            self.xm.reduce_gradients(optimizer)

    def step_boundary(self) -> None:
        self.xm.mark_step()

    def synchronize(self) -> None:
        self.xm.wait_device_ops()

    def on_neuron(self) -> bool:
        """True on NeuronCores; False on PyTorch/XLA's CPU (or another) device."""
        return bool(self.xm.xla_device_hw(self.device) == "NEURON")

    def precision(self) -> str:
        """``fp32`` off Neuron; on Neuron what ``NEURON_CC_FLAGS`` asks neuronx-cc for."""
        if not self.on_neuron():
            return "fp32"
        return compiler_precision(os.environ.get("NEURON_CC_FLAGS", ""))

    def peak_flops(self, *, instance_type: str) -> float | None:
        if not self.on_neuron():
            return None
        return neuron_peak_flops(instance_type, logical_nc_config(instance_type))


# neuronx-cc (Neuron 2.31 compiler reference): --auto-cast none|matmult|all, default none since
# Neuron 2.27 (matmult before); --auto-cast-type bf16|fp16|tf32|fp8_e4m3, default bf16; the
# right-most of competing options wins.
XLA_AUTO_CAST = "--auto-cast=matmult"
AUTO_CAST_MODES = ("none", "matmult", "all")


def _flag_values(flags: str, name: str) -> list[str]:
    words = flags.split()
    values = []
    for i, word in enumerate(words):
        if word.startswith(f"{name}="):
            values.append(word.split("=", 1)[1])
        elif word == name and i + 1 < len(words):
            values.append(words[i + 1])
    return values


def compiler_auto_cast(flags: str) -> str | None:
    """The ``--auto-cast`` mode that ``flags`` (``NEURON_CC_FLAGS``) gives neuronx-cc, the
    right-most one; None when they name none (the compiler then casts nothing)."""
    values = _flag_values(flags, "--auto-cast")
    return values[-1] if values else None


def compiler_precision(flags: str) -> str:
    """What neuronx-cc computes FP32 operations in under ``flags``: ``fp32`` (``--auto-cast``
    absent or ``none``), else ``<type> <mode> auto-cast``, e.g. ``bf16 matmult auto-cast``.

    Raises:
        ValueError: an ``--auto-cast`` mode the compiler does not know.
    """
    mode = compiler_auto_cast(flags) or "none"
    if mode not in AUTO_CAST_MODES:
        raise ValueError(
            f"NEURON_CC_FLAGS --auto-cast={mode} is unknown; use one of "
            f"{', '.join(AUTO_CAST_MODES)}"
        )
    if mode == "none":
        return "fp32"
    types = _flag_values(flags, "--auto-cast-type")
    return f"{types[-1] if types else 'bf16'} {mode} auto-cast"


class _Reiterable:
    """MpDeviceLoader wants an iterable; the sampler stream is an endless iterator."""

    def __init__(self, it: Iterator[Batch]) -> None:
        self.it = it

    def __iter__(self) -> Iterator[Batch]:
        return self.it

    def __len__(self) -> int:
        return 1 << 62


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


BACKENDS: dict[str, type[Backend]] = {
    "neuron": NeuronBackend,
    "cuda": CudaBackend,
    "cpu": Backend,
    "xla": XlaBackend,
}
# xla first: in the XLA image torch_neuronx is the XLA-era package, and importing it to test for
# the native backend is needless there; XlaBackend.detected() is false everywhere else.
AUTO_ORDER = ("xla", "neuron", "cuda", "cpu")


def select(name: str = "auto") -> type[Backend]:
    """The backend class called ``name``; ``auto`` (the default) picks the first of
    :data:`AUTO_ORDER` that is detected here.

    Raises:
        ValueError: unknown name, or the named backend is not available here.
    """
    if name == "auto":
        return next(BACKENDS[n] for n in AUTO_ORDER if BACKENDS[n].detected())
    if name not in BACKENDS:
        raise ValueError(f"device {name!r} is unknown; known: auto, {', '.join(BACKENDS)}")
    if not BACKENDS[name].available():
        raise ValueError(f"device {name!r} is not available on this machine")
    return BACKENDS[name]


def resolve(name: str = "auto", *, compile_backend: str = "auto", local_rank: int = 0) -> Backend:
    """The backend of :func:`select`, its modules imported and its device not yet bound (see
    :meth:`Backend.start`).

    Raises:
        ValueError: unknown name, or the named backend is not available here.
    """
    return select(name)(compile_backend=compile_backend, local_rank=local_rank)
