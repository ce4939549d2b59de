"""The sequence classifier: the decoder of :mod:`trainer.model` with a score head read at each
row's last non-padding token, as transformers 5.23.0's ``GenericForSequenceClassification``
(``modeling_layers.py``) does for ``LlamaForSequenceClassification``, ``Qwen2...``, ``Qwen3...``
and ``Mistral...``: ``score`` is a linear layer without bias from the hidden size to the
classes, over the final norm's output, and the pooled position of a row is the rightmost one
whose token is not ``pad_token_id`` (``(arange * (ids != pad)).argmax(-1)``; 0 for a row of
padding only). Rows are padded on the right and attention is causal, so no token before it
sees the padding.

The head and the logits are FP32: the pooled hidden state is cast up and the product runs
outside autocast, so that many classes do not share BF16's 8 bits of mantissa. Losses (FP32):
cross-entropy, optionally weighted per class (``F.cross_entropy``'s ``weight``: the weighted
mean ``sum(w[y] * l) / sum(w[y])``); multi-label, binary cross-entropy on each class
(``pos_weight`` per class), averaged over the classes. A row that holds no example (``rows``
False) counts nowhere.

Weights in and out: our parameter names are the decoder's (``tok``, ``blocks.*``, ``norm``)
and ``head.weight`` for transformers' ``score.weight`` (:func:`weight_names`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainer import hf, hf_config, hf_llama
from trainer.config import ModelConfig
from trainer.model import GPT

# transformers' class per architecture for sequence classification, and the causal LM class of
# the same decoder (the one trainer.hf parses).
SEQ_CLS = {
    name.removesuffix("ForCausalLM") + "ForSequenceClassification": name
    for name in hf_config.ARCHITECTURES
}
PROBLEM_TYPES = {False: "single_label_classification", True: "multi_label_classification"}
SCORE = "score.weight"
# transformers' PretrainedConfig initializer_range default: the std of a new head's weights.
INIT_STD = 0.02


@dataclass(frozen=True)
class HeadSpec:
    """What the head predicts: the class names (id ``i`` is ``names[i]``), whether several
    classes apply at once, and the pad token that ends a row."""

    names: tuple[str, ...]
    multi_label: bool
    pad_token_id: int

    @property
    def num_labels(self) -> int:
        return len(self.names)

    def config_fields(self) -> dict[str, Any]:
        """The fields of a transformers config.json that say this head."""
        return {
            "id2label": {str(i): name for i, name in enumerate(self.names)},
            "label2id": {name: i for i, name in enumerate(self.names)},
            "problem_type": PROBLEM_TYPES[self.multi_label],
            "pad_token_id": self.pad_token_id,
        }


def last_token(idx: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """Each row's pooled position: the rightmost whose token is not ``pad_token_id`` (0 for a
    row of padding), as transformers computes it."""
    positions = torch.arange(idx.shape[-1], device=idx.device, dtype=torch.int32)
    return (positions * (idx != pad_token_id).to(torch.int32)).argmax(-1)


class ScoredForward:
    """The ``forward`` of a classifier (a module with ``spec``, ``class_weights`` and
    ``scores``): ``forward(idx, labels, rows)`` the loss summed over the rows that hold an
    example, each weighted (see :func:`loss_sum`); ``forward(idx)`` the logits."""

    spec: HeadSpec
    class_weights: torch.Tensor | None

    def scores(self, idx: torch.Tensor) -> torch.Tensor:
        """FP32 ``(batch, classes)`` logits of int64 ``(batch, seq_len)`` rows."""
        raise NotImplementedError

    def head_parameters(self) -> list[torch.Tensor]:
        """The parameters of the head on the model's hidden states: a LoRA run trains them."""
        raise NotImplementedError

    def forward(
        self,
        idx: torch.Tensor,
        labels: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The loss of :func:`loss_sum`; without ``labels``, the :meth:`scores`."""
        if labels is None or rows is None:
            return self.scores(idx)
        return loss_sum(
            self.scores(idx),
            labels,
            rows,
            multi_label=self.spec.multi_label,
            class_weights=self.class_weights,
        )


class SequenceClassifier(ScoredForward, GPT):
    """The decoder of ``cfg`` with a score head of ``head.num_labels`` outputs in place of the
    output head (an untied one: the embedding is never the head). ``class_weights`` (default
    none): a per-class weight of the cross-entropy, or multi-label the ``pos_weight`` of each
    class's binary cross-entropy. ``forward(idx, labels, rows)`` returns the loss summed over
    the rows that hold an example, each weighted (see :func:`loss_sum`); ``forward(idx)`` the
    logits."""

    def __init__(
        self, cfg: ModelConfig, head: HeadSpec, class_weights: torch.Tensor | None = None
    ) -> None:
        super().__init__(dataclasses.replace(cfg, tie_embeddings=False))
        self.spec = head
        self.head = nn.Linear(cfg.d_model, head.num_labels, bias=False)
        if self.head.weight.device.type != "meta":
            nn.init.normal_(self.head.weight, 0.0, INIT_STD)
        self.class_weights: torch.Tensor | None
        self.register_buffer("class_weights", class_weights, persistent=False)

    def head_parameters(self) -> list[torch.Tensor]:
        """The score head's weight."""
        return [self.head.weight]

    def scores(self, idx: torch.Tensor) -> torch.Tensor:
        """FP32 ``(batch, classes)`` logits of int64 ``(batch, seq_len)`` rows."""
        hidden = self.hidden(idx)
        rows = torch.arange(idx.shape[0], device=idx.device)
        pooled = hidden[rows, last_token(idx, self.spec.pad_token_id)]
        with torch.autocast(pooled.device.type, enabled=False):
            return F.linear(pooled.float(), self.head.weight.float())


def loss_sum(
    logits: torch.Tensor,
    labels: torch.Tensor,
    rows: torch.Tensor,
    *,
    multi_label: bool,
    class_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """The FP32 loss of ``logits`` summed over the rows where ``rows`` is True: each row's
    cross-entropy times its class's weight (1 without ``class_weights``), or multi-label the
    mean over classes of the binary cross-entropy with ``class_weights`` as ``pos_weight``.
    Divided by :func:`normalizer` of the same rows it is the mean ``F.cross_entropy`` (with
    ``weight``) or ``F.binary_cross_entropy_with_logits`` (with ``pos_weight``) computes."""
    logits = logits.float()
    if multi_label:
        each = F.binary_cross_entropy_with_logits(
            logits, labels.float(), pos_weight=class_weights, reduction="none"
        ).mean(-1)
        return torch.where(rows, each, 0.0).sum()
    each = F.cross_entropy(logits, labels, reduction="none")
    if class_weights is not None:
        each = each * class_weights[labels]
    return torch.where(rows, each, 0.0).sum()


def normalizer(
    labels: torch.Tensor | np.ndarray,
    rows: torch.Tensor | np.ndarray,
    *,
    multi_label: bool,
    class_weights: np.ndarray | None = None,
) -> float:
    """What :func:`loss_sum` of the same rows is divided by for the mean: the rows that hold
    an example, each weighted by its class's weight for single-label cross-entropy with
    ``class_weights``."""
    real = np.asarray(rows, dtype=bool)
    if multi_label or class_weights is None:
        return float(np.count_nonzero(real))
    ids = np.asarray(labels, dtype=np.int64)[real]
    return float(np.asarray(class_weights, dtype=np.float64)[ids].sum())


def auto_class_weights(train_labels: np.ndarray, num_labels: int) -> np.ndarray:
    """``--class-weights auto``: inverse class frequency, FP32. One class per example: ``n /
    (classes * n_c)`` (scikit-learn's "balanced", so that a balanced set weighs 1 each);
    multi-label: each class's ``pos_weight``, its negatives over its positives (torch's
    ``BCEWithLogitsLoss`` documentation). A class without a training example weighs 1."""
    n = train_labels.shape[0]
    if train_labels.ndim == 2:
        positives = train_labels.sum(axis=0, dtype=np.float64)
        weights = np.where(positives > 0, (n - positives) / np.maximum(positives, 1), 1.0)
    else:
        counts = np.bincount(train_labels, minlength=num_labels).astype(np.float64)
        weights = np.where(counts > 0, n / (num_labels * np.maximum(counts, 1)), 1.0)
    return weights.astype(np.float32)


def weight_names(cfg: ModelConfig, num_labels: int) -> dict[str, tuple[tuple[str, int], ...]]:
    """Our classifier's parameters to transformers' tensors (name, rows), as
    :func:`trainer.hf_llama.names` maps the decoder, and ``head.weight`` to ``score.weight``."""
    names = hf_llama.names(dataclasses.replace(cfg, tie_embeddings=False))
    names["head.weight"] = ((SCORE, num_labels),)
    return names


def causal_config(raw: Mapping[str, Any], source: str | Path = hf_config.CONFIG) -> dict[str, Any]:
    """A classifier's ``config.json`` with its decoder's causal LM architecture, for
    :func:`trainer.hf_config.parse_config`; a causal LM's as it is.

    Raises:
        hf_config.HFConfigError: ``architectures`` names another class.
    """
    archs = raw.get("architectures")
    if isinstance(archs, list) and len(archs) == 1 and archs[0] in SEQ_CLS:
        return {**raw, "architectures": [SEQ_CLS[archs[0]]]}
    hf_config.architecture(raw, source)
    return dict(raw)


def is_classifier(raw: Mapping[str, Any]) -> bool:
    """Whether a ``config.json`` is of a ``*ForSequenceClassification`` model."""
    archs = raw.get("architectures")
    return isinstance(archs, list) and len(archs) == 1 and archs[0] in SEQ_CLS


def head_of(raw: Mapping[str, Any], source: str | Path = hf_config.CONFIG) -> HeadSpec:
    """The :class:`HeadSpec` of a classifier's ``config.json``.

    Raises:
        hf_config.HFConfigError: no ``id2label``, or no ``pad_token_id``.
    """
    id2label = raw.get("id2label")
    pad = raw.get("pad_token_id")
    if not isinstance(id2label, dict) or len(id2label) < 2:
        raise hf_config.HFConfigError(f"{source}: id2label must name at least two classes")
    if isinstance(pad, bool) or not isinstance(pad, int):
        raise hf_config.HFConfigError(
            f"{source}: pad_token_id must be a token id: the pooled token is the last one "
            "that is not padding"
        )
    names = tuple(str(id2label[k]) for k in sorted(id2label, key=int))
    multi = raw.get("problem_type") == PROBLEM_TYPES[True]
    return HeadSpec(names, multi, pad)


def classifier_head(run: Mapping[str, object]) -> HeadSpec | None:
    """The head a ``--task classify`` run recorded in its run config (its classes,
    multi-label, pad token; see :meth:`trainer.classify.task.Classify.run_fields`), or None for
    a run of another task."""
    if run.get("task") != "classify":
        return None
    labels, pad = run["labels"], run["pad_token_id"]
    assert isinstance(labels, list) and isinstance(pad, int)
    return HeadSpec(tuple(str(n) for n in labels), bool(run["multi_label"]), pad)


def from_state(
    cfg: ModelConfig, head: HeadSpec, state: Mapping[str, torch.Tensor]
) -> SequenceClassifier:
    """A classifier of ``cfg`` and ``head`` holding ``state`` (built on the meta device, then
    assigned; RoPE tables computed)."""
    with torch.device("meta"):
        model = SequenceClassifier(cfg, head)
    model.load_state_dict(dict(state), assign=True)
    model.init_rope()
    return model


def from_causal_lm(model_dir: str | Path, cfg: ModelConfig, head: HeadSpec) -> SequenceClassifier:
    """A new classifier on the decoder of a causal LM directory: its weights, and a score head
    drawn from torch's global generator (normal, std :data:`INIT_STD`, as transformers
    initializes one).

    Raises:
        hf.HFWeightsError: see :func:`trainer.hf.load_pretrained`.
    """
    decoder = hf.load_pretrained(model_dir, cfg).state_dict()
    score = torch.empty(head.num_labels, cfg.d_model)
    nn.init.normal_(score, 0.0, INIT_STD)
    state = {k: v for k, v in decoder.items() if k != "head.weight"}
    return from_state(cfg, head, {**state, "head.weight": score})


def read_weights(
    model_dir: str | Path, cfg: ModelConfig, num_labels: int
) -> dict[str, torch.Tensor]:
    """A classifier directory's weights under our names, FP32 on the CPU (fused where ours
    are).

    Raises:
        hf.HFWeightsError: a tensor is missing, unexpected or of another shape.
    """
    files = hf.tensor_files(model_dir)
    names = weight_names(cfg, num_labels)
    wanted = {name for parts in names.values() for name, _ in parts}
    extra = sorted(n for n in set(files) - wanted if not n.endswith(hf.IGNORED_SUFFIXES))
    missing = sorted(wanted - set(files))
    if extra or missing:
        raise hf.HFWeightsError(
            f"{model_dir}: not the classifier config.json describes: missing "
            f"{', '.join(missing[:5]) or 'none'}; unexpected {', '.join(extra[:5]) or 'none'}"
        )
    state = {}
    with hf._opened(sorted(set(files.values()))) as handles:
        for ours, parts in names.items():
            pieces = [handles[files[name]].get_tensor(name) for name, _ in parts]
            for (name, rows), piece in zip(parts, pieces, strict=True):
                if piece.shape[0] != rows:
                    raise hf.HFWeightsError(
                        f"{files[name]}: tensor {name} has {piece.shape[0]} rows, config.json "
                        f"implies {rows}"
                    )
            state[ours] = torch.cat(pieces).float()
    return state


def load_decoder(model_dir: str | Path, *, seq_len: int = 0) -> SequenceClassifier:
    """The classifier of a decoder's ``*ForSequenceClassification`` directory (ours or
    transformers'), at ``seq_len`` (0: as ``run --model`` takes it).

    Raises:
        hf_config.HFConfigError: not a classifier of a supported decoder (see :func:`head_of`).
        hf.HFWeightsError: see :func:`read_weights`.
    """
    raw = hf_config.read_config(model_dir)
    source = Path(model_dir) / hf_config.CONFIG
    if not is_classifier(raw):
        raise hf_config.HFConfigError(
            f"{source}: architectures {raw.get('architectures')!r} is not a sequence "
            f"classifier; allowed: one of {', '.join([*SEQ_CLS, 'BertForSequenceClassification'])}"
        )
    cfg = hf_config.parse_config(causal_config(raw, source), seq_len=seq_len or None, source=source)
    head = head_of(raw, source)
    return from_state(cfg, head, read_weights(model_dir, cfg, head.num_labels))


def to_hf(
    state: Mapping[str, torch.Tensor], cfg: ModelConfig, num_labels: int, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Our classifier's ``state`` under transformers' names, split where ours are fused.

    Raises:
        ValueError: ``state`` lacks a parameter.
    """
    tensors = {}
    for ours, parts in weight_names(cfg, num_labels).items():
        if ours not in state:
            raise ValueError(f"the model state lacks {ours}")
        pieces = torch.split(state[ours], [rows for _, rows in parts])
        for (name, _), piece in zip(parts, pieces, strict=True):
            tensors[name] = piece.to(dtype=dtype, copy=True).contiguous()
    return tensors
