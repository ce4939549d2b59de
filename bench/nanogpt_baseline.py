"""A nanoGPT-equivalent training loop, written here, as the trainer benchmark's baseline.

It makes the choices karpathy/nanoGPT's model.py and train.py make (read at commit 3adf61e1):
learned position embeddings looked up per step, pre-norm blocks with LayerNorm, one fused
query/key/value projection and ``scaled_dot_product_attention(is_causal=True)``, a GELU MLP four
times the width, the output head tied to the token embedding, GPT-2's init with the residual
projections scaled by ``1/sqrt(2 * layers)``, AdamW with decay on matrices only and
``fused=True`` only on CUDA, the cosine learning-rate schedule set on every step, gradient
clipping at 1.0, ``zero_grad(set_to_none=True)``, batches of random windows stacked from a
uint16 token file memory-mapped afresh for every batch, and ``loss.item()`` on every step (its
default ``log_interval`` of 1). Dropout is left out: nanoGPT's default rate is 0, where
``nn.Dropout`` returns its input.

One architecture choice is an option, because the trainer's ``small`` preset makes it
differently from nanoGPT's default: ``bias`` (nanoGPT: off by default, ``--bias=True`` turns it
on; the preset: on). With ``bias=True`` this is nanoGPT's train.py with ``--bias=True`` and
computes the preset's function (the exact GELU on both sides), run as docs/performance.md's
by-hand check runs it: on CPU, fp32, eager and one micro-batch a step
(``--gradient_accumulation_steps=1``; its default of 40 would spread the optimizer step over 40
micro-batches, and its default ``--compile=True`` is not eager).

Run as a script (``python bench/nanogpt_baseline.py --tokens FILE ...``, see ``--help``) it is a
process of its own that imports torch and numpy only, never the trainer, and prints one JSON
line: its tokens/s and the environment it ran with.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, bias: bool) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=bias)
        self.out = nn.Linear(width, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
            for z in self.qkv(x).split(c, dim=2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.out(y.transpose(1, 2).contiguous().view(b, t, c))
        return out


class Layer(nn.Module):
    def __init__(self, width: int, heads: int, bias: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, bias=bias)
        self.attn = SelfAttention(width, heads, bias)
        self.norm2 = nn.LayerNorm(width, bias=bias)
        self.fc = nn.Linear(width, 4 * width, bias=bias)
        self.out = nn.Linear(4 * width, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        out: torch.Tensor = x + self.out(F.gelu(self.fc(self.norm2(x))))
        return out


class Baseline(nn.Module):
    """The decoder; ``forward(idx, targets)`` returns the mean cross-entropy."""

    def __init__(
        self,
        *,
        layers: int,
        heads: int,
        width: int,
        seq_len: int,
        vocab: int,
        bias: bool,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq_len, width)
        self.layers = nn.ModuleList(Layer(width, heads, bias) for _ in range(layers))
        self.norm = nn.LayerNorm(width, bias=bias)
        self.head = nn.Linear(width, vocab, bias=False)
        self.wte.weight = self.head.weight
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("out.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))

    def num_params(self) -> int:
        """Unique parameters (the tied embedding counts once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def optimizer(model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=fused)


def cosine_lr(step: int, *, peak: float, warmup: int, total: int) -> float:
    if step < warmup:
        return peak * (step + 1) / (warmup + 1)
    ratio = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak / 10 + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (peak - peak / 10)


def tokens_per_s(
    tokens: np.ndarray | Path,
    *,
    layers: int,
    heads: int,
    width: int,
    seq_len: int,
    vocab: int,
    batch: int,
    bias: bool,
    warmup_steps: int,
    measured_steps: int,
) -> float:
    """Trains on random windows of ``tokens`` (an array, or a uint16 file that is memory-mapped
    for every batch, as nanoGPT's ``get_batch`` does) on CPU, fp32, eager, and returns the
    tokens/s of the median step of the ``measured_steps`` after ``warmup_steps``. A step is
    timed as nanoGPT's train.py times an iteration (its ``dt``): from the end of one step to
    the end of the next (nanoGPT reads the clock just before its ``loss.item()``, here just
    after: on CPU the loss is already computed). The median, not the mean: a burst of another
    process's work on a shared machine moves a mean of a few steps by more than the difference
    being measured."""
    torch.manual_seed(1337)
    model = Baseline(
        layers=layers,
        heads=heads,
        width=width,
        seq_len=seq_len,
        vocab=vocab,
        bias=bias,
    )
    opt = optimizer(model, lr=1e-3, weight_decay=0.1)
    total = warmup_steps + measured_steps

    def batch_of_windows() -> tuple[torch.Tensor, torch.Tensor]:
        data = np.memmap(tokens, dtype=np.uint16, mode="r") if isinstance(tokens, Path) else tokens
        starts = torch.randint(len(data) - seq_len, (batch,)).tolist()
        x = torch.stack([torch.from_numpy(data[i : i + seq_len].astype(np.int64)) for i in starts])
        y = torch.stack(
            [torch.from_numpy(data[i + 1 : i + 1 + seq_len].astype(np.int64)) for i in starts]
        )
        return x, y

    x, y = batch_of_windows()
    step_times: list[float] = []
    began = time.perf_counter()
    for step in range(total):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, peak=1e-3, warmup=1, total=total)
        loss = model(x, y)
        x, y = batch_of_windows()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        ended = time.perf_counter()
        if step >= warmup_steps:
            step_times.append(ended - began)
        began = ended
    return batch * seq_len / statistics.median(step_times)


def main(argv: list[str] | None = None) -> int:
    """Runs :func:`tokens_per_s` on ``--tokens`` and prints ``{"tokens_per_s", "env",
    "torch_threads"}`` as one JSON line; ``env`` is this process's whole environment."""
    p = argparse.ArgumentParser(description="nanoGPT-equivalent loop: tokens/s on CPU, fp32")
    p.add_argument("--tokens", type=Path, required=True, help="uint16 token file (train.bin)")
    for name in ("layers", "heads", "width", "seq-len", "vocab", "batch"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--bias", action="store_true", help="GPT-2's biases (nanoGPT's --bias=True)")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--measured-steps", type=int, default=4)
    args = p.parse_args(argv)
    rate = tokens_per_s(
        args.tokens,
        layers=args.layers,
        heads=args.heads,
        width=args.width,
        seq_len=args.seq_len,
        vocab=args.vocab,
        batch=args.batch,
        bias=args.bias,
        warmup_steps=args.warmup_steps,
        measured_steps=args.measured_steps,
    )
    record = {
        "tokens_per_s": rate,
        "env": dict(os.environ),
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
