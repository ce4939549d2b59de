"""A two-tower checkpoint as a serving directory (``trn-train export`` of a ``--task recommend``
run), and that directory read back.

The directory: ``config.json`` (the model's shape, the row layout, the files), the user tower
(``user_tower.safetensors``) and the item tower with its item feature table
(``item_tower.safetensors``), in FP32 under the model's own names without the tower's prefix;
``item_embeddings.safetensors`` (``embeddings``: every item's unit vector, ``(items, dim)``, row
``i`` for item id ``i``), what a vector index serves; and the id maps (``users.json``,
``items.json``, ``features.json``) the run's checkpoints carry from its data. A user's vector is
the user tower's output; an item's score is its dot product with the user's vector (the
temperature scales every score alike, so it does not change a ranking).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from trainer.checkpoint import Checkpointer, CheckpointError, open_store
from trainer.recommend.data import ID_FILES, TASK, IdMaps, Layout
from trainer.recommend.model import TwoTower, TwoTowerConfig
from trainer.recommend.sharding import whole_tables

CONFIG = "config.json"
MODEL_TYPE = "two-tower"
TOWERS = {"user_tower": "user_tower.safetensors", "item_tower": "item_tower.safetensors"}
EMBEDDINGS = "item_embeddings.safetensors"


def is_recommend_run(checkpoint_dir: str) -> bool:
    """Whether the newest checkpoint in ``checkpoint_dir`` (a path or ``s3://`` URI) says it
    is of a ``--task recommend`` run (its ``meta.json`` alone, unverified: every checkpoint of
    a directory is of one run); False when there is none or it cannot be read."""
    if not checkpoint_dir.startswith("s3://") and not Path(checkpoint_dir).is_dir():
        return False
    checkpointer = Checkpointer(open_store(checkpoint_dir))
    try:
        names = checkpointer.store.names()
        return bool(names) and (checkpointer.run_of(names[-1]) or {}).get("task") == TASK
    except CheckpointError:
        return False


def from_checkpoint(checkpointer: Checkpointer, name: str) -> tuple[TwoTower, dict[str, object]]:
    """The model of checkpoint ``name`` (on the CPU, in eval mode; a split run's tables joined
    whole) and its run config.

    Raises:
        CheckpointError: the checkpoint is not of a ``--task recommend`` run, unreadable, or
            its state does not load.
    """
    run = checkpointer.run_of(name) or {}
    raw = run.get(TASK)
    if run.get("task") != TASK or not isinstance(raw, dict):
        raise CheckpointError(
            f"checkpoint {name} is not of a `trn-train run --task recommend` run; evaluate it on "
            "data of its own kind"
        )
    cfg = TwoTowerConfig.from_dict(raw)
    state = checkpointer.load(name, verify=False, parts=("model",))["model"]
    model = _empty(cfg)
    try:
        model.load_state_dict(whole_tables(state))
    except (RuntimeError, ValueError) as error:
        raise CheckpointError(f"checkpoint {name}: its model does not load ({error})") from error
    return model.eval(), run


def _empty(cfg: TwoTowerConfig) -> TwoTower:
    """A model of ``cfg`` whose weights and buffers are to be loaded."""
    features = torch.zeros((cfg.num_items, len(cfg.item_feature_sizes)), dtype=torch.int64)
    return TwoTower(cfg, features, torch.ones(cfg.num_items))


def _id_maps(checkpointer: Checkpointer, name: str) -> dict[str, Any]:
    carried = checkpointer.model_files_of(name)
    found = {}
    for key, file in ID_FILES.items():
        if file not in carried:
            raise CheckpointError(f"checkpoint {name} carries no {file}: not exportable")
        with checkpointer.model_file(name, file) as path:
            found[key] = json.loads(path.read_text())
    return found


def export_checkpoint(checkpoint_dir: str, out: str | Path, *, best: bool = False) -> list[str]:
    """Writes the newest valid checkpoint of a ``--task recommend`` run in ``checkpoint_dir``
    (with ``best``: its best by ``--best-metric``) to the new or empty directory ``out`` (see
    the module's documentation); returns the files written.

    Raises:
        CheckpointError: no such checkpoint, or not of a recommendation run.
        ValueError: ``out`` is not new or empty.
    """
    from trainer import hf_export

    root = hf_export.check_empty_out(out)
    checkpointer = Checkpointer(open_store(checkpoint_dir))
    try:
        name = hf_export.chosen(checkpointer, checkpoint_dir, best)
        model, run = from_checkpoint(checkpointer, name)
        maps = _id_maps(checkpointer, name)
    finally:
        checkpointer.store.drop_local_copies()
    layout = run.get("layout")
    assert isinstance(layout, dict), "a recommendation run records its row layout"
    return write(model, Layout(**_layout(layout)), maps, root)


def _layout(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "history": int(raw["history"]),
        "user_features": tuple(raw["user_features"]),
        "item_features": tuple(raw["item_features"]),
    }


def write(model: TwoTower, layout: Layout, maps: Mapping[str, Any], out: Path) -> list[str]:
    """Writes ``model``'s towers, its item embeddings, ``layout`` and the id ``maps`` (users,
    items, features) under ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to(torch.float32 if v.is_floating_point() else v.dtype)
        for k, v in model.state_dict().items()
    }
    for prefix, file in TOWERS.items():
        part = {
            k[len(prefix) + 1 :]: v.contiguous()
            for k, v in state.items()
            if k.startswith(f"{prefix}.")
        }
        if prefix == "item_tower":
            part["item_features"] = state["item_features"].contiguous()
        save_file(part, str(out / file))
    embeddings = model.item_vectors(torch.device("cpu")).contiguous()
    save_file({"embeddings": embeddings}, str(out / EMBEDDINGS))
    for key, file in ID_FILES.items():
        (out / file).write_text(json.dumps(maps[key], indent=1) + "\n")
    config = {
        "model_type": MODEL_TYPE,
        **model.cfg.as_dict(),
        "layout": layout.as_dict(),
        "towers": TOWERS,
        "item_embeddings": EMBEDDINGS,
    }
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return [CONFIG, *TOWERS.values(), EMBEDDINGS, *ID_FILES.values()]


@dataclass(frozen=True)
class Exported:
    """An exported directory read back: the model (eval mode, CPU), the item embeddings as
    written, the row layout and the id maps."""

    model: TwoTower
    embeddings: torch.Tensor
    layout: Layout
    maps: IdMaps


def is_export(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` holds an exported two-tower model."""
    path = Path(model_dir) / CONFIG
    try:
        return bool(json.loads(path.read_text()).get("model_type") == MODEL_TYPE)
    except (OSError, ValueError, AttributeError):
        return False


def load(model_dir: str | Path) -> Exported:
    """The exported two-tower model in ``model_dir``, from its files alone.

    Raises:
        ValueError: ``model_dir`` holds no exported two-tower model, or a file that does not
            fit its config.
    """
    root = Path(model_dir)
    if not is_export(root):
        raise ValueError(
            f"--model {model_dir} holds no exported two-tower model (config.json with "
            f"model_type {MODEL_TYPE!r}: `trn-train export` of a --task recommend run)"
        )
    raw = json.loads((root / CONFIG).read_text())
    model = _empty(TwoTowerConfig.from_dict(raw))
    state: dict[str, torch.Tensor] = {}
    for prefix, file in TOWERS.items():
        for key, value in load_file(str(root / file)).items():
            state[key if key == "item_features" else f"{prefix}.{key}"] = value
    state["log_q"] = model.log_q  # a training buffer, not exported
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(
            f"--model {model_dir}: the towers do not fit config.json ({error})"
        ) from error
    embeddings = load_file(str(root / EMBEDDINGS))["embeddings"]
    if embeddings.shape != (model.cfg.num_items, model.cfg.dim):
        raise ValueError(
            f"--model {model_dir}: {EMBEDDINGS} is {tuple(embeddings.shape)}, config.json "
            f"says {model.cfg.num_items} items of {model.cfg.dim}"
        )
    names = {k: json.loads((root / f).read_text()) for k, f in ID_FILES.items()}
    maps = IdMaps(
        tuple(names["users"]),
        tuple(names["items"]),
        {k: tuple(v) for k, v in names["features"].items()},
    )
    return Exported(model.eval(), embeddings, Layout(**_layout(raw["layout"])), maps)
