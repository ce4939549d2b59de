"""Embedding tables split row-wise across the ranks of a process group, for tables that outgrow
one core's memory.

Each rank holds one contiguous range of rows, ``ceil(rows / world_size)`` of them (the last
rank fewer, or none). A lookup is three steps every rank takes together: the ids of every rank
are gathered (``all_gather``), each rank looks up those of its range in its own rows (the others
give zeros), and the results are summed across the ranks (``all_reduce``), of which each rank
keeps its own ids' rows. Backward mirrors it: the summed gradients of every rank's rows reach
each rank, and its lookup's backward adds those of its range to its rows. So every rank must
look up the same number of ids at each call (the static shapes of a batch do), and the tables'
gradients come from every rank's loss, averaged over the ranks as DDP averages the dense ones
(the module's parameters are therefore left out of DDP's reduction).

Only ``all_gather`` and ``all_reduce`` are used: both are in every backend this trainer runs
(gloo on the CPU, NCCL, Neuron's), where gloo's ``reduce_scatter`` is not.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from trainer.recommend.model import TableFactory


def row_range(rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """The rows ``[start, stop)`` that ``rank`` of ``world_size`` holds of a table of ``rows``."""
    per_rank = math.ceil(rows / world_size)
    start = min(rows, rank * per_rank)
    return start, min(rows, start + per_rank)


class _SumOverRanks(torch.autograd.Function):
    """``all_reduce`` (sum) whose backward is the summed gradient times ``scale``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, scale: float) -> torch.Tensor:
        ctx.group, ctx.scale = group, scale
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        out = grad.contiguous().clone()
        dist.all_reduce(out, group=ctx.group)
        return out * ctx.scale, None, None


class RowShardedEmbedding(nn.Module):
    """A ``rows`` by ``dim`` table of which this rank holds ``weight``, rows ``[start, stop)``
    (see the module's documentation); called like ``nn.Embedding`` on an id tensor of any
    shape. ``group`` (default: the default group) is the ranks it is split across. Its rows are
    drawn standard normal, as ``nn.Embedding``'s, from a generator seeded by the global RNG
    and the rank, so each rank draws its own rows (not those of an unsplit table)."""

    def __init__(self, rows: int, dim: int, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.rows, self.dim, self.group = rows, dim, group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.start, self.stop = row_range(rows, self.rank, self.world_size)
        seed = int(torch.randint(0, 2**62, ()).item())  # the same on every rank
        generator = torch.Generator().manual_seed(seed + self.rank)
        shard = torch.randn(self.stop - self.start, dim, generator=generator)
        self.weight = nn.Parameter(shard)

    def load_rows(self, full: torch.Tensor) -> None:
        """Sets this rank's rows from the whole table ``full`` (``rows`` by ``dim``)."""
        with torch.no_grad():
            self.weight.copy_(full[self.start : self.stop])

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
            # (empty) weight, so that its backward joins the other ranks' all_reduce.
            vectors = self.weight.new_zeros(every.numel(), self.dim) + self.weight.sum()
        # Function.apply is untyped in torch's stubs.
        summed: torch.Tensor = _SumOverRanks.apply(  # type: ignore[no-untyped-call]
            vectors, self.group, 1.0 / self.world_size
        )
        own = summed[self.rank * flat.numel() : (self.rank + 1) * flat.numel()]
        return own.reshape(*ids.shape, self.dim)


def sharded_tables(group: dist.ProcessGroup | None = None) -> TableFactory:
    """A table factory of row-sharded tables across ``group`` (default: the default group)."""

    def table(rows: int, dim: int) -> nn.Module:
        return RowShardedEmbedding(rows, dim, group)

    return table


def sharded_parameter_names(model: nn.Module) -> list[str]:
    """The names of ``model``'s row-sharded parameters, which DDP must not average (each rank
    holds other rows)."""
    return [
        f"{name}.weight" if name else "weight"
        for name, module in model.named_modules()
        if isinstance(module, RowShardedEmbedding)
    ]
