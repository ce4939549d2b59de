"""AdamW with weight decay on matrices only; the learning rate as a pure function of the step."""

from __future__ import annotations

import math

import torch
from torch import nn


def lr_at(step: int, *, peak: float, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """Linear warm-up over ``warmup`` steps to ``peak`` (step 0 already trains at
    ``peak / warmup``), then cosine decay to ``peak * min_ratio`` at ``total``; flat after it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    floor = peak * min_ratio
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


# Devices whose fused AdamW kernel torch ships and this trainer runs on. XLA has none, and the
# Neuron device's support is unknown, so they keep torch's default.
FUSED_DEVICES = frozenset({"cpu", "cuda"})


def fusable(params: list[nn.Parameter]) -> bool:
    """True when every parameter is a plain tensor on a device in :data:`FUSED_DEVICES`
    (FSDP2's sharded DTensor parameters are not)."""
    return bool(params) and all(
        p.device.type in FUSED_DEVICES and type(p.data) is torch.Tensor for p in params
    )


def build(
    model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float]
) -> torch.optim.AdamW:
    """AdamW; norms, biases and other vectors are not decayed (decaying them only hurts).

    Fused where :func:`fusable`: one pass over each parameter and its state instead of eight;
    the update is AdamW's either way.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fusable(params) or None)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Python floats, not tensors: the learning rate lives outside any compiled graph, so
    changing it never triggers a recompile."""
    for group in optimizer.param_groups:
        group["lr"] = lr
