"""docs/fine-tuning.md states what the trainer does: its LoRA defaults table (learning rate,
weight decay, adapted modules, the dtype of the frozen base by device) is the code's constants,
`trn-train run --help` gives the same figures, and the run settings line it shows is the one a
run with those flags prints."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from tests.conftest import ROOT
from trainer import cli, config, device, lora, model_spec

PAGE = ROOT / "docs" / "fine-tuning.md"
# The devices the table's frozen-weights row names, and the backend each runs on.
BACKENDS: dict[str, type[device.Backend]] = {
    "CPU": device.Backend,
    "CUDA": device.CudaBackend,
    "Neuron": device.NeuronBackend,
    "XLA": device.XlaBackend,
}
DTYPES = {"BF16": torch.bfloat16, "FP32": torch.float32}


def lora_section(page: Path = PAGE) -> str:
    found = re.search(r"^## LoRA\n(.*?)(?=^## |\Z)", page.read_text(), flags=re.S | re.M)
    assert found, f"{page.name} has no LoRA section"
    return found.group(1)


def defaults_table() -> dict[str, list[str]]:
    """The LoRA section's table of defaults: each row's cells after the first, by the first."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in lora_section().splitlines()
        if line.startswith("| ")
    ]
    return {row[0]: row[1:] for row in rows if row[0] != "default"}


def frozen_dtypes(cell: str) -> dict[str, torch.dtype]:
    """``BF16 on CUDA and Neuron; FP32 on CPU and XLA`` as {device: dtype}."""
    found = {}
    for part in cell.split("; "):
        name, _, devices = part.partition(" on ")
        for device_name in devices.split(" and "):
            found[device_name] = DTYPES[name]
    return found


def _help(flag: str) -> str:
    (run,) = [a for a in cli._parser()._actions if a.dest == "command"]
    parser = run.choices["run"]  # type: ignore[attr-defined]
    (action,) = [a for a in parser._actions if flag in a.option_strings]
    return str(action.help)


def test_the_learning_rates_and_weight_decays_are_the_code_s() -> None:
    table = defaults_table()
    full_lr, lora_lr, lr_flag = table["peak learning rate"]
    full_decay, lora_decay, decay_flag = table["AdamW weight decay on matrices"]

    assert (float(full_lr), float(lora_lr)) == (config.MODEL_DEFAULTS.lr, config.LORA_LR)
    assert (float(full_decay), float(lora_decay)) == (
        config.WEIGHT_DECAY,
        config.LORA_WEIGHT_DECAY,
    )
    assert f"with --model {full_lr}, with --lora-rank {lora_lr}" in _help(lr_flag.strip("`"))
    assert f"default {full_decay}, with --lora-rank {lora_decay}" in _help(decay_flag.strip("`"))


def test_the_adapted_modules_are_the_default_targets() -> None:
    full, targets, flag = defaults_table()["modules with adapters"]

    assert full == "none"
    assert tuple(targets.split(", ")) == lora.DEFAULT_TARGETS == lora.TARGETS
    assert "default: all of them" in _help(flag.strip("`"))


def test_the_frozen_base_dtypes_are_each_backend_s() -> None:
    full, cell, _ = defaults_table()["frozen linear weights kept in"]
    stated = frozen_dtypes(cell)

    assert full == "none frozen"
    assert set(stated) == set(BACKENDS)
    for name, backend in BACKENDS.items():
        # Neuron's and XLA's constructors import their stacks; the dtype is the class's own.
        kept = object.__new__(backend).frozen_dtype() or torch.float32
        assert kept == stated[name], name


def test_the_shown_settings_line_is_what_such_a_run_prints() -> None:
    (line,) = re.findall(r"^trn-train: run settings (\{.*\})$", lora_section(), flags=re.M)
    shown = json.loads(line)
    args = ["run", "--data", "d", "--model", "m", "--lora-rank", "16", "--lora-alpha", "32"]
    cfg = cli.train_config(cli._parser().parse_args(args))

    # A trn node's run: FSDP over its NeuronCores runs eager (see device.NeuronBackend).
    lora_of_run = model_spec.lora_spec(cfg)
    assert shown == model_spec.settings(cfg, lora_of_run, frozen_dtype="bf16", compile_backend=None)
