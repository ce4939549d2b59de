"""The benchmark's nanoGPT-equivalent baseline is the model it claims to be."""

import math

import numpy as np
import torch

from bench.nanogpt_baseline import Baseline, optimizer, tokens_per_s
from tests.tolerance import assert_fp32_close
from trainer.config import PRESETS
from trainer.model import GPT


def _baseline(bias: bool) -> Baseline:
    m = PRESETS["small"].model
    return Baseline(
        layers=m.n_layer,
        heads=m.n_head,
        width=m.d_model,
        seq_len=m.seq_len,
        vocab=m.vocab_size,
        bias=bias,
    )


def test_with_biases_it_has_the_small_presets_parameters() -> None:
    """Like for like: the same tied embedding, learned positions, widths and biases."""
    trainer = GPT(PRESETS["small"].model)
    assert _baseline(bias=True).num_params() == trainer.num_params()


def test_by_default_like_nanogpt_it_has_no_biases() -> None:
    trainer = GPT(PRESETS["small"].model)
    biases = sum(p.numel() for name, p in trainer.named_parameters() if name.endswith("bias"))
    baseline = _baseline(bias=False)
    assert not [name for name, _ in baseline.named_parameters() if name.endswith("bias")]
    assert baseline.num_params() == trainer.num_params() - biases


def test_like_for_like_it_computes_the_presets_function() -> None:
    """With biases, and the preset's weights copied in, the loss and a block's output are the
    trainer's (the exact GELU on both sides): the same function, so the same work per token."""
    torch.manual_seed(0)
    trainer = GPT(PRESETS["small"].model)
    baseline = _baseline(bias=True)
    renames = {
        "tok.": "wte.",
        "pos.": "wpe.",
        "blocks.": "layers.",
        "attn.proj.": "attn.out.",
        "mlp.up.": "fc.",
        "mlp.down.": "out.",
    }
    theirs = {}
    for name, p in trainer.named_parameters():
        for old, new in renames.items():
            name = name.replace(old, new)
        theirs[name] = p
    mine = dict(baseline.named_parameters())
    assert mine.keys() == theirs.keys()
    with torch.no_grad():
        for name, p in mine.items():
            p.copy_(theirs[name])
    idx, targets = torch.randint(0, 256, (2, 2, 256))
    torch.testing.assert_close(baseline(idx, targets), trainer(idx, targets))
    # The loss at GPT-2's init hides the GELU's form (the tanh one gives the same loss); a
    # block's output on a small residual does not (the tanh form: ~1200 roundings off).
    x = 0.01 * torch.randn(2, 256, PRESETS["small"].model.d_model)
    with torch.no_grad():
        assert_fp32_close(baseline.layers[0](x), trainer.blocks[0](x, None))


def test_head_is_tied_and_the_first_loss_is_uniform() -> None:
    torch.manual_seed(0)
    baseline = _baseline(bias=False)
    assert baseline.head.weight is baseline.wte.weight
    idx, targets = torch.randint(0, 256, (2, 2, 256))
    assert math.isclose(baseline(idx, targets).item(), math.log(256), rel_tol=0.02)


def test_adamw_is_fused_only_on_cuda_as_nanogpt_chooses() -> None:
    opt = optimizer(_baseline(bias=False), lr=1e-3, weight_decay=0.1)
    assert not any(g["fused"] for g in opt.param_groups)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_the_loop_trains_and_reports_tokens_per_second() -> None:
    tokens = np.arange(1000, dtype=np.uint16) % 64
    rate = tokens_per_s(
        tokens,
        layers=1,
        heads=2,
        width=32,
        seq_len=16,
        vocab=64,
        batch=2,
        bias=False,
        warmup_steps=1,
        measured_steps=2,
    )
    assert rate > 0
