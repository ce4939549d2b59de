"""A trained classifier as a Hugging Face directory: ``*ForSequenceClassification`` weights and a
``config.json`` with ``id2label``, ``label2id``, ``problem_type`` and ``pad_token_id`` (what
``AutoModelForSequenceClassification.from_pretrained`` reads); or, of a LoRA run, a PEFT adapter
of task type ``SEQ_CLS`` whose score head is saved whole (``modules_to_save``, as PEFT's
``PeftModelForSequenceClassification`` adds ``score`` there by default, ``peft_model.py`` at
0.21.2)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from trainer import hf, hf_config, hf_export, lora
from trainer.checkpoint import Checkpointer, CheckpointError
from trainer.classify import encoder
from trainer.classify.model import SCORE, HeadSpec, causal_config, classifier_head, to_hf

SEQ_CLS_TASK = "SEQ_CLS"


def classifier_config(raw: Mapping[str, Any], head: HeadSpec, dtype: str) -> dict[str, Any]:
    """``raw`` (the decoder's ``config.json``, causal LM or classifier) as the classifier's:
    its architecture's ``*ForSequenceClassification``, the head's fields and ``dtype``.

    Raises:
        hf_config.HFConfigError: not a supported decoder.
    """
    causal = causal_config(raw)
    arch = hf_config.architecture(causal)
    name = next(n for n, t in hf_config.ARCHITECTURES.items() if t == arch)
    config = {
        **causal,
        "architectures": [name.removesuffix("ForCausalLM") + "ForSequenceClassification"],
    }
    config.update(head.config_fields())
    return _with_dtype(config, dtype)


def _with_dtype(config: dict[str, Any], dtype: str) -> dict[str, Any]:
    """``config`` saying ``dtype`` in ``dtype`` and, where it has it, in ``torch_dtype`` (the
    older name, which older readers of the directory still take)."""
    config["dtype"] = dtype
    if "torch_dtype" in config:
        config["torch_dtype"] = dtype
    return config


def save_classifier(
    state: Mapping[str, torch.Tensor],
    raw_config: Mapping[str, Any],
    head: HeadSpec,
    out: str | Path,
    *,
    dtype: str = "auto",
    max_shard_bytes: int = 5 << 30,
) -> list[str]:
    """Writes our classifier ``state`` (a decoder's, or BERT's when ``raw_config`` is BERT's)
    as a Hugging Face classifier directory ``out`` (new or empty): the weights in transformers'
    names (``model.safetensors``, or shards of at most ``max_shard_bytes`` with
    ``model.safetensors.index.json``) and :func:`classifier_config`. ``dtype`` as
    :func:`trainer.hf_export.export_dtype` (default ``auto``). Returns the files written.

    Raises:
        hf_config.HFConfigError: ``raw_config`` is not a supported decoder.
        ValueError: ``out`` is not empty, ``dtype`` is unknown, ``state`` lacks a parameter.
    """
    name = hf_export.export_dtype(raw_config, dtype)
    if name not in hf_export.DTYPES:
        raise ValueError(
            f"dtype {dtype!r} is not supported; allowed: auto, {', '.join(hf_export.DTYPES)}"
        )
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
    if encoder.is_bert(raw_config):
        config = {**raw_config, "architectures": [encoder.CLASSIFIER], **head.config_fields()}
        config = _with_dtype(config, name)
        # BERT's parameters carry transformers' names already.
        tensors = {
            k: v.to(hf_export.DTYPES[name], copy=True).contiguous() for k, v in state.items()
        }
    else:
        config = classifier_config(raw_config, head, name)
        cfg = hf_config.parse_config(causal_config(config), seq_len=1)
        tensors = to_hf(state, cfg, head.num_labels, hf_export.DTYPES[name])
    root = hf_export.check_empty_out(out)
    root.mkdir(parents=True, exist_ok=True)
    shards = hf_export._shard(tensors, max_shard_bytes)
    files = (
        [hf.SINGLE]
        if len(shards) == 1
        else [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    )
    for file, shard in zip(files, shards, strict=True):
        save_file(shard, str(root / file), metadata={"format": "pt"})
    written = list(files)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
            "weight_map": {n: f for f, shard in zip(files, shards, strict=True) for n in shard},
        }
        (root / hf.INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        written.append(hf.INDEX)
    (root / hf_config.CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return [*written, hf_config.CONFIG]


def save_adapter(
    state: Mapping[str, torch.Tensor],
    raw_config: Mapping[str, Any],
    spec: lora.LoraSpec,
    head: HeadSpec,
    out: str | Path,
    *,
    base_model: str,
    dtype: str = "auto",
) -> list[str]:
    """Writes a LoRA classifier's adapters and score head (``state``: ``head.weight`` and the
    adapters under our names) as a PEFT ``SEQ_CLS`` adapter directory ``out``: the score head
    as ``base_model.model.score.weight`` in ``modules_to_save``. The base model it names is a
    causal LM or classifier of ``raw_config``'s decoder; PEFT loads it onto
    ``AutoModelForSequenceClassification`` of a config with this head's fields (see
    :func:`classifier_config`). Returns the files written.

    Of BERT (``raw_config`` BERT's): its pooler and classifier, as
    ``base_model.model.bert.pooler.dense.*`` and ``base_model.model.classifier.*`` in
    ``modules_to_save``, onto ``BertForSequenceClassification``.

    Raises:
        ValueError: ``state`` lacks the score head or an adapter; see
            :func:`trainer.hf_export.save_adapter`.
    """
    if encoder.is_bert(raw_config):
        config: Mapping[str, Any] = raw_config
        layout = encoder.lora_layout(encoder.parse_config(raw_config, seq_len=1))
        saved = _bert_head(state, head)
    else:
        config, layout = causal_config(raw_config), None
        saved = {lora.PEFT_PREFIX + SCORE: _score(state, head)}
    return hf_export.save_adapter(
        state,
        config,
        spec,
        out,
        base_model=base_model,
        dtype=dtype,
        task_type=SEQ_CLS_TASK,
        modules_to_save=saved,
        layout=layout,
    )


def _score(state: Mapping[str, torch.Tensor], head: HeadSpec) -> torch.Tensor:
    """A decoder classifier's score head in ``state``, checked against ``head``."""
    if "head.weight" not in state:
        raise ValueError("the model state lacks the score head (head.weight)")
    score = state["head.weight"]
    if score.shape[0] != head.num_labels:
        raise ValueError(f"the score head has {score.shape[0]} rows for {head.num_labels} classes")
    return score


def _bert_head(state: Mapping[str, torch.Tensor], head: HeadSpec) -> dict[str, torch.Tensor]:
    """A BERT classifier's pooler and classifier in ``state``, checked against ``head``, under
    the names PEFT saves them."""
    names = {f"{p}.{kind}" for p in encoder.HEAD_MODULES for kind in ("weight", "bias")}
    if not names <= set(state):
        raise ValueError(
            f"the model state lacks the head ({', '.join(sorted(names - set(state)))})"
        )
    rows = state["classifier.weight"].shape[0]
    if rows != head.num_labels:
        raise ValueError(f"the classifier has {rows} rows for {head.num_labels} classes")
    return {lora.PEFT_PREFIX + n: state[n] for n in sorted(names)}


def write_checkpoint(
    checkpointer: Checkpointer,
    name: str,
    raw: dict[str, Any],
    state: dict[str, torch.Tensor],
    out: str | Path,
    options: hf_export.ExportOptions,
) -> list[str]:
    """``trn-train export`` of a ``--task classify`` run's checkpoint ``name`` (its carried
    ``config.json`` ``raw`` and model ``state``): the classifier directory
    (:func:`save_classifier`), or of a LoRA run the PEFT ``SEQ_CLS`` adapter
    (:func:`save_adapter`), or with ``options.merge_lora`` the classifier with the adapters
    merged into its base model's weights (see :func:`trainer.hf_export.export_checkpoint`).

    Raises:
        CheckpointError: the run recorded no classes; see
            :func:`trainer.hf_export.export_checkpoint`.
    """
    run = checkpointer.run_of(name) or {}
    head = classifier_head(run)
    if head is None:
        raise CheckpointError(f"checkpoint {name} records no classes: not a classification run")
    adapter = run.get("lora")
    if isinstance(adapter, dict):
        spec = lora.LoraSpec.from_dict(adapter)
        base = checkpointer.base_model_of(name)
        if not options.merge_lora:
            base_name = hf_export.base_model_name(raw, base, options.base_model_id)
            return save_adapter(
                state, raw, spec, head, out, base_model=base_name, dtype=options.dtype
            )
        state = _merged(checkpointer, name, raw, state, spec)
    return save_classifier(
        state, raw, head, out, dtype=options.dtype, max_shard_bytes=options.max_shard_bytes
    )


def _merged(
    checkpointer: Checkpointer,
    name: str,
    raw: dict[str, Any],
    state: dict[str, torch.Tensor],
    spec: lora.LoraSpec,
) -> dict[str, torch.Tensor]:
    """A LoRA checkpoint's ``state`` (adapters and head) with its base model's weights, the
    adapters merged into them: the decoder's or BERT's (``raw``, its ``config.json``).

    Raises:
        CheckpointError: see :func:`trainer.hf_export.checked_base`.
    """
    base = checkpointer.base_model_of(name)
    if encoder.is_bert(raw):
        layout = encoder.lora_layout(encoder.parse_config(raw, seq_len=1))
        weights = encoder.read_state(hf_export.checked_base(checkpointer, name, base))
        return lora.merged({**weights, **state}, layout, spec)
    cfg = hf_config.parse_config(raw, seq_len=1)
    return lora.merged(
        {**hf_export._base_weights(checkpointer, name, base, cfg), **state}, cfg, spec
    )
