"""A GPT-style decoder (GPT-2 or Llama flavour) whose forward returns the loss.

Static shapes only: the sequence length is fixed by the config, so a compiled graph is traced
once. ``forward(idx, targets)`` returns the mean cross-entropy so that the loss is part of the
compiled graph and stays on the device.

Packed rows (:mod:`trainer.packing`): ``forward(idx, targets, positions)`` takes each token's
position in its example. Positions pick the learned position embeddings (GPT-2 style) or the
RoPE angles (Llama style), and :func:`document_mask` makes of them the block-diagonal causal
mask that keeps each example's attention inside it, given to ``scaled_dot_product_attention``
as ``attn_mask``. In torch 2.13 the CPU flash-attention kernel takes such a mask (its checks,
``use_flash_attention_cpp`` in ``aten/src/ATen/native/transformers/sdp_utils_cpp.cpp``, refuse
only a mask of the wrong shape or one that needs a gradient); on CUDA the flash kernel refuses
any mask (``check_for_attn_mask``) and SDPA picks the memory-efficient or cuDNN kernel, which
take one. Without positions (a token stream) attention is plain causal (``is_causal``).
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import ModelConfig, RopeScaling
from trainer.data import IGNORE_INDEX


def _eager_on(x: torch.Tensor, devices: tuple[str, ...]) -> bool:
    """Whether the hand-written kernels below pay for ``x``: in eager mode on ``devices``. A
    compiler fuses the plain ops itself, and lazy devices (XLA, Neuron) trace them."""
    return x.device.type in devices and not torch.compiler.is_compiling()


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm with a backward of its own. On CPU torch decomposes ``F.rms_norm`` into about
    ten elementwise ops forward and backward; this one saves the input and the reciprocal RMS
    and does the backward in five passes."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps))
        ctx.save_for_backward(x, weight, rstd)
        return torch.mul(x, rstd).mul_(weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        normed = x * rstd
        grad_weight = (grad * normed).reshape(-1, x.shape[-1]).sum(0)
        scaled = grad * weight
        # d/dx of x * rstd: rstd * (g - x_hat * mean(g * x_hat)), with g the scaled gradient.
        dot = (scaled * normed).mean(-1, keepdim=True)
        return scaled.sub_(normed.mul_(dot)).mul_(rstd), grad_weight, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # CPU only: CUDA has a fused rms_norm kernel.
        if x.dtype == self.weight.dtype == torch.float32 and _eager_on(x, ("cpu",)):
            out: torch.Tensor = _RMSNormFunction.apply(x, self.weight, self.eps)  # type: ignore[no-untyped-call]
            return out
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    half = cfg.head_dim // 2
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(half, dtype=torch.float32) / half))
    if cfg.rope_scaling is not None:
        freqs = _llama3_scaled(freqs, cfg.rope_scaling)
    angles = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def _llama3_scaled(freqs: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3's frequency scaling (see :class:`trainer.config.RopeScaling`), as transformers'
    ``_compute_llama3_parameters`` applies it."""
    context = s.original_max_position_embeddings
    wavelength = 2 * math.pi / freqs
    stretched = torch.where(wavelength > context / s.low_freq_factor, freqs / s.factor, freqs)
    blend = (context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - blend) * stretched / s.factor + blend * stretched
    between = (wavelength >= context / s.high_freq_factor) & (
        wavelength <= context / s.low_freq_factor
    )
    return torch.where(between, blended, stretched)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # The tables are FP32 buffers (FSDP2's mixed precision casts parameters only): cast, so that
    # BF16 queries and keys are not promoted to FP32 while the values stay BF16.
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if _eager_on(x, ("cpu", "cuda")):
        out: torch.Tensor = _RotateFunction.apply(x, cos, sin)  # type: ignore[no-untyped-call]
        return out
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def _turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Each pair (a, b) of the two halves of ``x`` turned by the angle of (cos, sin), written
    straight into the halves of one new tensor: no temporaries and no concatenation."""
    a, b = x.chunk(2, dim=-1)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    first, second = out.chunk(2, dim=-1)
    torch.mul(a, cos, out=first).addcmul_(b, sin, value=-1)
    torch.mul(a, sin, out=second).addcmul_(b, cos)
    return out


class _RotateFunction(torch.autograd.Function):
    """RoPE saving no activations: a rotation's gradient is the rotation back (by -angle)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _turn(x, cos, sin)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _turn(grad, cos, -sin), None, None


# Rows of logits per chunk of the hand-written cross-entropy: a chunk's temporaries (1 MiB at a
# vocabulary of 4096) stay in cache and are reused by the allocator rather than mapped afresh.
_CE_ROWS = 64


class _CrossEntropyFunction(torch.autograd.Function):
    """The mean cross-entropy of ``(rows, vocab)`` logits against ``(rows,)`` targets, left out
    where the target is :data:`IGNORE_INDEX` (NaN when every target is), as ``F.cross_entropy``
    computes it: the negative log-softmax at the target. ``F.cross_entropy`` allocates a
    log-softmax, a zeroed gradient and the logits' gradient, each as large as the logits; this
    one takes the log-softmax a chunk of rows at a time, saves only the logits, and writes
    their gradient into their own memory: the logits are a temporary of :meth:`GPT.forward`
    that nothing else reads."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        valid = targets != IGNORE_INDEX
        picks = torch.where(valid, targets, 0).unsqueeze(1)
        picked = torch.empty(picks.shape, dtype=logits.dtype, device=logits.device)
        for rows, row_picks, out in zip(
            torch.split(logits, _CE_ROWS),
            torch.split(picks, _CE_ROWS),
            torch.split(picked, _CE_ROWS),
            strict=True,
        ):
            torch.gather(torch.log_softmax(rows, -1), 1, row_picks, out=out)
        count = valid.sum()
        ctx.save_for_backward(logits, picks, valid, count)
        ctx.spent = False
        return -torch.where(valid, picked.squeeze(1), 0.0).sum() / count

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.spent:
            # The first backward turned the saved logits into their gradient.
            raise RuntimeError("the cross-entropy's backward runs once (no retain_graph)")
        ctx.spent = True
        logits, picks, valid, count = ctx.saved_tensors
        # d/d logits = (softmax - one_hot(target)) * grad / count on rows with a target.
        weights = torch.where(valid, grad / count, 0.0).unsqueeze(1)
        for rows, row_weights in zip(
            torch.split(logits, _CE_ROWS), torch.split(weights, _CE_ROWS), strict=True
        ):
            torch.mul(torch.softmax(rows, -1), row_weights, out=rows)
        return logits.scatter_add_(1, picks, weights.neg()), None


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_dim
        gpt2 = not cfg.llama_style
        self.qkv = nn.Linear(
            cfg.d_model, (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim, bias=gpt2 or cfg.qkv_bias
        )
        self.proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=gpt2 or cfg.out_bias)
        # Qwen3: RMSNorm over each head's queries and keys, before RoPE.
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(
            [self.n_head * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.head_dim],
            dim=-1,
        )
        q = q.view(b, t, self.n_head, self.head_dim)
        k = k.view(b, t, self.n_kv, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = _rotate(q, *rope), _rotate(k, *rope)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=self.n_kv != self.n_head
        )
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(b, t, -1))
        return out


def _swiglu_backward(
    grad: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    grad_gate: torch.Tensor,
    grad_up: torch.Tensor,
) -> None:
    """Writes the gradients of ``silu(gate) * up`` into ``grad_gate`` and ``grad_up``."""
    torch.mul(grad, up, out=grad_gate)
    torch.ops.aten.silu_backward.grad_input(grad_gate, gate, grad_input=grad_gate)
    torch.ops.aten.silu.out(gate, out=grad_up).mul_(grad)


class _SwiGLUFunction(torch.autograd.Function):
    """``silu(gate) * up`` of the two halves of ``h``, saving ``h`` alone (autograd would also
    keep ``silu(gate)``). The backward writes both halves' gradients straight into one tensor
    shaped like ``h``: no temporaries and no concatenation of the halves' gradients. For an
    ``up`` projection that is not a plain linear layer (a LoRA adapter's)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h)
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (h,) = ctx.saved_tensors
        out = torch.empty(h.shape, dtype=h.dtype, device=h.device)
        _swiglu_backward(grad, *h.chunk(2, dim=-1), *out.chunk(2, dim=-1))
        return out


class _GatedUpFunction(torch.autograd.Function):
    """SwiGLU's projections and product in one: ``silu(x @ gate.T) * (x @ up.T)`` for the
    fused ``[gate; up]`` weight. Each half's product goes to a block of its own, where
    ``F.linear`` would interleave the halves in each row: on CPU, two products into contiguous
    blocks and the elementwise passes over them ran a Llama training step 2-3% faster (the
    fine-tuning benchmark's model, 60 interleaved step pairs in one process: 1.024 by wall
    time, 1.028 by CPU time). Saves the input, the weight and both projections; computes only
    the gradients asked for (none for a frozen weight: LoRA's base)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        width = weight.shape[0] // 2
        rows = x.reshape(-1, x.shape[-1])
        h = torch.empty((2, rows.shape[0], width), dtype=x.dtype, device=x.device)
        for part, block in zip(weight.chunk(2), h, strict=True):
            torch.mm(rows, part.t(), out=block)
        ctx.save_for_backward(x, weight, h)
        # Written into a tensor of the output's own shape: a view returned from a Function
        # could not be changed in place.
        out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
        torch.ops.aten.silu.out(h[0], out=out.view(-1, width)).mul_(h[1])
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, weight, h = ctx.saved_tensors
        width = weight.shape[0] // 2
        grads = torch.empty_like(h)
        _swiglu_backward(grad.reshape(-1, width), h[0], h[1], grads[0], grads[1])
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            gate, up = weight.chunk(2)
            grad_x = torch.mm(grads[0], gate).addmm_(grads[1], up).view(x.shape)
        if ctx.needs_input_grad[1]:
            rows = x.reshape(-1, x.shape[-1])
            grad_weight = torch.empty_like(weight)
            for part, block in zip(grads, grad_weight.chunk(2), strict=True):
                torch.mm(part.t(), rows, out=block)
        return grad_x, grad_weight


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.swiglu = cfg.llama_style
        bias = not cfg.llama_style
        self.up = nn.Linear(cfg.d_model, cfg.ffn_width * (2 if self.swiglu else 1), bias=bias)
        self.down = nn.Linear(cfg.ffn_width, cfg.d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.swiglu:
            # The exact (erf) GELU, as nanoGPT's model has it: on CPU, GPT-2's tanh form made a
            # `small` step 4% slower (make bench, issue 36), and no checkpoint of GPT-2's own
            # weights is loaded into this flavour, so nothing asks for that form.
            h = F.gelu(self.up(x))
        elif self._gated_up_kernel(x):
            h = _GatedUpFunction.apply(x, self.up.weight)  # type: ignore[no-untyped-call]
        else:
            h = self.up(x)
            if h.dtype == torch.float32 and _eager_on(h, ("cpu",)):
                h = _SwiGLUFunction.apply(h)  # type: ignore[no-untyped-call]
            else:
                gate, up = h.chunk(2, dim=-1)
                h = F.silu(gate) * up
        out: torch.Tensor = self.down(h)
        return out

    def _gated_up_kernel(self, x: torch.Tensor) -> bool:
        """Whether :class:`_GatedUpFunction` stands in for ``up``: a plain linear layer (not a
        LoRA adapter's) without bias or hooks of its own (the kernel does not call it), in
        FP32, eager on CPU, outside autocast."""
        up = self.up
        return (
            type(up) is nn.Linear
            and up.bias is None
            and not (up._forward_hooks or up._forward_pre_hooks)
            and up.weight.dtype == x.dtype == torch.float32
            and _eager_on(x, ("cpu",))
            and not torch.is_autocast_enabled("cpu")
        )


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        norm = RMSNorm if cfg.llama_style else nn.LayerNorm
        self.norm1, self.norm2 = norm(cfg.d_model, cfg.norm_eps), norm(cfg.d_model, cfg.norm_eps)
        self.attn, self.mlp = Attention(cfg), MLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope, mask)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


def document_mask(positions: torch.Tensor) -> torch.Tensor:
    """The ``(batch, 1, seq_len, seq_len)`` boolean attention mask (True: attend) of rows whose
    tokens have ``positions`` in their examples: an example starts where the position is 0, and
    a token attends to the tokens of its own example up to itself (causal, block-diagonal)."""
    example = (positions == 0).cumsum(-1)
    t = positions.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=positions.device).tril()
    return ((example.unsqueeze(-1) == example.unsqueeze(-2)) & causal).unsqueeze(1)


class GPT(nn.Module):
    """The decoder. ``forward(idx, targets, positions=None)`` takes int64 ``(batch, seq_len)``
    tensors."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = None if cfg.llama_style else nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        norm = RMSNorm if cfg.llama_style else nn.LayerNorm
        self.norm = norm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.init_rope()
        self.tie_weights()
        # A model on the meta device has no values to draw, and drawing them costs as much
        # Python as a real init (loading a checkpoint builds one or two).
        if self.tok.weight.device.type != "meta":
            self._init_weights()

    def _init_weights(self) -> None:
        self.apply(self._init)
        # GPT-2's scaled init of the residual projections keeps the residual stream's variance flat.
        for name, p in self.named_parameters():
            if name.endswith(("proj.weight", "down.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.cfg.n_layer))

    def init_rope(self) -> None:
        """(Re)computes the RoPE tables (non-persistent FP32 buffers; none in the GPT-2 style) on
        the default device: after building on the meta device and loading weights, which leaves
        them unset."""
        if self.cfg.llama_style:
            cos, sin = _rope_tables(self.cfg)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def tie_weights(self) -> None:
        """Shares the embedding with the output head; call again after a move that unties them
        (``model.to(xla_device)`` does)."""
        if self.cfg.tie_embeddings:
            self.head.weight = self.tok.weight

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def logits(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``(batch, seq_len, vocab_size)`` next-token logits for int64 ``(batch, seq_len)``;
        with ``positions`` (each token's position in its example, as packed rows have them)
        attention stays inside each example (see the module's documentation)."""
        out: torch.Tensor = self.head(self.hidden(idx, positions))
        return out

    def hidden(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``(batch, seq_len, d_model)``: the last block's output after the final norm, what
        the output head (:meth:`logits`) or a task's head (a classifier's) reads."""
        x = self.tok(idx)
        rope = None
        mask = None if positions is None else document_mask(positions)
        if self.pos is not None:
            x = x + (self.pos.weight if positions is None else self.pos(positions))
        elif positions is None:
            rope = (self.rope_cos, self.rope_sin)
        else:
            # (batch, 1, seq_len, half): each row's angles, broadcast over the heads.
            cos, sin = cast(torch.Tensor, self.rope_cos), cast(torch.Tensor, self.rope_sin)
            rope = (cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))
        for block in self.blocks:
            x = block(x, rope, mask)
        out: torch.Tensor = self.norm(x)
        return out

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The mean cross-entropy of :meth:`logits` against ``targets``, in FP32; targets of
        -100 (cross_entropy's default ``ignore_index``) are left out."""
        logits = self.logits(idx, positions)
        rows = logits.float().view(-1, logits.size(-1))
        if rows.dtype == logits.dtype and _eager_on(rows, ("cpu",)):
            loss: torch.Tensor = _CrossEntropyFunction.apply(rows, targets.reshape(-1))  # type: ignore[no-untyped-call]
            return loss
        return F.cross_entropy(rows, targets.reshape(-1))

    def num_params(self) -> int:
        """Unique parameters (a tied embedding counts once)."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6N for the matmuls (forward and backward) plus attention
        scores and values, 12 * layers * width * seq_len (PaLM appendix B). N leaves out the
        lookup tables (positions, and the input embedding when it is not the tied output head)."""
        n = self.num_params()
        if self.pos is not None:
            n -= self.pos.weight.numel()
        if not self.cfg.tie_embeddings:
            n -= self.tok.weight.numel()
        return 6.0 * n + 12.0 * self.cfg.n_layer * self.cfg.d_model * self.cfg.seq_len
