"""What a run's flags name, read: :class:`~trainer.config.TrainConfig` is plain data, and this
is where it meets the files and modules it names. The model's shape comes from a preset or a
Hugging Face directory's ``config.json`` (:mod:`trainer.hf_config`), the LoRA adapters' spec
from the LoRA flags (:mod:`trainer.lora`). Set-up (:func:`trainer.loop.set_up`) resolves them
once and passes the :class:`ModelSpec` on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trainer import hf_config, lora
from trainer.classify import encoder
from trainer.config import ModelConfig, TrainConfig, preset


@dataclass(frozen=True)
class ModelSpec:
    """What a run trains: ``config``, the decoder's shape, and ``lora``, the LoRA adapters on
    it (None: full fine-tuning, every weight trained)."""

    config: ModelConfig
    lora: lora.LoraSpec | None


def model_config(cfg: TrainConfig) -> ModelConfig:
    """``cfg.preset``'s model (at ``cfg.seq_len`` when set), or the one ``cfg.model_dir``'s
    ``config.json`` describes (see :func:`trainer.hf_config.model_config`); of a BERT encoder
    for ``--task classify``, its shape (:func:`trainer.classify.encoder.shape`).

    Raises:
        ValueError: an unknown preset.
        trainer.hf_config.HFConfigError: ``config.json`` is missing, unreadable or describes a model
            this trainer does not implement.
    """
    if cfg.model_dir:
        bert = (
            encoder.config_of(cfg.model_dir, seq_len=cfg.seq_len)
            if cfg.task == "classify"
            else None
        )
        if bert is not None:
            return encoder.shape(bert)
        return hf_config.model_config(cfg.model_dir, seq_len=cfg.seq_len or None)
    model = preset(cfg.preset).model
    return dataclasses.replace(model, seq_len=cfg.seq_len) if cfg.seq_len else model


def lora_spec(cfg: TrainConfig) -> lora.LoraSpec | None:
    """The LoRA settings of ``cfg``'s flags, or None for full fine-tuning.

    Raises:
        ValueError: see :func:`trainer.lora.spec`.
    """
    return lora.spec(cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets, cfg.model_dir)


def resolve(cfg: TrainConfig) -> ModelSpec:
    """``cfg`` checked (:meth:`TrainConfig.validate`) and its model resolved. The checks run in
    one order, the model's fields, the model itself (a bad ``config.json`` or ``seq_len``
    fails here, before any work), the LoRA flags, then the run's fields, and the first problem
    raises.

    Raises:
        ValueError: see :meth:`TrainConfig.validate` and :func:`lora_spec`.
        trainer.hf_config.HFConfigError: see :func:`model_config`.
    """
    cfg.validate_model_fields()
    spec = ModelSpec(model_config(cfg), lora_spec(cfg))
    cfg.validate()
    return spec


def settings(
    cfg: TrainConfig,
    lora_of_run: lora.LoraSpec | None,
    *,
    frozen_dtype: str | None,
    compile_backend: str | None,
) -> dict[str, object]:
    """What the run trains with where flags may leave it to defaults, as the run prints it at
    start and records it in its metrics header: peak learning rate, weight decay, the LoRA
    rank, alpha and targets (``lora_of_run``, see :func:`lora_spec`; None for full
    fine-tuning), with LoRA the dtype the frozen weights are kept in (``frozen_dtype``;
    adapters and their AdamW state are FP32), and the ``torch.compile`` backend the device runs
    (``none``: eager)."""
    return {
        "lr": cfg.peak_lr,
        "weight_decay": cfg.decay,
        "lora": None if lora_of_run is None else lora_of_run.as_dict(),
        "frozen_dtype": frozen_dtype if lora_of_run is not None else None,
        "compile": compile_backend or "none",
    }
