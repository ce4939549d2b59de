"""Classification metrics, counted on the host from each eval batch's predictions.

One class per example: the predicted class is the logits' argmax; accuracy; per class
precision ``TP / (TP + FP)``, recall ``TP / (TP + FN)`` and F1 ``2TP / (2TP + FP + FN)``
(0 where the denominator is 0, as scikit-learn's ``zero_division=0``); macro F1 the mean of the
F1s of the classes that occur in the labels or the predictions (scikit-learn's ``average=
"macro"`` over those labels); micro F1 over all decisions (equal to accuracy here); the
confusion matrix with a row per true class and a column per predicted class.

Multi-label: a class is predicted where its logit is above 0 (probability above 0.5); the same
per-class figures; micro F1 over every (example, class) decision; macro F1 as above; each
class's 2x2 confusion ``[[TN, FP], [FN, TP]]``; and the exact-match ratio (every class right).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.where(den > 0, num / np.maximum(den, 1), 0.0)


class Tally:
    """Counts of predictions against labels over the batches of one eval."""

    def __init__(self, names: Sequence[str], multi_label: bool) -> None:
        self.names, self.multi_label = tuple(names), multi_label
        n = len(self.names)
        # Multi-label: per class (TN, FP, FN, TP); else the confusion matrix (true, predicted).
        self.counts = np.zeros((n, 4) if multi_label else (n, n), dtype=np.int64)
        self.examples = 0
        self.exact = 0

    def add(self, logits: np.ndarray, labels: np.ndarray, rows: np.ndarray) -> None:
        """One batch: FP32 ``(batch, classes)`` logits, the labels as the sampler gives them
        (class ids, or a 0/1 matrix) and the bool rows that hold an example."""
        real = np.asarray(rows, dtype=bool)
        logits, labels = np.asarray(logits)[real], np.asarray(labels)[real]
        self.examples += int(real.sum())
        if not self.multi_label:
            np.add.at(self.counts, (labels.astype(np.int64), logits.argmax(-1)), 1)
            return
        predicted, true = logits > 0, labels > 0.5
        self.exact += int(np.all(predicted == true, axis=-1).sum())
        for k, (p, t) in enumerate(((False, False), (True, False), (False, True), (True, True))):
            self.counts[:, k] += ((predicted == p) & (true == t)).sum(axis=0)

    def merge(self, other: Tally) -> None:
        """Adds ``other``'s counts (another rank's share of the same eval)."""
        self.counts += other.counts
        self.examples += other.examples
        self.exact += other.exact

    def _tp_fp_fn(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.multi_label:
            return self.counts[:, 3], self.counts[:, 1], self.counts[:, 2]
        tp = np.diag(self.counts)
        return tp, self.counts.sum(axis=0) - tp, self.counts.sum(axis=1) - tp

    def result(self) -> dict[str, object]:
        """The figures of the module's documentation: ``accuracy`` (one class) or
        ``exact_match`` (multi-label), ``macro_f1``, ``micro_f1``, ``per_class`` (precision,
        recall, F1 and support by class name) and ``confusion``; ``examples`` counted."""
        tp, fp, fn = (x.astype(np.float64) for x in self._tp_fp_fn())
        f1 = _ratio(2 * tp, 2 * tp + fp + fn)
        seen = (tp + fp + fn) > 0
        figures: dict[str, object] = {
            "examples": self.examples,
            "macro_f1": float(f1[seen].mean()) if seen.any() else 0.0,
            "micro_f1": float(_ratio(2 * tp.sum(), 2 * tp.sum() + fp.sum() + fn.sum())),
        }
        if self.multi_label:
            figures["exact_match"] = self.exact / self.examples if self.examples else 0.0
            confusion = {
                n: [[int(c[0]), int(c[1])], [int(c[2]), int(c[3])]]
                for n, c in zip(self.names, self.counts, strict=True)
            }
            figures["confusion"] = confusion
        else:
            figures["accuracy"] = float(tp.sum() / self.examples) if self.examples else 0.0
            figures["confusion"] = self.counts.tolist()
        precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
        figures["per_class"] = {
            name: {
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "f1": float(f1[i]),
                "support": int(tp[i] + fn[i]),
            }
            for i, name in enumerate(self.names)
        }
        return figures
