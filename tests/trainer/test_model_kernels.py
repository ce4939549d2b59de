"""The eager CPU kernels of the model (RoPE and RMSNorm with backwards of their own) give the
values and gradients of the plain ops they stand in for, and run where they should."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer import model


def _plain_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def test_rope_matches_the_plain_rotation_and_its_gradient() -> None:
    torch.manual_seed(0)
    # A transposed view of a split, as the attention hands queries to RoPE.
    qkv = torch.randn(2, 16, 3 * 4 * 8, dtype=torch.float64, requires_grad=True)
    q = qkv[..., : 4 * 8].view(2, 16, 4, 8).transpose(1, 2)
    cos, sin = torch.randn(16, 4, dtype=torch.float64), torch.randn(16, 4, dtype=torch.float64)
    grad = torch.randn(2, 4, 16, 8, dtype=torch.float64)

    ours = model._RotateFunction.apply(q, cos, sin)
    (ours_grad,) = torch.autograd.grad(ours, qkv, grad)
    plain = _plain_rotate(q, cos, sin)
    (plain_grad,) = torch.autograd.grad(plain, qkv, grad)

    torch.testing.assert_close(ours, plain, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours_grad, plain_grad, rtol=0, atol=1e-12)


def test_rms_norm_matches_torch_and_its_gradients() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, 5, 16, dtype=torch.float64)

    ours = model._RMSNormFunction.apply(x, w, 1e-6)
    ours_grads = torch.autograd.grad(ours, (x, w), grad)
    plain = F.rms_norm(x, (16,), w, 1e-6)
    plain_grads = torch.autograd.grad(plain, (x, w), grad)

    torch.testing.assert_close(ours, plain, rtol=1e-12, atol=1e-12)
    for a, b in zip(ours_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t, v: model._RMSNormFunction.apply(t, v, 1e-6), (x, w))


def test_the_model_uses_the_kernels_in_eager_cpu_fp32() -> None:
    """The RMSNorm module in eager FP32 on CPU runs the hand-written backward (its grad_fn)."""
    norm = model.RMSNorm(8)
    x = torch.randn(2, 8, requires_grad=True)

    assert "_RMSNormFunction" in type(norm(x).grad_fn).__name__
    assert "_RMSNormFunction" not in type(norm.double()(x.double()).grad_fn).__name__
