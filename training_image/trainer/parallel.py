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
    model: nn.Module,
    ranks: Ranks,
    strategy: Parallel,
    backend: Backend,
    *,
    activation_checkpointing: bool = False,
) -> tuple[nn.Module, Callable[..., torch.Tensor]]:
    """The model for data parallelism and the callable that runs its forward, compiled by
    ``backend``; with ``activation_checkpointing`` (default False) each of ``model.blocks``
    first goes into :func:`checkpoint_blocks`.

    One rank: the model, compiled whole. ``ddp``: DDP around the model whose forward is compiled,
    as DDP's own forward (its logging and bucket bookkeeping) is not traceable in one graph; on a
    backend that reduces gradients itself (XLA) the model is not wrapped, so gradients are
    reduced once. ``fsdp``: FSDP2 with each block sharded on its own in the backend's mixed
    precision, each block's forward compiled before sharding (the torchtitan pattern): Dynamo
    does not trace FSDP2's hooks, so a whole-model one-graph compile breaks at each block.
    """
    if activation_checkpointing:
        checkpoint_blocks(model)
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


def checkpoint_blocks(model: nn.Module) -> int:
    """Puts each of ``model.blocks`` in a non-reentrant activation-checkpoint wrapper
    (torch.distributed's ``checkpoint_wrapper``, which runs ``torch.utils.checkpoint``): its
    forward keeps only the block's inputs, and backward runs the block's forward again. Under
    FSDP2 the wrapper is what :func:`_shard` shards, so the gather of a block's parameters stays
    outside the recomputed region (the torchtitan pattern). The wrapped block's own forward is
    compiled where ``backend`` compiles per block (FSDP2) before it is wrapped. State-dict keys
    do not change: the wrapper's hooks drop its ``_checkpoint_wrapped_module`` prefix. Returns
    the number of blocks wrapped."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        return 0
    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    return len(blocks)


def _inner(block: nn.Module) -> nn.Module:
    """The block a checkpoint wrapper holds, or ``block`` itself."""
    inner = getattr(block, "_checkpoint_wrapped_module", block)
    return inner if isinstance(inner, nn.Module) else block


def _shard(model: nn.Module, backend: Backend) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    policy = backend.mixed_precision()
    for block in getattr(model, "blocks", []):
        _compile_forward(_inner(block), backend)
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


# The attribute (True) of a parameter of which each rank holds other rows
# (trainer.recommend.sharding): its gradient norm sums over the ranks.
ROW_SHARDED = "row_sharded"


def clip_gradients(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clips ``model``'s gradients at a total norm of ``max_norm`` and returns the norm before
    clipping: ``clip_grad_norm_``'s, except that parameters marked ``row_sharded`` (each rank
    holds other rows of them: :mod:`trainer.recommend.sharding`) count every rank's rows, so
    that every rank scales by the same factor and the replicated weights stay equal."""
    params = [p for p in model.parameters() if p.grad is not None]
    split = [p.grad for p in params if p.grad is not None and getattr(p, ROW_SHARDED, False)]
    if not split:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    whole = [p.grad for p in params if p.grad is not None and not getattr(p, ROW_SHARDED, False)]
    squares = torch.nn.utils.get_total_norm(split) ** 2
    dist.all_reduce(squares)
    own = torch.nn.utils.get_total_norm(whole) ** 2 if whole else torch.zeros_like(squares)
    total = (squares + own).sqrt()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


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


def all_gather_object(obj: object, ranks: Ranks, group: dist.ProcessGroup | None) -> list[object]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not ranks.distributed:
        return [obj]
    box: list[object] = [None] * ranks.world_size
    dist.all_gather_object(box, obj, group=group)
    return box


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
