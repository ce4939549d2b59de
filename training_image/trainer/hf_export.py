"""Export: our model's state written as a Hugging Face model directory (:func:`save_pretrained`:
``config.json`` and safetensors in transformers' names and layout, see :mod:`trainer.hf_llama`)
or LoRA adapters as a PEFT adapter directory (:func:`save_adapter`); and ``trn-train export``
(:func:`export_checkpoint`), the newest valid checkpoint of a ``--model`` run written so from
the checkpoint alone (it carries the model's ``config.json`` and tokenizer files, see
:class:`trainer.checkpoint.Checkpointer`): a LoRA run's as a PEFT adapter directory, or with
``merge_lora`` as the full model with the adapters merged."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from trainer import hf, hf_config, hf_llama, lora
from trainer.checkpoint import Checkpointer, CheckpointError, open_store
from trainer.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_empty_out(out: str | Path) -> Path:
    """``out`` as a path, when it is a new or empty directory to export into.

    Raises:
        ValueError: ``out`` is a file or a directory that holds something.
    """
    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ValueError(f"export directory {root} is not empty; choose a new or empty one")
    return root


def export_dtype(raw: Mapping[str, Any], choice: str) -> str:
    """The dtype to write: ``choice``, or with ``auto`` the config's own (``dtype``, or the older
    ``torch_dtype``; float32 when neither names one of :data:`DTYPES`)."""
    if choice != "auto":
        return choice
    named = raw.get("dtype", raw.get("torch_dtype"))
    return named if named in DTYPES else "float32"


def save_pretrained(
    state: Mapping[str, torch.Tensor],
    raw_config: Mapping[str, Any],
    out: str | Path,
    *,
    dtype: str = "auto",
    max_shard_bytes: int = 5 << 30,
) -> list[str]:
    """Writes our model ``state`` as a Hugging Face model directory ``out`` (created; it must
    not exist or be empty): ``config.json`` (``raw_config`` with the written dtype), and the
    weights in transformers' names and layout, in ``model.safetensors`` or, above
    ``max_shard_bytes`` (default 5 GiB), ``model-0000i-of-0000n.safetensors`` shards with
    ``model.safetensors.index.json``. ``dtype``: ``auto`` (see :func:`export_dtype`) or a key of
    :data:`DTYPES`. Returns the names of the files written.

    Raises:
        trainer.hf_config.HFConfigError: ``raw_config`` is not a supported model (see
            :func:`trainer.hf_config.parse_config`).
        ValueError: ``out`` is not empty, ``dtype`` or ``max_shard_bytes`` is invalid, or
            ``state`` lacks a parameter of the model.
    """
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
    name = export_dtype(raw_config, dtype)
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; allowed: auto, {', '.join(DTYPES)}")
    cfg = hf_config.parse_config(raw_config, seq_len=1)
    tensors = hf_llama.to_hf(state, cfg, DTYPES[name])
    root = check_empty_out(out)
    root.mkdir(parents=True, exist_ok=True)
    shards = _shard(tensors, max_shard_bytes)
    written = []
    files = (
        [hf.SINGLE]
        if len(shards) == 1
        else [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    )
    for file, shard in zip(files, shards, strict=True):
        save_file(shard, str(root / file), metadata={"format": "pt"})
        written.append(file)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
            "weight_map": {n: f for f, shard in zip(files, shards, strict=True) for n in shard},
        }
        (root / hf.INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        written.append(hf.INDEX)
    config = dict(raw_config)
    config["dtype"] = name
    if "torch_dtype" in config:
        config["torch_dtype"] = name
    (root / hf_config.CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    written.append(hf_config.CONFIG)
    return written


def _shard(tensors: Mapping[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    """Tensors in order, a new shard started where the next would pass ``limit`` bytes (a
    tensor larger than the limit gets a shard of its own)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        if shards[-1] and size + tensor.nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += tensor.nbytes
    return shards


def save_adapter(
    state: Mapping[str, torch.Tensor],
    raw_config: Mapping[str, Any],
    spec: lora.LoraSpec,
    out: str | Path,
    *,
    base_model: str,
    dtype: str = "auto",
    task_type: str = "CAUSAL_LM",
    modules_to_save: Mapping[str, torch.Tensor] | None = None,
    layout: lora.Layout | None = None,
) -> list[str]:
    """Writes the adapters in ``state`` as a PEFT adapter directory ``out`` (created; it must
    not exist or be empty): ``adapter_model.safetensors`` in PEFT's tensor names and
    ``adapter_config.json`` (LoRA for ``task_type``, default a causal LM; ``base_model``
    recorded as ``base_model_name_or_path``). ``modules_to_save`` (default none): whole modules
    trained beside the adapters, as PEFT saves them (``base_model.model.<module>.weight``, the
    adapter name left out: ``get_peft_model_state_dict`` in ``peft/utils/save_and_load.py`` at
    0.21.2), their modules listed in the config's ``modules_to_save``. ``layout`` (default:
    the decoder of ``raw_config``): the adapters of another model (BERT's,
    :func:`trainer.classify.encoder.lora_layout`), whose ``target_modules`` are then the full
    paths of the adapted modules (PEFT matches a listed name exactly or as a ``.``-suffix, and
    BERT's ``output.dense`` is a suffix of ``attention.output.dense``). ``dtype`` as
    :func:`export_dtype`. Returns the names of the files written.

    Raises:
        trainer.hf_config.HFConfigError: ``raw_config`` is not a supported model.
        ValueError: ``out`` is not empty, ``dtype`` is unknown, or ``state`` lacks an adapter.
    """
    name = export_dtype(raw_config, dtype)
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; allowed: auto, {', '.join(DTYPES)}")
    on = hf_config.parse_config(raw_config, seq_len=1) if layout is None else layout
    tensors = {}
    for ours, theirs in lora.peft_names(on, spec).items():
        if ours not in state:
            raise ValueError(f"the checkpoint's model state lacks the adapter {ours}")
        tensors[theirs] = state[ours].to(dtype=DTYPES[name], copy=True).contiguous()
    saved = dict(modules_to_save or {})
    for theirs, tensor in saved.items():
        tensors[theirs] = tensor.to(dtype=DTYPES[name], copy=True).contiguous()
    root = check_empty_out(out)
    root.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(root / lora.ADAPTER_WEIGHTS), metadata={"format": "pt"})
    targets = (
        list(spec.targets)
        if layout is None
        else sorted(path for parts in layout.values() for path, t, _ in parts if t in spec.targets)
    )
    config = _peft_config(spec, base_model, task_type, saved, targets)
    (root / lora.ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return [lora.ADAPTER_WEIGHTS, lora.ADAPTER_CONFIG]


def _peft_config(
    spec: lora.LoraSpec,
    base_model: str,
    task_type: str,
    saved: Mapping[str, torch.Tensor],
    targets: list[str],
) -> dict[str, object]:
    """``adapter_config.json`` of :func:`save_adapter`: PEFT's LoraConfig fields for ``spec``
    on the modules ``targets``, ``saved`` whole modules named in ``modules_to_save``."""
    alpha: float | int = int(spec.alpha) if spec.alpha.is_integer() else spec.alpha
    return {
        "peft_type": "LORA",
        "task_type": task_type,
        "base_model_name_or_path": base_model,
        "r": spec.rank,
        "lora_alpha": alpha,
        "target_modules": targets,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": sorted(
            {n.removeprefix(lora.PEFT_PREFIX).rsplit(".", 1)[0] for n in saved}
        )
        or None,
        "inference_mode": True,
    }


def export_checkpoint(
    checkpoint_dir: str,
    out: str | Path,
    *,
    dtype: str = "auto",
    max_shard_bytes: int = 5 << 30,
    merge_lora: bool = False,
    base_model_id: str = "",
    task_writers: Mapping[str, TaskWriter] | None = None,
    best: bool = False,
) -> list[str]:
    """Writes the newest valid checkpoint in ``checkpoint_dir`` (a path or ``s3://`` URI) to the
    local directory ``out`` (see :func:`save_pretrained` for ``dtype`` and
    ``max_shard_bytes``) with the carried tokenizer files, and returns the files written. The
    checkpoint of a LoRA run becomes a PEFT adapter directory (see
    :func:`save_adapter`), or with ``merge_lora`` (default False) the full model
    with the adapters merged. The adapter names its base model (``base_model_name_or_path``)
    by :func:`base_model_name`. A run of another task (its run config's ``task``, e.g.
    ``classify``) is written by its writer in ``task_writers`` (default none; the CLI passes
    :func:`trainer.classify.export.write_checkpoint`), with the carried tokenizer files.
    ``best`` (default False): the run's best checkpoint by its ``best_metric``
    (:meth:`~trainer.checkpoint.Checkpointer.best_valid`) instead of the newest.

    Raises:
        CheckpointError: no valid checkpoint there, the newest was not saved by a run from a
            model directory (it carries no ``config.json``), or ``merge_lora`` for a checkpoint
            of a run without LoRA.
        ValueError: ``out`` is not a new or empty directory; see
            :func:`save_pretrained`.
    """
    if not checkpoint_dir.startswith("s3://") and not Path(checkpoint_dir).is_dir():
        raise CheckpointError(f"checkpoint directory {checkpoint_dir} does not exist")
    check_empty_out(out)  # before reading a checkpoint that may be gigabytes
    checkpointer = Checkpointer(open_store(checkpoint_dir))
    try:
        options = ExportOptions(dtype, max_shard_bytes, merge_lora, base_model_id, best)
        return _export(checkpointer, checkpoint_dir, out, options, task_writers or {})
    finally:
        checkpointer.store.drop_local_copies()  # from S3: this process's downloads


def _export(
    checkpointer: Checkpointer,
    checkpoint_dir: str,
    out: str | Path,
    options: ExportOptions,
    task_writers: Mapping[str, TaskWriter],
) -> list[str]:
    dtype, limit, merge_lora = options.dtype, options.max_shard_bytes, options.merge_lora
    name = chosen(checkpointer, checkpoint_dir, options.best)
    carried = checkpointer.model_files_of(name)
    if hf_config.CONFIG not in carried:
        raise CheckpointError(
            f"checkpoint {name} in {checkpoint_dir} carries no {hf_config.CONFIG}: only "
            "checkpoints of `trn-train run --model DIR` can be exported as Hugging Face models"
        )
    with checkpointer.model_file(name, hf_config.CONFIG) as path:
        raw = json.loads(path.read_text())
    adapter = (checkpointer.run_of(name) or {}).get("lora")
    if merge_lora and not isinstance(adapter, dict):
        raise CheckpointError(
            f"--merge-lora: checkpoint {name} in {checkpoint_dir} is not of a LoRA run "
            "(`trn-train run --model DIR --lora-rank R`); export it without --merge-lora"
        )
    state = checkpointer.load(name, verify=False, parts=("model",))["model"]
    task = (checkpointer.run_of(name) or {}).get("task")
    if isinstance(task, str) and task in task_writers:
        written = task_writers[task](checkpointer, name, raw, state, out, options)
        return written + _copy_carried(checkpointer, name, carried, out)
    if isinstance(adapter, dict):
        spec = lora.LoraSpec.from_dict(adapter)
        base = checkpointer.base_model_of(name)
        if not merge_lora:
            name_of_base = base_model_name(raw, base, options.base_model_id)
            written = save_adapter(state, raw, spec, out, base_model=name_of_base, dtype=dtype)
            return written + _copy_carried(checkpointer, name, carried, out)
        cfg = hf_config.parse_config(raw, seq_len=1)
        state = lora.merged({**_base_weights(checkpointer, name, base, cfg), **state}, cfg, spec)
    written = save_pretrained(state, raw, out, dtype=dtype, max_shard_bytes=limit)
    return written + _copy_carried(checkpointer, name, carried, out)


@dataclass(frozen=True)
class ExportOptions:
    """How ``trn-train export`` writes: the weights' ``dtype``, the shards' size limit, whether
    LoRA adapters are merged, the adapter's base model id (see :func:`base_model_name`), and
    whether the run's best checkpoint is read rather than its newest."""

    dtype: str = "auto"
    max_shard_bytes: int = 5 << 30
    merge_lora: bool = False
    base_model_id: str = ""
    best: bool = False


# A task's writer of one of its run's checkpoints: given the checkpointer, the checkpoint's
# name, its carried config.json, its model state and the output directory, it writes the
# model and returns the files written (the tokenizer files are copied after it).
TaskWriter = Callable[
    [Checkpointer, str, dict[str, Any], dict[str, torch.Tensor], "str | Path", ExportOptions],
    list[str],
]


def chosen(checkpointer: Checkpointer, checkpoint_dir: str, best: bool) -> str:
    """The newest valid checkpoint, or with ``best`` the best by the run's ``best_metric``.

    Raises:
        CheckpointError: there is none.
    """
    if best:
        found = checkpointer.best_valid()
        if found is None:
            raise CheckpointError(
                f"--best: no checkpoint in {checkpoint_dir} records a best eval figure (runs "
                "with --best-metric and --eval-every write one)"
            )
        return found[0]
    name = checkpointer.newest_valid()
    if name is None:
        raise CheckpointError(f"{checkpoint_dir} holds no valid checkpoint to export")
    return name


def base_model_name(raw_config: Mapping[str, Any], base_dir: str, base_model_id: str) -> str:
    """What an exported adapter names as its base model: ``base_model_id`` when given, else the
    model's own id where its ``config.json`` keeps one (``_name_or_path``, which transformers
    sets from the name a model was loaded by), else the base directory the run read, as an
    absolute path."""
    own = raw_config.get("_name_or_path")
    return base_model_id or (own if isinstance(own, str) and own else base_dir)


def _base_weights(
    checkpointer: Checkpointer, name: str, base: str, cfg: ModelConfig
) -> dict[str, torch.Tensor]:
    """The base weights a LoRA checkpoint's adapters merge into, read from the base model
    directory it recorded (see :func:`checked_base`).

    Raises:
        CheckpointError: see :func:`checked_base`.
    """
    return hf.read_weights(checked_base(checkpointer, name, base), cfg)


def checked_base(checkpointer: Checkpointer, name: str, base: str) -> str:
    """``base``, the base model directory a LoRA checkpoint recorded, checked: its checkpoint
    holds the adapters only, so the base weights are read from there, which must still hold
    the model it was trained on (the same :func:`trainer.hf.fingerprint`).

    Raises:
        CheckpointError: the directory is missing or holds another model.
    """
    recorded = (checkpointer.run_of(name) or {}).get("model")
    if not base or not Path(base).is_dir():
        raise CheckpointError(
            f"--merge-lora: checkpoint {name} holds LoRA adapters only and its base model "
            f"directory {base!r} is not here; export the adapter without --merge-lora, or run "
            "where the base model is"
        )
    found = hf.fingerprint(base)
    if found != recorded:
        raise CheckpointError(
            f"--merge-lora: base model {base} has fingerprint {found}, but checkpoint {name} "
            f"was trained on {recorded}: the adapters only fit the base they were trained on"
        )
    return base


def _copy_carried(
    checkpointer: Checkpointer, name: str, carried: list[str], out: str | Path
) -> list[str]:
    """Copies the carried files but ``config.json`` (the tokenizer's) into ``out``."""
    written = []
    for file in carried:
        if file != hf_config.CONFIG:
            with checkpointer.model_file(name, file) as path:
                (Path(out) / file).write_bytes(path.read_bytes())
            written.append(file)
    return written
