"""Process groups and data parallelism: DDP for models that fit a device, FSDP2 for the rest.

The rank layout comes from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE); without it the run is a single process and nothing is wrapped.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from trainer.config import Parallel

if TYPE_CHECKING:
    from trainer.device import Backend


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def ranks_from_env() -> Ranks:
    """torchrun's layout, or a single process when it did not launch us."""
    env = os.environ
    return Ranks(
        rank=int(env.get("RANK", 0)),
        world_size=int(env.get("WORLD_SIZE", 1)),
        local_rank=int(env.get("LOCAL_RANK", 0)),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
    )


def init(ranks: Ranks, dist_backend: str) -> None:
    """Joins the default process group (``dist_backend``) when there is more than one rank."""
    if ranks.distributed and not dist.is_initialized():
        dist.init_process_group(dist_backend)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(
    model: nn.Module, ranks: Ranks, strategy: Parallel, backend: Backend
) -> tuple[nn.Module, Callable[..., torch.Tensor]]:
    """The model for data parallelism and the callable that runs its forward, compiled by
    ``backend``.

    One rank: the model, compiled whole. ``ddp``: DDP around the model whose forward is compiled,
    as DDP's own forward (its logging and bucket bookkeeping) is not traceable in one graph; on a
    backend that reduces gradients itself (XLA) the model is not wrapped, so gradients are
    reduced once. ``fsdp``: FSDP2 with each block sharded on its own in the backend's mixed
    precision, each block's forward compiled before sharding (the torchtitan pattern): Dynamo
    does not trace FSDP2's hooks, so a whole-model one-graph compile breaks at each block.
    """
    if not ranks.distributed or not backend.reduces_in_backward:
        return model, backend.compile(model)
    if strategy == "fsdp":
        return _shard(model, backend), model
    from torch.nn.parallel import DistributedDataParallel

    _compile_forward(model, backend)
    device = backend.device
    ids = None if device.type == "cpu" else [device.index]
    ddp = DistributedDataParallel(model, device_ids=ids)
    return ddp, ddp


def _compile_forward(module: nn.Module, backend: Backend) -> None:
    """Compiles ``module``'s forward in place of it, not the module: its state-dict keys stay as
    they are, and hooks on the module (FSDP2's, DDP's) run outside the compiled graph."""
    if backend.compile_backend is not None:
        module.forward = backend.compile(module.forward)


def _shard(model: nn.Module, backend: Backend) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    policy = backend.mixed_precision()
    for block in getattr(model, "blocks", []):
        _compile_forward(block, backend)
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skips the gradient all-reduce on the micro-steps before the last one of a step."""
    if enabled:
        yield
        return
    no_sync = getattr(model, "no_sync", None)
    if no_sync is not None:
        with no_sync():
            yield
        return
    set_sync = getattr(model, "set_requires_gradient_sync", None)
    if set_sync is not None:
        set_sync(False)
        try:
            yield
        finally:
            set_sync(True)
        return
    yield


def all_mean(value: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """Mean over ranks (a copy); ``value`` itself when there is one rank."""
    if not ranks.distributed:
        return value
    value = value.clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / ranks.world_size


def any_rank(flag: bool, ranks: Ranks, group: dist.ProcessGroup | None) -> bool:
    """True when ``flag`` is set on any rank; ``group`` is a CPU (gloo) group."""
    if not ranks.distributed:
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t.item())


def broadcast_object(obj: object, ranks: Ranks, group: dist.ProcessGroup | None) -> object:
    """Rank 0's ``obj`` on every rank."""
    if not ranks.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def control_group(ranks: Ranks) -> dist.ProcessGroup | None:
    """A gloo group for host-side agreement (stop flags, checkpoint names) whatever the device."""
    if not ranks.distributed:
        return None
    group: dist.ProcessGroup = dist.new_group(backend="gloo")
    return group
