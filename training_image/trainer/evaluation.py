"""``trn-train eval``: the loss of a model on every example of a split of prepared data, once.

The examples are packed in their stored order into rows of the sequence length (the rows
:func:`trainer.causal_lm.eval_sampler` gives the in-run eval, see :mod:`trainer.packing`), and the
result is the token-weighted mean cross-entropy over every trained target (assistant tokens for
chat) in FP32, without autocast. Each example attends only to itself, so the loss of an example
does not depend on the examples beside it: another order of the input file or another batch
size gives the same result up to the last bits of the kernels.

The model comes from a Hugging Face directory (``--model``) or from the newest valid checkpoint
of a run (``--checkpoint-dir``): a preset run's weights; a ``--model`` run's, with the
``config.json`` the checkpoint carries; a LoRA run's adapters on the base model directory the
checkpoint recorded, checked against its fingerprint as ``trn-train export --merge-lora``
checks it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from trainer import device, hf, hf_config, lora
from trainer.checkpoint import Checkpointer, CheckpointError, open_store
from trainer.config import ModelConfig, preset
from trainer.data import IGNORE_INDEX, Dataset, open_dataset
from trainer.model import GPT
from trainer.packing import CutReport, PackedSampler

SPLITS = ("eval", "train", "all")
# Rows per forward when --micro-batch is not given: a batch size of eval only, not a run's.
DEFAULT_MICRO_BATCH = 8


@dataclass(frozen=True)
class EvalResult:
    """``loss`` (None when no target is trained: JSON has no NaN) over ``tokens`` trained
    targets of ``examples`` examples; ``reports`` what the cutting rule did to each split, by
    name."""

    loss: float | None
    tokens: int
    examples: int
    reports: dict[str, CutReport]

    def as_dict(self) -> dict[str, object]:
        return {"loss": self.loss, "tokens": self.tokens, "examples": self.examples}


def splits(dataset: Dataset, split: str) -> dict[str, Dataset]:
    """The parts of ``dataset`` that ``split`` (one of :data:`SPLITS`) names, by name.

    Raises:
        ValueError: an unknown split, ``eval`` of a dataset without a held-out split, or a
            token stream (this command reads datasets of examples).
    """
    if split not in SPLITS:
        raise ValueError(f"--split {split!r} is unknown; allowed: {', '.join(SPLITS)}")
    if dataset.index is None:
        raise ValueError(
            f"--data {dataset.root} is a token stream (the byte corpus or --format text); "
            "trn-train eval reads data of examples (prepare-data --format jsonl or chat)"
        )
    held_out = {} if dataset.eval_split is None else {"eval": dataset.eval_split}
    if split == "eval" and not held_out:
        raise ValueError(
            f"--data {dataset.root} has no held-out split (prepare-data --eval-fraction F or "
            "--eval-input FILE writes one); --split train or all reads the rest"
        )
    return {"eval": held_out, "train": {"train": dataset}, "all": {"train": dataset, **held_out}}[
        split
    ]


def evaluate(
    model: torch.nn.Module,
    parts: Mapping[str, Dataset],
    *,
    seq_len: int,
    micro_batch: int,
    on: torch.device,
) -> EvalResult:
    """The loss of ``model`` (already on device ``on``) over every example of ``parts``, in
    rows of ``seq_len`` packed in stored order, ``micro_batch`` rows a forward.

    Raises:
        ValueError: no example of a part fits ``seq_len`` (see
            :class:`~trainer.packing.PackedSampler`).
    """
    total = torch.zeros((), dtype=torch.float64)
    targets = examples = 0
    reports = {}
    with torch.no_grad():
        for name, part in parts.items():
            rows = PackedSampler(
                part, seq_len=seq_len, micro_batch=micro_batch, seed=0, shuffle=False
            )
            reports[name] = rows.report
            examples += rows.kept_examples
            for step in range(rows.steps_in(0)):
                x, y, positions = (t.to(on) for t in rows.batch(step))
                count = int((y != IGNORE_INDEX).sum())
                if count:
                    total += model(x, y, positions).double().cpu() * count
                    targets += count
    loss = float(total / targets) if targets else None
    return EvalResult(loss, targets, examples, reports)


def model_from_dir(model_dir: str, seq_len: int) -> GPT:
    """``model_dir``'s model at ``seq_len`` (0: as ``run --model`` takes it).

    Raises:
        trainer.hf_config.HFConfigError, trainer.hf.HFWeightsError: see
            :func:`trainer.hf.load_pretrained`.
    """
    cfg = hf_config.model_config(model_dir, seq_len=seq_len or None)
    return hf.load_pretrained(model_dir, cfg)


def model_from_checkpoint(checkpoint_dir: str, seq_len: int) -> GPT:
    """The model of the newest valid checkpoint in ``checkpoint_dir`` (a path or ``s3://``
    URI) at ``seq_len`` (0: the run's).

    Raises:
        CheckpointError: no valid checkpoint, one that does not say how to build its model, or a
            LoRA checkpoint whose base model directory is missing or holds another model.
    """
    checkpointer = Checkpointer(open_store(checkpoint_dir))
    try:
        name = checkpointer.newest_valid()
        if name is None:
            raise CheckpointError(f"{checkpoint_dir} holds no valid checkpoint to evaluate")
        run = checkpointer.run_of(name) or {}
        cfg = _checkpoint_config(checkpointer, name, run, seq_len)
        state = checkpointer.load(name, verify=False, parts=("model",))["model"]
        adapter = run.get("lora")
        if isinstance(adapter, dict):
            from trainer.hf_export import _base_weights

            spec = lora.LoraSpec.from_dict(adapter)
            base = _base_weights(checkpointer, name, checkpointer.base_model_of(name), cfg)
            model = _built(cfg, base)
            lora.apply(model, cfg, spec)
            model.load_state_dict({**model.state_dict(), **state})
            return model
        return _built(cfg, state)
    finally:
        checkpointer.store.drop_local_copies()


def _checkpoint_config(
    checkpointer: Checkpointer, name: str, run: dict[str, Any], seq_len: int
) -> ModelConfig:
    """The model shape of checkpoint ``name``: its carried ``config.json`` (a ``--model``
    run), else its run's preset; at ``seq_len``, else the run's."""
    length = seq_len or run.get("seq_len")
    if hf_config.CONFIG in checkpointer.model_files_of(name):
        with checkpointer.model_file(name, hf_config.CONFIG) as path:
            raw = json.loads(path.read_text())
        return hf_config.parse_config(raw, seq_len=length if isinstance(length, int) else None)
    if "preset" not in run:
        raise CheckpointError(
            f"checkpoint {name} records no run configuration; it cannot say which model it holds"
        )
    model = preset(str(run["preset"])).model
    if isinstance(length, int) and length:
        model = dataclasses.replace(model, seq_len=length)
    return model


def _built(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> GPT:
    """A model of ``cfg`` holding ``state`` (built on the meta device, then assigned)."""
    with torch.device("meta"):
        model = GPT(cfg)
    model.load_state_dict(state, assign=True)
    model.tie_weights()
    model.init_rope()
    return model


def run(
    *,
    data_dir: str,
    split: str = "eval",
    model_dir: str = "",
    checkpoint_dir: str = "",
    seq_len: int = 0,
    micro_batch: int = DEFAULT_MICRO_BATCH,
    device_name: str = "auto",
) -> EvalResult:
    """``trn-train eval``: :func:`evaluate` of the model of ``model_dir`` or
    ``checkpoint_dir`` (exactly one) on ``split`` of ``data_dir``, on ``device_name``'s device
    (default auto) in FP32, ``micro_batch`` (default :data:`DEFAULT_MICRO_BATCH`) rows a
    forward.

    Raises:
        ValueError: both or neither model source, a micro batch below 1, or a bad split (see
            :func:`splits`); see also :func:`model_from_dir`, :func:`model_from_checkpoint`.
        trainer.data.ShardError: the data is missing or fails its checks.
    """
    if bool(model_dir) == bool(checkpoint_dir):
        raise ValueError("give exactly one of --model DIR and --checkpoint-dir CK")
    if micro_batch < 1:
        raise ValueError(f"--micro-batch must be >= 1, got {micro_batch}")
    parts = splits(open_dataset(data_dir, verify=False), split)
    model = (
        model_from_dir(model_dir, seq_len)
        if model_dir
        else model_from_checkpoint(checkpoint_dir, seq_len)
    )
    backend = device.resolve(device_name, compile_backend="none").start()
    model = model.to(backend.device).eval()
    if hasattr(model, "tie_weights"):
        model.tie_weights()  # a move to an XLA device unties them
    return evaluate(
        model, parts, seq_len=model.cfg.seq_len, micro_batch=micro_batch, on=backend.device
    )
