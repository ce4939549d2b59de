import math
from itertools import pairwise

import pytest
import torch

from trainer import optim
from trainer.config import PRESETS
from trainer.model import GPT
from trainer.optim import lr_at


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 1e-3 / 10),  # warm-up starts above zero so step 0 trains
        (4, 5e-3 / 10),
        (9, 1e-3),  # last warm-up step reaches the peak
        (10, 1e-3),  # cosine starts at the peak
        (55, 1e-4 + 0.5 * 9e-4),  # halfway down the cosine
        (100, 1e-4),  # floor at min_ratio * peak
        (150, 1e-4),  # and flat after the end
    ],
)
def test_warmup_then_cosine(step: int, expected: float) -> None:
    assert math.isclose(
        lr_at(step, peak=1e-3, warmup=10, total=100, min_ratio=0.1), expected, rel_tol=1e-12
    )


def test_cosine_is_monotone_after_warmup() -> None:
    values = [lr_at(s, peak=1.0, warmup=5, total=50) for s in range(5, 51)]
    assert all(a >= b for a, b in pairwise(values))


def test_no_warmup() -> None:
    assert lr_at(0, peak=2.0, warmup=0, total=10) == 2.0


def _tiny_with_grads(seed: int) -> GPT:
    torch.manual_seed(seed)
    model = GPT(PRESETS["tiny"].model)
    idx = torch.randint(0, 256, (2, 64))
    model(idx, idx).backward()
    return model


def test_adamw_is_fused_on_cpu() -> None:
    """One pass per parameter instead of eight kernels: the optimizer step of `small` on
    this CPU (bench/trainer_bench.py)."""
    opt = optim.build(_tiny_with_grads(0), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    assert [g["fused"] for g in opt.param_groups] == [True, True]


def test_no_fused_adamw_where_torch_has_no_kernel() -> None:
    with torch.device("meta"):
        model = GPT(PRESETS["tiny"].model)
    opt = optim.build(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    assert not any(g["fused"] for g in opt.param_groups)


def test_fused_update_is_adamw_with_decay_on_matrices_only() -> None:
    """Three steps of the built optimizer match torch's reference (per-tensor) AdamW with the
    same two groups."""
    fused, reference = _tiny_with_grads(1), _tiny_with_grads(1)
    opt = optim.build(fused, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95))
    params = list(reference.parameters())
    ref = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=1e-2,
        betas=(0.9, 0.95),
        foreach=False,
    )
    for _ in range(3):
        opt.step()
        ref.step()
    for (name, a), b in zip(fused.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
