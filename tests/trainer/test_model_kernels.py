"""The eager CPU kernels of the model (RoPE, RMSNorm, SwiGLU with and without its projections,
and the cross-entropy, with backwards of their own) give the values and gradients of the plain
ops they stand in for, and run where they should."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.tolerance import assert_fp32_close
from trainer import data, lora, model, parallel
from trainer.config import ModelConfig


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


def test_swiglu_matches_the_plain_product_and_its_gradient() -> None:
    torch.manual_seed(0)
    h = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 5, 8, dtype=torch.float64)

    ours = model._SwiGLUFunction.apply(h)
    (ours_grad,) = torch.autograd.grad(ours, h, grad)
    gate, up = h.chunk(2, dim=-1)
    plain = F.silu(gate) * up
    (plain_grad,) = torch.autograd.grad(plain, h, grad)

    torch.testing.assert_close(ours, plain, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours_grad, plain_grad, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(model._SwiGLUFunction.apply, (h,))


def test_gated_up_matches_the_plain_projections_and_their_gradients() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, 6, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 5, 8, dtype=torch.float64)

    ours = model._GatedUpFunction.apply(x, w)
    ours_grads = torch.autograd.grad(ours, (x, w), grad)
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    plain = F.silu(gate) * up
    plain_grads = torch.autograd.grad(plain, (x, w), grad)

    torch.testing.assert_close(ours, plain, rtol=1e-12, atol=1e-12)
    for a, b in zip(ours_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(model._GatedUpFunction.apply, (x, w))


def test_gated_up_computes_only_the_gradients_asked_for() -> None:
    """A frozen weight (LoRA's base) gets no gradient computed, not merely one autograd drops;
    the input's is still right. The output may be changed in place, as a product's may."""
    torch.manual_seed(0)
    x = torch.randn(7, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, 6, dtype=torch.float64)
    grad = torch.randn(7, 8, dtype=torch.float64)

    out = model._GatedUpFunction.apply(x, w)
    with torch.no_grad():
        # The node autograd made is the Function's context: what it saved, what it needs.
        grad_x, grad_w = model._GatedUpFunction.backward(out.grad_fn, grad)
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    (plain,) = torch.autograd.grad(F.silu(gate) * up, (x,), grad)

    assert grad_w is None
    torch.testing.assert_close(grad_x, plain, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: model._GatedUpFunction.apply(t, w), (x,))
    model._GatedUpFunction.apply(x, w).mul_(2).sum().backward()


def _ours_and_plain_cross_entropy(
    targets: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    # More rows than one chunk, so that the chunks' seams are covered.
    logits = torch.randn(model._CE_ROWS * 2 + 7, 11, dtype=torch.float64, requires_grad=True)
    grad = torch.tensor(1.7, dtype=torch.float64)
    # A copy: the backward writes the gradient over its input, a temporary in the model.
    ours = model._CrossEntropyFunction.apply(logits * 1, targets)
    (ours_grad,) = torch.autograd.grad(ours, logits, grad)
    plain = F.cross_entropy(logits, targets)
    (plain_grad,) = torch.autograd.grad(plain, logits, grad)
    return ours, plain, ours_grad, plain_grad


def test_cross_entropy_matches_torch_and_its_gradient_with_ignored_targets() -> None:
    targets = torch.randint(
        0, 11, (model._CE_ROWS * 2 + 7,), generator=torch.Generator().manual_seed(1)
    )
    targets[::5] = data.IGNORE_INDEX

    ours, plain, ours_grad, plain_grad = _ours_and_plain_cross_entropy(targets)

    torch.testing.assert_close(ours, plain, rtol=1e-12, atol=0)
    torch.testing.assert_close(ours_grad, plain_grad, rtol=0, atol=1e-12)
    assert ours_grad[::5].abs().max() == 0


def test_cross_entropy_with_no_target_is_nan_as_torch_gives_it() -> None:
    targets = torch.full((model._CE_ROWS * 2 + 7,), data.IGNORE_INDEX)

    ours, plain, ours_grad, plain_grad = _ours_and_plain_cross_entropy(targets)

    assert ours.isnan() and plain.isnan()
    # No target, no gradient: zeros as torch gives them, not NaN.
    torch.testing.assert_close(ours_grad, plain_grad, rtol=0, atol=0)
    assert not ours_grad.isnan().any()


def test_cross_entropy_backward_twice_is_an_error() -> None:
    logits = torch.randn(4, 3, requires_grad=True)
    loss = model._CrossEntropyFunction.apply(logits * 1, torch.tensor([0, 1, 2, 0]))
    loss.backward(retain_graph=True)

    with pytest.raises(RuntimeError, match="backward runs once"):
        loss.backward()


def test_the_model_uses_swiglu_and_cross_entropy_kernels_in_eager_cpu_fp32() -> None:
    cfg = ModelConfig(
        n_layer=1, n_head=2, d_model=16, seq_len=8, vocab_size=32, d_ff=24, llama_style=True
    )
    gpt = model.GPT(cfg)
    seen: list[str] = []
    block = gpt.blocks[0]
    assert isinstance(block, model.Block)
    block.mlp.down.register_forward_pre_hook(
        lambda _, args: seen.append(type(args[0].grad_fn).__name__)
    )
    idx = torch.randint(0, 32, (2, 8))

    assert "_CrossEntropyFunction" in type(gpt(idx, idx).grad_fn).__name__
    assert "_GatedUpFunction" in seen[-1]
    # Outside eager FP32 CPU: autocast, and FP64; then FP32 again.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gpt(idx, idx)
    assert "Function" not in seen[-1]
    assert "_CrossEntropyFunction" not in type(gpt.double()(idx, idx).grad_fn).__name__
    assert "Function" not in seen[-1]
    gpt.float()
    # A hook on the up projection runs: the kernel, which would skip it, stands aside.
    calls: list[int] = []
    hook = block.mlp.up.register_forward_hook(lambda *_: calls.append(1))
    gpt(idx, idx)
    assert calls == [1] and "_SwiGLUFunction" in seen[-1]
    hook.remove()
    # A LoRA adapter on the up projection: its own forward, then the SwiGLU kernel.
    lora.apply(gpt, cfg, lora.LoraSpec(2, 2.0, ("up_proj",)))
    gpt(idx, idx)
    assert "_SwiGLUFunction" in seen[-1]


@pytest.mark.parametrize(
    ("tied", "checkpointed", "adapted"),
    [
        (True, False, ()),
        (False, False, ()),
        (False, True, ()),
        (False, False, ("q_proj", "k_proj", "v_proj", "o_proj")),
        (False, False, ("gate_proj", "down_proj")),
    ],
)
def test_the_model_with_its_kernels_gives_the_plain_models_loss_and_gradients(
    monkeypatch: pytest.MonkeyPatch, tied: bool, checkpointed: bool, adapted: tuple[str, ...]
) -> None:
    """The whole model, kernels on and off, same weights and tokens (a third of the targets
    ignored): the logits' gradient written over the logits in place must not reach any other
    gradient. With LoRA adapters (``adapted``), the frozen base weights get none."""
    cfg = ModelConfig(
        n_layer=2,
        n_head=2,
        d_model=32,
        seq_len=16,
        vocab_size=64,
        llama_style=True,
        tie_embeddings=tied,
    )
    torch.manual_seed(0)
    gpt = model.GPT(cfg)
    if checkpointed:
        parallel.checkpoint_blocks(gpt)
    if adapted:
        lora.apply(gpt, cfg, lora.LoraSpec(2, 4.0, adapted))
        for name, p in gpt.named_parameters():
            if "lora_B" in name:
                # Drawn as the base weights are (std 0.02), a trained adapter's size: at std 1
                # they outweigh the base 50 to 1, and the two paths' LoRA gradients differed by
                # up to 272 FP32 roundings of their largest over 40 seeds, against 8 here.
                torch.nn.init.normal_(p, std=0.02)
    idx = torch.randint(0, 64, (3, 16))
    targets = torch.randint(0, 64, (3, 16))
    targets[:, ::3] = data.IGNORE_INDEX

    mlps: list[str] = []
    for wrapped in gpt.blocks:
        block = parallel._inner(wrapped)
        assert isinstance(block, model.Block)
        block.mlp.down.register_forward_pre_hook(
            lambda _, args: mlps.append(type(args[0].grad_fn).__name__)
        )

    def loss_and_grads() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        gpt.zero_grad(set_to_none=True)
        mlps.clear()
        loss = gpt(idx, targets)
        loss.backward()
        grads = {n: p.grad for n, p in gpt.named_parameters()}
        assert all((g is None) == (bool(adapted) and "lora_" not in n) for n, g in grads.items())
        return loss.detach(), {n: g.clone() for n, g in grads.items() if g is not None}

    kernel_loss, kernel_grads = loss_and_grads()
    # Either half adapted puts a LoRA layer in place of the fused up projection.
    kernel = "_SwiGLUFunction" if {"gate_proj", "up_proj"} & set(adapted) else "_GatedUpFunction"
    # Checkpointed blocks run their forward again in the backward.
    assert len(mlps) == cfg.n_layer * (2 if checkpointed else 1)
    assert all(kernel in name for name in mlps), mlps
    monkeypatch.setattr(model, "_eager_on", lambda x, devices: False)
    plain_loss, plain_grads = loss_and_grads()
    assert len(mlps) == cfg.n_layer * (2 if checkpointed else 1)
    assert not any("Function" in name for name in mlps), mlps

    assert_fp32_close(kernel_loss, plain_loss)
    assert kernel_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        assert_fp32_close(kernel_grads[name], grad, msg=name)
