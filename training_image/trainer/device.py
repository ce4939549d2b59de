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

Batch = tuple[torch.Tensor, torch.Tensor]
# Where the Neuron device plugin puts a node's devices (/dev/neuron0, ...) in the container.
DEV_DIR = Path("/dev")


class Backend:
    """CPU defaults; subclasses override what differs. ``compile_backend=None`` runs eagerly."""

    name: ClassVar[str] = "cpu"
    dist_backend: ClassVar[str] = "gloo"
    default_compile: ClassVar[str | None] = None
    autocast_dtype: ClassVar[torch.dtype | None] = None
    device: torch.device  # set by start()

    def __init__(self, *, compile_backend: str = "auto", local_rank: int = 0) -> None:
        self.local_rank = local_rank
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

    def _device(self) -> torch.device:
        return torch.device("cpu")

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def compile(self, fn: nn.Module) -> Callable[..., torch.Tensor]:
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
        for x, y in source:
            yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def reduce_gradients(self, optimizer: torch.optim.Optimizer, world_size: int) -> None:
        """DDP and FSDP reduce during backward; only the XLA backend reduces here."""

    def step_boundary(self) -> None:
        """Where a lazy backend cuts the step's graph."""

    def synchronize(self) -> None:
        """Waits for queued device work, so that a wall-clock interval measures it."""

    def peak_flops(self, *, instance_type: str, local_world_size: int) -> float | None:
        """Dense peak FLOP/s available to one rank, or None when unknown. CPU: an fp32 matmul
        measured once per process (the model trains in fp32 there)."""
        return measured_cpu_matmul_flops()


@cache
def measured_cpu_matmul_flops(n: int = 1536, repeats: int = 5) -> float:
    """Best-of-``repeats`` fp32 ``n x n`` matmul rate on this CPU, in FLOP/s (about 0.3 s)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2.0 * n**3 / best


class CudaBackend(Backend):
    name = "cuda"
    dist_backend = "nccl"
    default_compile = "inductor"
    autocast_dtype = torch.bfloat16
    # Dense BF16 tensor-core peaks from NVIDIA's data sheets (SXM parts), keyed by a substring of
    # torch.cuda.get_device_name().
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

    def peak_flops(self, *, instance_type: str, local_world_size: int) -> float | None:
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

    def _device(self) -> torch.device:
        torch.accelerator.set_device_index(self.local_rank)
        return torch.device("neuron", self.local_rank)

    def synchronize(self) -> None:
        torch.accelerator.synchronize(self.device)

    def peak_flops(self, *, instance_type: str, local_world_size: int) -> float | None:
        return neuron_peak_flops(instance_type, local_world_size)


def neuron_peak_flops(instance_type: str, local_world_size: int) -> float:
    """The node's BF16 peak (chips x the catalog's per-chip figure) shared among the node's ranks.

    Raises:
        trn_catalog.UnknownInstanceTypeError: the instance type is not in the catalog.
    """
    import trn_catalog

    spec = trn_catalog.get(instance_type)
    return spec.peak_bf16_tflops * 1e12 / max(1, local_world_size)


class XlaBackend(Backend):
    """Legacy PyTorch/XLA (torch-neuronx <= 2.9, Neuron SDK <= 2.29 for training; the stack for
    Trn1; also CPU with ``PJRT_DEVICE=CPU``). Lazy tensors: the step is cut with ``mark_step``,
    the loader moves batches in the background, and gradients are all-reduced before clipping.

    Precision: the model stays FP32 and no autocast runs here; neuronx-cc casts FP32 matmuls to
    BF16 by default (Neuron's mixed-precision guide), which is why the image's launcher leaves
    ``--auto-cast=none`` out of ``NEURON_CC_FLAGS`` for this stack, and why MFU is measured
    against the BF16 peak (a job that sets ``--auto-cast=none`` itself runs FP32 matmuls and
    reads a lower MFU against it, never a higher one)."""

    name = "xla"
    dist_backend = "xla"
    default_compile = None

    def __init__(self, **kwargs: Any) -> None:
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

    def peak_flops(self, *, instance_type: str, local_world_size: int) -> float | None:
        if self.xm.xla_device_hw(self.device) != "NEURON":
            return None
        return neuron_peak_flops(instance_type, local_world_size)


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
