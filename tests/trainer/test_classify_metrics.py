"""Classification metrics by hand on small cases: accuracy, per-class precision, recall and F1,
macro and micro F1, the confusion matrix; multi-label micro and macro F1."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.classify.metrics import Tally


def _logits_for(predicted: list[int], classes: int) -> np.ndarray:
    out = np.zeros((len(predicted), classes), dtype=np.float32)
    out[np.arange(len(predicted)), predicted] = 1.0
    return out


def test_single_label_figures_by_hand() -> None:
    true = [0, 0, 0, 1, 1, 2, 0]
    predicted = [0, 1, 0, 1, 2, 2, 2]
    rows = np.array([True] * 6 + [False])  # the last row is padding: not counted
    tally = Tally(("a", "b", "c"), multi_label=False)
    tally.add(_logits_for(predicted[:3], 3), np.array(true[:3]), rows[:3])
    tally.add(_logits_for(predicted[3:], 3), np.array(true[3:]), rows[3:])
    result = tally.result()
    assert result["examples"] == 6
    assert result["accuracy"] == pytest.approx(4 / 6)
    assert result["confusion"] == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    # a: TP 2, FP 0, FN 1; b: TP 1, FP 1, FN 1; c: TP 1, FP 1, FN 0.
    per_class = result["per_class"]
    assert isinstance(per_class, dict)
    assert per_class["a"] == pytest.approx(
        {"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3}
    )
    assert per_class["b"] == pytest.approx(
        {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
    )
    assert per_class["c"] == pytest.approx(
        {"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1}
    )
    assert result["macro_f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    assert result["micro_f1"] == pytest.approx(4 / 6)


def test_classes_never_seen_are_left_out_of_macro_f1() -> None:
    tally = Tally(("a", "b", "c"), multi_label=False)
    tally.add(_logits_for([0, 1], 3), np.array([0, 1]), np.array([True, True]))
    assert tally.result()["macro_f1"] == 1.0


def test_multi_label_f1_by_hand() -> None:
    true = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 0]], dtype=np.float32)
    logits = np.array([[2, -1, -1], [-1, 3, 1], [1, 1, -2], [-1, -1, -1]], dtype=np.float32)
    tally = Tally(("x", "y", "z"), multi_label=True)
    tally.add(logits, true, np.ones(4, dtype=bool))
    result = tally.result()
    # x: TP 2, FP 0, FN 0; y: TP 2, FP 0, FN 0; z: TP 0, FP 1, FN 1.
    assert result["micro_f1"] == pytest.approx(2 * 4 / (2 * 4 + 1 + 1))
    assert result["macro_f1"] == pytest.approx((1.0 + 1.0 + 0.0) / 3)
    assert result["exact_match"] == pytest.approx(2 / 4)
    assert result["confusion"] == {
        "x": [[2, 0], [0, 2]],
        "y": [[2, 0], [0, 2]],
        "z": [[2, 1], [1, 0]],
    }
