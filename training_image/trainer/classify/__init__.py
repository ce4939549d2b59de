"""Sequence classification (``--task classify``): labelled documents in, a score head on a
decoder's last non-padding token, cross-entropy or binary cross-entropy, accuracy and F1, and a
Hugging Face ``*ForSequenceClassification`` directory out.

Modules: :mod:`.data` (``prepare-data --format classify``, the label files, the batches),
:mod:`.model` (the classifier and its losses), :mod:`.metrics` (accuracy, F1, confusion) and
:mod:`.export` (the Hugging Face directory, the PEFT ``SEQ_CLS`` adapter).
"""

__all__: list[str] = []
