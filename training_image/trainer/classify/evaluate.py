"""A classifier's figures on prepared data (``trn-train eval`` of a classification dataset, of a
classifier directory or a classification run's checkpoint) and its predictions for new
documents (``trn-train predict``).

Eval reads every example of a split once, in stored order, in the rows training reads (see
:class:`~trainer.classify.data.ClassifySampler`), in FP32 without autocast. The loss is the
unweighted mean cross-entropy (multi-label: binary cross-entropy) over the examples: a figure of
the model and the data, whatever class weights trained it. The other figures are
:class:`~trainer.classify.metrics.Tally`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer import data, device, hf_config, hf_export, lora, tokenizing
from trainer.checkpoint import Checkpointer, CheckpointError, open_store
from trainer.classify import encoder
from trainer.classify.data import ClassifySampler, Labels, cut_row, open_labels, tail_tokens
from trainer.classify.load import Classifier, load_classifier
from trainer.classify.metrics import Tally
from trainer.classify.model import classifier_head, from_state, loss_sum

SPLITS = ("eval", "train")
DEFAULT_MICRO_BATCH = 8


@dataclass
class Totals:
    """The loss sum and example count of an eval, and its :class:`Tally`."""

    tally: Tally
    loss_sum: float = 0.0
    examples: int = 0

    def add(self, logits: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor) -> None:
        """One batch of FP32 host logits and the sampler's labels and rows."""
        multi = self.tally.multi_label
        self.loss_sum += float(loss_sum(logits.double(), labels, rows, multi_label=multi))
        self.examples += int(rows.sum())
        self.tally.add(logits.numpy(), labels.numpy(), rows.numpy())

    def merge(self, other: Totals) -> None:
        """Adds ``other``'s sums and counts (another rank's share of the same eval)."""
        self.tally.merge(other.tally)
        self.loss_sum += other.loss_sum
        self.examples += other.examples

    def result(self) -> dict[str, object]:
        """:meth:`Tally.result` with the mean ``loss`` (None without an example)."""
        loss = self.loss_sum / self.examples if self.examples else None
        return {"loss": loss, **self.tally.result()}


def summary(figures: dict[str, object], multi_label: bool) -> dict[str, object]:
    """The line ``trn-train eval`` prints: ``loss``, ``accuracy`` (multi-label:
    ``micro_f1``), ``macro_f1`` and ``examples``."""
    first = "micro_f1" if multi_label else "accuracy"
    return {k: figures[k] for k in ("loss", first, "macro_f1", "examples")}


def evaluate(
    scores: Callable[[torch.Tensor], torch.Tensor],
    sampler: ClassifySampler,
    labels: Labels,
    on: torch.device,
) -> Totals:
    """:class:`Totals` of ``scores`` (token rows on ``on`` to logits) over every row of
    ``sampler``'s first epoch, without gradients."""
    totals = Totals(Tally(labels.names, labels.multi_label))
    with torch.no_grad():
        for step in range(sampler.steps_in(0)):
            for micro in range(sampler.grad_accum):
                x, y, rows = sampler.batch(step, micro)
                totals.add(scores(x.to(on)).float().cpu(), y, rows)
    return totals


def run(
    *,
    data_dir: str,
    model_dir: str = "",
    checkpoint_dir: str = "",
    split: str = "eval",
    seq_len: int = 0,
    micro_batch: int = DEFAULT_MICRO_BATCH,
    device_name: str = "auto",
) -> dict[str, object]:
    """``trn-train eval`` on a classification dataset: every figure of :meth:`Totals.result`
    for ``split`` (``eval`` or ``train``) of ``data_dir``, of the classifier in ``model_dir``
    or of the newest valid checkpoint of a ``--task classify`` run in ``checkpoint_dir``
    (exactly one).

    Raises:
        ValueError: both or neither model source, an unknown split, a split the data does not
            have, a micro batch below 1, a model whose classes are not the data's; see
            :func:`trainer.classify.load.load_classifier`,
            :func:`model_from_checkpoint` and :func:`trainer.classify.data.open_labels`.
    """
    if bool(model_dir) == bool(checkpoint_dir):
        raise ValueError("give exactly one of --model DIR and --checkpoint-dir CK")
    if split not in SPLITS:
        raise ValueError(f"--split {split!r} of classification data; allowed: {', '.join(SPLITS)}")
    if micro_batch < 1:
        raise ValueError(f"--micro-batch must be >= 1, got {micro_batch}")
    dataset, labels = data.open_dataset(data_dir, verify=False), open_labels(data_dir)
    part, array = (dataset, labels.train) if split == "train" else (dataset.eval_split, labels.eval)
    if part is None or array is None:
        raise ValueError(f"--data {data_dir} has no held-out split; --split train reads the rest")
    model = (
        load_classifier(model_dir, seq_len=seq_len)
        if model_dir
        else model_from_checkpoint(checkpoint_dir, seq_len)
    )
    if model.spec.names != labels.names or model.spec.multi_label != labels.multi_label:
        raise ValueError(
            f"the model classifies into {list(model.spec.names)}"
            f"{' (multi-label)' if model.spec.multi_label else ''}, --data {data_dir} holds "
            f"{list(labels.names)}{' (multi-label)' if labels.multi_label else ''}"
        )
    sampler = ClassifySampler(
        part,
        array,
        pad_token_id=model.spec.pad_token_id,
        seq_len=model.cfg.seq_len,
        micro_batch=micro_batch,
        seed=0,
        shuffle=False,
        tail=labels.tail,
    )
    backend = device.resolve(device_name, compile_backend="none").start()
    model = model.to(backend.device).eval()
    return evaluate(model.scores, sampler, labels, backend.device).result()


def model_from_checkpoint(checkpoint_dir: str, seq_len: int) -> Classifier:
    """The classifier of the newest valid checkpoint of a ``--task classify`` run in
    ``checkpoint_dir`` (a path or ``s3://`` URI) at ``seq_len`` (0: the run's); a LoRA run's
    adapters and head on the base model directory it recorded (checked as ``trn-train export
    --merge-lora`` checks it; a BERT run's adapters merged into it).

    Raises:
        CheckpointError: no valid checkpoint, one not of a classification run, or a LoRA
            checkpoint whose base model directory is missing or holds another model.
    """
    checkpointer = Checkpointer(open_store(checkpoint_dir))
    try:
        name = checkpointer.newest_valid()
        if name is None:
            raise CheckpointError(f"{checkpoint_dir} holds no valid checkpoint to evaluate")
        run = checkpointer.run_of(name) or {}
        head = classifier_head(run)
        if head is None or hf_config.CONFIG not in checkpointer.model_files_of(name):
            raise CheckpointError(
                f"checkpoint {name} in {checkpoint_dir} is not of a `trn-train run --task "
                "classify` run; evaluate it on data of its own kind"
            )
        with checkpointer.model_file(name, hf_config.CONFIG) as path:
            raw = json.loads(path.read_text())
        length = seq_len or run.get("seq_len")
        state = checkpointer.load(name, verify=False, parts=("model",))["model"]
        if encoder.is_bert(raw):
            return _bert(checkpointer, name, raw, state, length if isinstance(length, int) else 0)
        cfg = hf_config.parse_config(raw, seq_len=length if isinstance(length, int) else None)
        adapter = run.get("lora")
        if not isinstance(adapter, dict):
            return from_state(cfg, head, state)
        base = hf_export._base_weights(checkpointer, name, checkpointer.base_model_of(name), cfg)
        model = from_state(cfg, head, {**base, "head.weight": state["head.weight"]})
        lora.apply(model, cfg, lora.LoraSpec.from_dict(adapter))
        model.load_state_dict({**model.state_dict(), **state})
        return model
    finally:
        checkpointer.store.drop_local_copies()


def _bert(
    checkpointer: Checkpointer,
    name: str,
    raw: dict[str, Any],
    state: dict[str, torch.Tensor],
    seq_len: int,
) -> encoder.BertClassifier:
    """The BERT classifier of checkpoint ``name`` (its ``config.json`` ``raw`` and model
    ``state``) at ``seq_len`` (0: see :func:`trainer.classify.encoder.parse_config`), a LoRA
    run's adapters merged into its base weights."""
    run = checkpointer.run_of(name) or {}
    head = classifier_head(run)
    assert head is not None, "model_from_checkpoint checks the run's classes first"
    cfg = encoder.parse_config(raw, seq_len=seq_len or None)
    adapter = run.get("lora")
    if isinstance(adapter, dict):
        base = hf_export.checked_base(checkpointer, name, checkpointer.base_model_of(name))
        layout = encoder.lora_layout(cfg)
        spec = lora.LoraSpec.from_dict(adapter)
        state = lora.merged({**encoder.read_state(base), **state}, layout, spec)
    return encoder.from_state(cfg, head, state)


def _texts(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    for where, record in tokenizing._json_lines(path):
        text = record.get("text")
        if not isinstance(text, str):
            raise tokenizing.InputError(f"{where}: field 'text' must be a string, got {text!r:.40}")
        yield record, text


def prediction(logits: torch.Tensor, model: Classifier) -> dict[str, object]:
    """One row's prediction: ``label`` (the argmax) and ``scores`` (softmax probabilities by
    class name); multi-label ``labels`` (each class above 0.5) and ``scores`` (sigmoids)."""
    names = model.spec.names
    if model.spec.multi_label:
        probs = torch.sigmoid(logits).tolist()
        return {
            "labels": [n for n, p in zip(names, probs, strict=True) if p > 0.5],
            "scores": dict(zip(names, probs, strict=True)),
        }
    probs = torch.softmax(logits, -1).tolist()
    return {"label": names[int(np.argmax(probs))], "scores": dict(zip(names, probs, strict=True))}


def predict(
    *,
    model_dir: str,
    input_path: str,
    out: str,
    seq_len: int = 0,
    micro_batch: int = DEFAULT_MICRO_BATCH,
    device_name: str = "auto",
) -> int:
    """``trn-train predict``: each JSON line of ``input_path`` (a ``text`` field, other fields
    kept) written to ``out`` with the :func:`prediction` of ``model_dir``'s classifier beside
    its fields, its text tokenized by the tokenizer in ``model_dir`` and cut at ``seq_len``
    (0: as ``run --model`` takes it) as training cuts it
    (:func:`~trainer.classify.data.cut_row`). Returns the lines written.

    Raises:
        ValueError: a line without a string ``text``; see
            :func:`trainer.classify.model.load_classifier`.
    """
    if micro_batch < 1:
        raise ValueError(f"--micro-batch must be >= 1, got {micro_batch}")
    model = load_classifier(model_dir, seq_len=seq_len)
    tokenizer = tokenizing.HfTokenizer(model_dir, needs_eos=False)
    backend = device.resolve(device_name, compile_backend="none").start()
    model = model.to(backend.device).eval()
    records = list(_texts(Path(input_path)))
    length, pad, tail = model.cfg.seq_len, model.spec.pad_token_id, tail_tokens(tokenizer)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f, torch.no_grad():
        for start in range(0, len(records), micro_batch):
            chunk = records[start : start + micro_batch]
            rows = torch.full((micro_batch, length), pad, dtype=torch.int64)
            for i, (_, text) in enumerate(chunk):
                ids = cut_row(np.asarray(tokenizer.tok(text)["input_ids"]), length, tail)
                rows[i, : ids.size] = torch.from_numpy(ids.astype(np.int64))
            logits = model.scores(rows.to(backend.device)).float().cpu()
            for (record, _), row in zip(chunk, logits, strict=False):
                f.write(json.dumps({**record, **prediction(row, model)}) + "\n")
    return len(records)


def is_classification_data(data_dir: str | Path) -> bool:
    """Whether ``data_dir``'s manifest is of ``prepare-data --format classify``."""
    path = Path(data_dir) / data.MANIFEST
    try:
        return bool(json.loads(path.read_text()).get("task") == "classify")
    except (OSError, ValueError, AttributeError):
        return False
