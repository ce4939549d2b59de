"""A classifier directory loaded as the model it holds: a decoder's
``*ForSequenceClassification`` (:mod:`trainer.classify.model`) or BERT's
(:mod:`trainer.classify.encoder`)."""

from __future__ import annotations

from pathlib import Path

from trainer import hf_config
from trainer.classify import encoder
from trainer.classify.model import SequenceClassifier, load_decoder

Classifier = SequenceClassifier | encoder.BertClassifier


def load_classifier(model_dir: str | Path, *, seq_len: int = 0) -> Classifier:
    """The classifier in ``model_dir`` at ``seq_len`` (0: the decoder's default, or BERT's
    ``max_position_embeddings``): it has ``spec`` (its :class:`~trainer.classify.model.HeadSpec`),
    ``cfg.seq_len`` and ``scores(idx)``.

    Raises:
        hf_config.HFConfigError, hf.HFWeightsError: see :func:`trainer.classify.model.load_decoder`
            and :func:`trainer.classify.encoder.load`.
    """
    if encoder.is_bert(hf_config.read_config(model_dir)):
        return encoder.load(model_dir, seq_len=seq_len)
    return load_decoder(model_dir, seq_len=seq_len)
