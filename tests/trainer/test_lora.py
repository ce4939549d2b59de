"""LoRA on ``trn-train run --model``: frozen base, adapters trained, exact resume, PEFT adapter
export that PEFT itself loads, merged export that transformers loads; the flags' errors."""

from __future__ import annotations

import functools
import json
import math
import re
import shutil
from pathlib import Path

import hf_tiny
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from tests.tolerance import assert_fp32_close
from trainer import checkpoint, cli, hf, hf_config, lora, metrics, model_spec
from trainer.checkpoint import CheckpointError, RunConfigError

SEQ = hf_tiny.SEQ_LEN
ALL = ",".join(lora.TARGETS)
_run = functools.partial(hf_tiny.run_args, lr="1e-2", max_steps="3")


_state = hf_tiny.checkpoint_state


def _tokens() -> torch.Tensor:
    return torch.randint(0, 256, (2, SEQ), generator=torch.Generator().manual_seed(5))


def _ours(source: Path, ck: Path, step: int, spec: lora.LoraSpec) -> torch.Tensor:
    """Our logits for :func:`_tokens` from the LoRA checkpoint at ``step``."""
    cfg = hf_config.model_config(source, seq_len=SEQ)
    model = lora.apply(hf.load_pretrained(source, cfg), cfg, spec).eval()
    # The checkpoint holds the adapters; the base weights are the source's.
    loaded = model.load_state_dict(_state(ck, step)["model"], strict=False)  # type: ignore[arg-type]
    assert not loaded.unexpected_keys
    assert all(".lora_" not in name for name in loaded.missing_keys)
    with torch.no_grad():
        return model.logits(_tokens())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_tiny.model_dir(tmp_path_factory.mktemp("tiny"))


def test_adapters_start_as_peft_does_and_leave_the_model_unchanged(tiny: Path) -> None:
    cfg = hf_config.model_config(tiny, seq_len=SEQ)
    base = hf.load_pretrained(tiny, cfg).eval()
    with torch.no_grad():
        before = base.logits(_tokens())
    spec = lora.LoraSpec(rank=4, alpha=8.0, targets=lora.TARGETS)
    model = lora.apply(base, cfg, spec)
    layer = model.blocks[0].attn.qkv
    assert isinstance(layer, lora.LoraLinear) and isinstance(
        model.blocks[1].mlp.up, lora.LoraLinear
    )
    assert set(layer.lora_A) == {"q_proj", "k_proj", "v_proj"} and layer.scaling == 2.0
    # kaiming-uniform with a = sqrt(5): bound sqrt(6 / ((1 + 5) * fan_in)) = 1 / sqrt(fan_in).
    a = layer.lora_A["q_proj"]
    assert a.shape == (4, 32) and 0 < a.abs().max() <= 1 / math.sqrt(32)
    assert layer.lora_B["k_proj"].shape == (16, 4) and not layer.lora_B["k_proj"].any()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * 7 * cfg.n_layer
    # The adapters add zeros, but one on gate or up moves the MLP off its fused kernel
    # (model._GatedUpFunction): the same logits to the rounding of another matrix product.
    with torch.no_grad():
        assert_fp32_close(model.logits(_tokens()), before)


def test_step_zero_is_the_base_model_and_only_adapters_train(
    model_data: Path, tmp_path: Path
) -> None:
    source = hf_tiny.model_dir(tmp_path, "qwen2")
    log = ["--log-every", "1"]
    full = [*_run(source, model_data, tmp_path / "full", *log, "--max-steps", "1")]
    assert cli.main([*full, "--metrics", str(tmp_path / "full.jsonl")]) == 0
    tuned = [*_run(source, model_data, tmp_path / "ck", *log, "--lora-rank", "4")]
    assert cli.main([*tuned, "--lora-targets", ALL, "--metrics", str(tmp_path / "lora.jsonl")]) == 0

    first_full = metrics.read(tmp_path / "full.jsonl")[0]["loss"]
    losses = [r["loss"] for r in metrics.read(tmp_path / "lora.jsonl")]
    # Step 1's loss is of the weights before any update, on the MLP path the adapters take.
    assert_fp32_close(losses[0], first_full)
    assert losses[-1] < losses[0]
    state = _state(tmp_path / "ck", 3)
    model = state["model"]
    assert isinstance(model, dict)
    # The checkpoint holds the adapters only: the frozen base is the --model directory's.
    adapters = [n for n in model if ".lora_" in n]
    assert len(adapters) == len(model) == 2 * 7 * 2
    assert all(model[n].any() for n in adapters if ".lora_B." in n)  # trained away from zero
    optimizer = state["optimizer"]
    assert isinstance(optimizer, dict)
    assert set(optimizer["state"]) == set(adapters)  # the optimizer holds the adapters only
    meta = json.loads((tmp_path / "ck" / checkpoint.name_for(3) / checkpoint.META).read_text())
    assert meta["run"]["lora"] == {"rank": 4, "alpha": 4.0, "targets": list(lora.TARGETS)}
    assert meta["base_model"] == str(source)


def test_resume_of_a_lora_run_is_bit_identical(model_data: Path, tmp_path: Path) -> None:
    source = hf_tiny.model_dir(tmp_path, "llama")
    args = ["--max-steps", "4", "--checkpoint-every", "2", "--lora-rank", "2"]
    hf_tiny.assert_resume_is_exact(
        lambda ck: _run(source, model_data, ck, *args), tmp_path, last=4, killed_at=2
    )

    with pytest.raises(
        RunConfigError,
        match=re.escape(
            "lora {'rank': 2, 'alpha': 2.0, 'targets': ['q_proj', 'k_proj', 'v_proj', "
            "'o_proj', 'gate_proj', 'up_proj', 'down_proj']} in the checkpoint, {'rank': 3,"
        ),
    ):
        cli.main([*_run(source, model_data, tmp_path / "straight", *args[:-1], "3"), "--debug"])
    with pytest.raises(RunConfigError, match=r"lora \{.*\} in the checkpoint, None now"):
        cli.main([*_run(source, model_data, tmp_path / "straight", *args[:4]), "--debug"])
    # The checkpoint holds the adapters only: another base model is refused by name.
    other = hf_tiny.model_dir(tmp_path, "llama", seed=1)
    with pytest.raises(
        RunConfigError,
        match=re.escape(
            "it holds LoRA adapters only, trained on the base model of fingerprint "
            f"'{hf.fingerprint(source)}', and this run's --model has '{hf.fingerprint(other)}'"
        ),
    ):
        cli.main([*_run(other, model_data, tmp_path / "straight", *args), "--debug"])
    # Merging reads the base weights, which must be the ones the adapters were trained on.
    merge = ["export", "--checkpoint-dir", str(tmp_path / "straight"), "--merge-lora", "--out"]
    shutil.copytree(other, source, dirs_exist_ok=True)
    with pytest.raises(CheckpointError, match=r"--merge-lora: base model .* has fingerprint"):
        cli.main([*merge, str(tmp_path / "m1"), "--debug"])
    shutil.rmtree(source)
    with pytest.raises(CheckpointError, match=r"holds LoRA adapters only and its base model"):
        cli.main([*merge, str(tmp_path / "m2"), "--debug"])


def test_exported_adapter_loads_with_peft_and_merges_like_it(
    model_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = hf_tiny.model_dir(tmp_path, "qwen3", tie_word_embeddings=True)
    ck = tmp_path / "ck"
    run = [*_run(source, model_data, ck, "--lora-rank", "4", "--lora-alpha", "6")]
    assert cli.main([*run, "--lora-targets", "q_proj,v_proj,up_proj,down_proj,o_proj"]) == 0
    spec = lora.LoraSpec(4, 6.0, ("q_proj", "v_proj", "o_proj", "up_proj", "down_proj"))
    ours = _ours(source, ck, 3, spec)

    assert cli.main(["export", "--checkpoint-dir", str(ck), "--out", str(tmp_path / "ad")]) == 0
    config = json.loads((tmp_path / "ad" / lora.ADAPTER_CONFIG).read_text())
    assert config["base_model_name_or_path"] == str(source)
    assert (config["r"], config["lora_alpha"]) == (4, 6)
    base = AutoModelForCausalLM.from_pretrained(source)
    peft_model = PeftModel.from_pretrained(base, tmp_path / "ad").eval()
    with torch.no_grad():
        theirs = peft_model(input_ids=_tokens()).logits
        with peft_model.disable_adapter():
            untuned = peft_model(input_ids=_tokens()).logits
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(theirs, untuned, rtol=1e-3, atol=1e-3)  # the adapters matter

    merge = ["export", "--checkpoint-dir", str(ck), "--out", str(tmp_path / "m"), "--merge-lora"]
    assert cli.main(merge) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=_tokens()).logits, ours, rtol=1e-5, atol=1e-5)
    assert (tmp_path / "m" / "tokenizer.json").is_file()

    # score of the adapter directory loads its base and the adapter: the merged model's loss.
    (tmp_path / "t.json").write_text(json.dumps(_tokens().tolist()))
    scores = []
    for model in ("m", "ad"):
        capsys.readouterr()
        assert (
            cli.main(
                ["score", "--model", str(tmp_path / model), "--tokens", str(tmp_path / "t.json")]
            )
            == 0
        )
        scores.append(json.loads(capsys.readouterr().out)["loss"])
    assert scores[1] == pytest.approx(scores[0], rel=1e-5)


def test_trnctl_s_lora_arguments_make_a_lora_run() -> None:
    """`trnctl job submit --lora-rank 16 --lora-alpha 32` renders flags `trn-train run` takes."""
    from trnctl import jobs

    argv = jobs.TrainingArgs(None, "d", model="m", lora_rank=16, lora_alpha=32.0).argv("ft-1")
    cfg = cli.train_config(cli._parser().parse_args(["run", *argv]))
    assert model_spec.lora_spec(cfg) == lora.LoraSpec(16, 32.0, lora.DEFAULT_TARGETS)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lora-rank", "0"], "--lora-rank must be >= 1, got 0"),
        (
            ["--lora-rank", "2", "--lora-alpha", "0"],
            "--lora-alpha must be a number above 0, got 0.0",
        ),
        (
            ["--lora-rank", "2", "--lora-alpha", "inf"],
            "--lora-alpha must be a number above 0, got inf",
        ),
        (["--lora-alpha", "8"], "--lora-alpha 8.0 needs --lora-rank"),
        (["--lora-targets", "q_proj"], "--lora-targets q_proj needs --lora-rank"),
        (
            ["--lora-rank", "2", "--lora-targets", "q_proj,lm_head"],
            "--lora-targets 'q_proj,lm_head': 'lm_head' is not a target module; allowed: a comma "
            "list of q_proj, k_proj",
        ),
        (
            ["--lora-rank", "2", "--lora-targets", "v_proj,v_proj"],
            "--lora-targets 'v_proj,v_proj': 'v_proj' is named twice",
        ),
        (["--lora-rank", "2", "--lora-targets", ""], "'' is not a target module"),
    ],
)
def test_lora_flag_errors_are_named(
    flags: list[str], message: str, tiny: Path, model_data: Path, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        cli.main([*_run(tiny, model_data, tmp_path / "ck"), *flags, "--debug"])
    assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").glob("step_*"))


def test_lora_needs_a_model_and_merge_needs_a_lora_run(
    tiny: Path, corpus_dir: Path, model_data: Path, tmp_path: Path
) -> None:
    preset = ["run", "--data", str(corpus_dir), "--device", "cpu", "--lora-rank", "8"]
    with pytest.raises(ValueError, match="--lora-rank 8 needs --model: LoRA fine-tunes"):
        cli.main([*preset, "--debug"])
    ck = tmp_path / "ck"
    assert cli.main(_run(tiny, model_data, ck, "--max-steps", "1")) == 0
    with pytest.raises(CheckpointError, match=r"--merge-lora: checkpoint step_00000001 .* is not"):
        export = ["export", "--checkpoint-dir", str(ck), "--out", str(tmp_path / "o")]
        cli.main([*export, "--merge-lora", "--debug"])
