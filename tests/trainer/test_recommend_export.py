"""The two-tower export's files read with safetensors alone: each tower's tensors under its own
names in FP32, the item feature table beside the item tower, and item embeddings that are the
item tower's output computed by hand from the file's tensors; the directory loads back as the
model it was written from."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tolerance import assert_fp32_close

from trainer.recommend import export
from trainer.recommend.data import Layout
from trainer.recommend.model import TwoTower, TwoTowerConfig

MLP = {"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"}
# Items by their category, id + 1 (0: unknown), as prepare-data writes item_features.npy.
CATEGORY = torch.tensor([[1], [3], [0], [2], [1]])
MAPS = {
    "users": ["ann", "bob", "cy"],
    "items": ["i0", "i1", "i2", "i3", "i4"],
    "features": {"region": ["eu", "us"], "category": ["x", "y", "z"]},
}


def _model() -> TwoTower:
    torch.manual_seed(0)
    cfg = TwoTowerConfig(3, 5, user_feature_sizes=(2,), item_feature_sizes=(3,), history=2, dim=4)
    return TwoTower(cfg, CATEGORY, torch.tensor([4, 3, 2, 1, 1]))


def _by_hand(tower: dict[str, torch.Tensor]) -> torch.Tensor:
    """Every item's unit vector from the item tower's file: the item's row and its category's
    row (zeros when unknown) concatenated, the two-layer ReLU MLP, unit length."""
    category = tower["item_features"][:, 0]
    known = (category > 0).unsqueeze(1)
    rows = tower["tables.1.weight"][(category - 1).clamp(min=0)]
    x = torch.cat([tower["tables.0.weight"], torch.where(known, rows, 0.0)], dim=1)
    hidden = F.relu(x @ tower["mlp.0.weight"].T + tower["mlp.0.bias"])
    out = hidden @ tower["mlp.2.weight"].T + tower["mlp.2.bias"]
    return out / out.norm(dim=1, keepdim=True)


def test_the_files_hold_both_towers_and_the_item_vectors_they_make(tmp_path: Path) -> None:
    model = _model()
    layout = Layout(2, ("region",), ("category",))
    written = export.write(model, layout, MAPS, tmp_path)
    assert sorted(written) == sorted(p.name for p in tmp_path.iterdir())

    users = load_file(tmp_path / "user_tower.safetensors")
    items = load_file(tmp_path / "item_tower.safetensors")
    # The user tower: the user, the history's items and the region; the item tower: the item
    # and its category, with the table of each item's category.
    assert set(users) == {f"tables.{k}.weight" for k in range(3)} | MLP
    assert set(items) == {"tables.0.weight", "tables.1.weight", "item_features"} | MLP
    assert users["tables.1.weight"].shape == (5, 4)  # the history's table: one row an item
    assert all(t.dtype == torch.float32 for k, t in items.items() if k != "item_features")
    assert all(t.dtype == torch.float32 for t in users.values())
    assert torch.equal(items["item_features"], CATEGORY)
    assert torch.equal(users["tables.0.weight"], model.user_tower.tables[0].weight.detach())

    embeddings = load_file(tmp_path / "item_embeddings.safetensors")
    assert set(embeddings) == {"embeddings"}
    assert_fp32_close(embeddings["embeddings"], _by_hand(items))
    assert_fp32_close(embeddings["embeddings"].norm(dim=1), torch.ones(5))


def test_the_directory_loads_back_as_the_model(tmp_path: Path) -> None:
    model = _model()
    export.write(model, Layout(2, ("region",), ("category",)), MAPS, tmp_path)
    loaded = export.load(tmp_path)
    rows = torch.tensor([[0, 0, 2, 5, 1], [2, 3, 0, 0, 0]])  # [user, item, history + 1, region]
    with torch.no_grad():
        assert torch.equal(loaded.model.users(rows), model.users(rows))
        assert torch.equal(loaded.model.items(torch.arange(5)), model.items(torch.arange(5)))
    assert loaded.maps.features["category"] == ("x", "y", "z")
    assert loaded.layout == Layout(2, ("region",), ("category",))
