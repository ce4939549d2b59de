"""LoRA that works with its defaults: learning rate 2e-4, no weight decay on the adapters, every
linear projection targeted; the frozen base in BF16 where the backend autocasts, adapters and
AdamW state in FP32; the settings printed at start and recorded in the metrics header. Full
fine-tuning keeps its own defaults."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import ClassVar

import hf_tiny
import pytest
import torch

from trainer import cli, device, hf, hf_config, loop, lora, metrics, parallel
from trainer.config import TrainConfig
from trainer.model_spec import lora_spec, resolve

_run = functools.partial(hf_tiny.run_args, lr="0", max_steps="2")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_tiny.model_dir(tmp_path_factory.mktemp("tiny"), "qwen3")


def _config(*flags: str) -> TrainConfig:
    return cli.train_config(cli._parser().parse_args(["run", "--data", "d", *flags]))


def test_lora_defaults_and_full_fine_tuning_defaults(tiny: Path) -> None:
    tuned = _config("--model", str(tiny), "--lora-rank", "8")
    assert (tuned.peak_lr, tuned.decay) == (2e-4, 0.0)
    assert lora_spec(tuned) == lora.LoraSpec(8, 8.0, lora.TARGETS)
    full = _config("--model", str(tiny))
    assert (full.peak_lr, full.decay, lora_spec(full)) == (2e-5, 0.1, None)
    mine = _config(
        "--model", str(tiny), "--lora-rank", "8", "--lr", "1e-3", "--weight-decay", "0.01"
    )
    assert (mine.peak_lr, mine.decay) == (1e-3, 0.01)
    preset = _config()
    assert (preset.peak_lr, preset.decay) == (3e-3, 0.1)
    with pytest.raises(ValueError, match=r"weight_decay must be a number >= 0, got -1.0"):
        _config("--weight-decay", "-1").validate()


def test_a_lora_run_prints_its_settings_and_records_them(
    tiny: Path, model_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*_run(tiny, model_data, tmp_path / "ck", "--lora-rank", "2")]
    assert cli.main([*argv, "--metrics", str(tmp_path / "m.jsonl")]) == 0
    settings = {
        "lr": 2e-4,
        "weight_decay": 0.0,
        "lora": {"rank": 2, "alpha": 2.0, "targets": list(lora.TARGETS)},
        "frozen_dtype": "fp32",  # CPU computes in FP32
        "compile": "none",
    }
    printed = [line for line in capsys.readouterr().err.splitlines() if "run settings" in line]
    assert printed == [f"trn-train: run settings {json.dumps(settings)}"]
    (header,) = metrics.headers(tmp_path / "m.jsonl")
    assert header["settings"] == settings
    state = hf_tiny.checkpoint_state(tmp_path / "ck", 2)
    groups = state["optimizer"]["param_groups"]  # type: ignore[index]
    assert {g["weight_decay"] for g in groups} == {0.0}


class _Bf16Cpu(device.Backend):
    """The CPU backend with BF16 autocast, as CUDA and Neuron run: what a LoRA base is kept in
    follows the autocast dtype."""

    autocast_dtype: ClassVar[torch.dtype | None] = torch.bfloat16


def test_the_frozen_base_is_bf16_where_the_backend_autocasts(tiny: Path) -> None:
    cfg = _config("--model", str(tiny), "--lora-rank", "2", "--seq-len", "16", "--device", "cpu")
    backend = _Bf16Cpu(compile_backend="none").start()
    model, forward = loop.build_model(cfg, resolve(cfg), parallel.Ranks(), backend)
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    adapters = {n for n, p in model.named_parameters() if p.requires_grad}
    assert adapters and all(".lora_" in n for n in adapters)
    assert {dtypes[n] for n in adapters} == {torch.float32}
    products = ("qkv.weight", "proj.weight", "up.weight", "down.weight", "head.weight")
    matrices = {n for n in frozen if n.endswith(products)}
    # Four per block and the output head (Qwen3's is not tied to the embedding).
    assert len(matrices) == 4 * 2 + 1 and {dtypes[n] for n in matrices} == {torch.bfloat16}
    # The embedding and the norms: FP32, so the residual stream stays FP32.
    assert {dtypes[n] for n in frozen - matrices} == {torch.float32}

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(0))
    with backend.autocast():
        loss = forward(tokens[:, :-1], tokens[:, 1:])
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    assert torch.isfinite(loss)
    assert {s["exp_avg"].dtype for s in optimizer.state.values()} == {torch.float32}
    # The same forward in FP32 on the loaded weights: BF16 products, close to it.
    cfg32 = hf_config.model_config(tiny, seq_len=16)
    reference = hf.load_pretrained(tiny, cfg32)
    with torch.no_grad():
        want = float(reference(tokens[:, :-1], tokens[:, 1:]))
    assert float(loss.detach()) == pytest.approx(want, rel=2e-2)


def test_full_fine_tuning_casts_nothing(tiny: Path) -> None:
    cfg = _config("--model", str(tiny), "--seq-len", "16", "--device", "cpu")
    backend = _Bf16Cpu(compile_backend="none").start()
    model, _ = loop.build_model(cfg, resolve(cfg), parallel.Ranks(), backend)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
