"""Hugging Face model directories the platform fine-tunes: the architectures and file names that
``trnctl model stage`` checks and the trainer reads. Standard library only (the trainer image
copies trn_catalog).

Names as transformers 5.23.0 defines them: the causal-LM classes of
``models/{llama,qwen2,qwen3,mistral}/modeling_*.py`` and the ``model_type`` of their
``configuration_*.py``, BERT's classes of ``models/bert/modeling_bert.py`` (for
classification), the weight file names of ``utils`` (``SAFE_WEIGHTS_NAME``,
``SAFE_WEIGHTS_INDEX_NAME``) and the tokenizer files of
``tokenization_utils_base`` and the Llama tokenizer (``tokenizer.json`` for the fast tokenizer,
``tokenizer.model`` for SentencePiece).
"""

from __future__ import annotations

import re

# config.json's ``architectures`` (a list of one class name), and the ``model_type`` of each
# architecture's configuration class, which names the architecture where ``architectures`` is
# absent.
MODEL_TYPES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
}
ARCHITECTURES: tuple[str, ...] = tuple(MODEL_TYPES)
# BERT checkpoints, which the classification task trains as an encoder
# (training_image/trainer/classify/encoder.py): the classes of transformers 5.23.0's
# models/bert/modeling_bert.py whose weights hold a BERT encoder (a classifier's, pre-training's
# and masked LM's under "bert.", BertModel's at the top level), and their model_type.
BERT_ARCHITECTURES: tuple[str, ...] = (
    "BertForSequenceClassification",
    "BertModel",
    "BertForPreTraining",
    "BertForMaskedLM",
)
BERT_MODEL_TYPE = "bert"
# What `trnctl model stage` takes: the decoders and BERT.
STAGED_ARCHITECTURES: tuple[str, ...] = (*ARCHITECTURES, *BERT_ARCHITECTURES)
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_SUFFIX = ".safetensors"
# A model directory needs one of these to tokenize: the fast tokenizer or a SentencePiece model.
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer.model")
# Weight formats the trainer does not read; a downloaded model directory often carries them
# beside the safetensors (Llama's original/consolidated.*.pth), and they can be as large.
UNREAD_WEIGHT_SUFFIXES: tuple[str, ...] = (".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")

# The safetensors format (huggingface/safetensors README, "Format"): an 8-byte little-endian
# header length N, N bytes of a JSON object, then the tensor bytes, all of them indexed; the
# reference reader refuses headers above 100,000,000 bytes (safetensors/src/tensor.rs).
SAFETENSORS_LENGTH_BYTES = 8
SAFETENSORS_MAX_HEADER = 100_000_000

# Where staged models live in the datasets bucket, and the names they go by there: a DNS-style
# name (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at
# most 63 characters), which is also a valid Kubernetes label value.
MODELS_PREFIX = "models"
MODEL_NAME_MAX = 63
MODEL_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")
MODEL_NAME_RULE = (
    "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, "
    f"at most {MODEL_NAME_MAX} characters"
)
