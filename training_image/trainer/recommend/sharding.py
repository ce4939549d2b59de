"""Embedding tables split row-wise across the ranks of a process group, for tables that outgrow
one core's memory.

Each rank holds one contiguous range of rows, ``ceil(rows / world_size)`` of them (the last
rank fewer, or none). A lookup is three steps every rank takes together: the ids of every rank
are gathered (``all_gather``), each rank looks up those of its range in its own rows (the others
give zeros), and the results are summed across the ranks and scattered
(``reduce_scatter_single``), so that each rank receives the rows of its own ids. Backward
mirrors it: every rank's gradient rows are gathered on each rank (``all_gather_single``), and
its lookup's backward adds those of its range to its rows. So every rank must
look up the same number of ids at each call (the static shapes of a batch do), and the tables'
gradients come from every rank's loss, averaged over the ranks as DDP averages the dense ones
(the module's parameters are therefore left out of DDP's reduction).

Why these forms (torch 2.13): an ``all_reduce`` in place of the reduce-scatter would send every
rank's rows to every rank, ``world_size`` times the bytes; the list form ``reduce_scatter``
is not traced by Dynamo (a compiled step breaks its graph, which ``fullgraph=True`` refuses),
where ``reduce_scatter_single`` and ``all_gather_single`` are (``reduce_scatter_tensor``, the
older name, is deprecated). Run here on gloo, eager and compiled (``aot_eager``); NCCL's and
the Neuron backend's were not tried.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from trainer.parallel import ROW_SHARDED
from trainer.recommend.model import TableFactory


def row_range(rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """The rows ``[start, stop)`` that ``rank`` of ``world_size`` holds of a table of ``rows``."""
    per_rank = math.ceil(rows / world_size)
    start = min(rows, rank * per_rank)
    return start, min(rows, start + per_rank)


class _SumToOwners(torch.autograd.Function):
    """Sums ``world_size`` equal blocks of rows over the ranks, block ``r`` to rank ``r``
    (``reduce_scatter_single``); its backward gathers every rank's gradient block
    (``all_gather_single``), times ``scale``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, world_size: int, scale: float) -> Any:
        ctx.group, ctx.world_size, ctx.scale = group, world_size, scale
        out = x.new_empty(x.shape[0] // world_size, *x.shape[1:])
        dist.reduce_scatter_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out = grad.new_empty(grad.shape[0] * ctx.world_size, *grad.shape[1:])
        dist.all_gather_single(out, grad.contiguous(), group=ctx.group)
        return out * ctx.scale, None, None, None


class RowShardedEmbedding(nn.Module):
    """A ``rows`` by ``dim`` table of which this rank holds :attr:`weight`, rows ``[start,
    stop)`` (see the module's documentation); called like ``nn.Embedding`` on an id tensor of
    any shape. ``group`` (default: the default group) is the ranks it is split across.

    Its rows are those an ``nn.Embedding(rows, dim)`` would draw from the global RNG at this
    point (standard normal), drawn whole on the host and kept in part, so that a split model
    starts where the unsplit one does. The parameter's name is :attr:`shard_name`,
    ``rows_START_STOP``: each rank's part has a name of its own in a checkpoint that every rank
    writes its part of, and the parameter carries :data:`ROW_SHARDED`, for a gradient norm
    over every rank's rows (:func:`trainer.parallel.clip_gradients`)."""

    def __init__(self, rows: int, dim: int, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.rows, self.dim, self.group = rows, dim, group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.start, self.stop = row_range(rows, self.rank, self.world_size)
        whole = torch.empty(rows, dim).normal_()  # what nn.Embedding's reset_parameters draws
        shard = nn.Parameter(whole[self.start : self.stop].clone())
        setattr(shard, ROW_SHARDED, True)
        self.shard_name = f"rows_{self.start}_{self.stop}"
        self.register_parameter(self.shard_name, shard)

    @property
    def weight(self) -> nn.Parameter:
        """This rank's rows."""
        shard: nn.Parameter = getattr(self, self.shard_name)
        return shard

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        gathered = [torch.empty_like(flat) for _ in range(self.world_size)]
        dist.all_gather(gathered, flat.contiguous(), group=self.group)
        every = torch.cat(gathered)
        mine = (every >= self.start) & (every < self.stop)
        local = torch.where(mine, every - self.start, torch.zeros_like(every))
        if self.stop > self.start:
            vectors = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        else:
            # A rank past the table's last row holds none; its zeros still depend on the
            # (empty) weight, so that its backward joins the other ranks' all_gather.
            vectors = self.weight.new_zeros(every.numel(), self.dim) + self.weight.sum()
        # Function.apply is untyped in torch's stubs.
        own: torch.Tensor = _SumToOwners.apply(  # type: ignore[no-untyped-call]
            vectors, self.group, self.world_size, 1.0 / self.world_size
        )
        return own.reshape(*ids.shape, self.dim)


def sharded_tables(group: dist.ProcessGroup | None = None) -> TableFactory:
    """A table factory of row-sharded tables across ``group`` (default: the default group)."""

    def table(rows: int, dim: int) -> nn.Module:
        return RowShardedEmbedding(rows, dim, group)

    return table


def leave_out_of_ddp(model: nn.Module) -> None:
    """Marks ``model``'s row-sharded parameters as ones DDP does not average (set before DDP
    wraps it): torch's ``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``,
    the workaround torch names for this (pytorch/pytorch#43690) until a public API exists."""
    from torch.nn.parallel import DistributedDataParallel

    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(  # type: ignore[no-untyped-call]
        model, sharded_parameter_names(model)
    )


def sharded_parameter_names(model: nn.Module) -> list[str]:
    """The names of ``model``'s row-sharded parameters, which DDP must not average (each rank
    holds other rows)."""
    return [
        f"{name}.{module.shard_name}" if name else module.shard_name
        for name, module in model.named_modules()
        if isinstance(module, RowShardedEmbedding)
    ]


_SHARD_KEY = re.compile(r"(?P<table>.*)\.rows_(?P<start>\d+)_(?P<stop>\d+)$")


def whole_tables(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (a checkpoint's model state, every rank's part read) with each row-sharded
    table's parts (``TABLE.rows_START_STOP``) joined in row order as ``TABLE.weight``, the
    state of the same model unsplit.

    Raises:
        ValueError: a table's parts do not cover its rows from 0 without a gap.
    """
    parts: dict[str, list[tuple[int, int, torch.Tensor]]] = {}
    whole = {}
    for key, value in state.items():
        found = _SHARD_KEY.match(key)
        if found is None:
            whole[key] = value
            continue
        start, stop = int(found["start"]), int(found["stop"])
        parts.setdefault(found["table"], []).append((start, stop, value))
    for table, pieces in parts.items():
        pieces.sort(key=lambda piece: piece[0])
        ends = [0, *(stop for _, stop, _ in pieces)]
        if [start for start, _, _ in pieces] != ends[:-1]:
            raise ValueError(f"{table}: the parts of rows {ends} leave a gap")
        whole[f"{table}.weight"] = torch.cat([value for _, _, value in pieces])
    return whole
