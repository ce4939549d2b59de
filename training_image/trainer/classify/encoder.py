"""A BERT encoder classifier, as transformers 5.23.0's ``BertForSequenceClassification``
computes one (``models/bert/modeling_bert.py``), with its parameter names, so that its weights
load and export as they are.

BERT is the encoder family the Neuron documentation trains (its BERT MRPC fine-tuning tutorial
is marked for Trn1, Trn2 and Trn3; docs/classification.md gives the sources). The model: word,
absolute position and token-type embeddings (every token of type 0: one text per row) summed
and layer-normed; per layer, bidirectional attention over the row's tokens that are not padding
(``attention_mask`` from ``pad_token_id``), then dense + residual + LayerNorm, a GELU (erf)
feed-forward, dense + residual + LayerNorm; the pooling its config implies, BERT's pooler
(``tanh(dense(h[CLS]))`` on position 0); then the ``classifier`` linear layer with bias.
Pooler and classifier run in FP32 outside autocast, as the decoder's score head does. Dropout
is left out (the trainer's runs have none). A row of padding only attends to its position 0,
so that no softmax runs over nothing (its loss and figures are never counted).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer import hf, hf_config, lora
from trainer.classify.model import INIT_STD, HeadSpec, ScoredForward, head_of
from trainer.config import MODEL_SEQ_LEN, ModelConfig
from trn_catalog import hf_models

MODEL_TYPE = hf_models.BERT_MODEL_TYPE
CLASSIFIER = "BertForSequenceClassification"
# Checkpoints whose weights hold a BERT encoder under "bert." (a classifier, pre-training and
# masked-LM checkpoints) or at the top level (BertModel).
BASES = hf_models.BERT_ARCHITECTURES
# BertConfig's defaults (configuration_bert.py at 5.23.0) for the fields read here.
DEFAULTS: Mapping[str, Any] = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "is_decoder": False,
}


# The decoder's LoRA target names (--lora-targets) on the linear layers of each BERT layer, as
# they do the same work; BERT has no gate_proj (its feed-forward is one GELU up projection and
# one down projection), so that target adapts nothing here.
LORA_MODULES: Mapping[str, str] = {
    "q_proj": "attention.self.query",
    "k_proj": "attention.self.key",
    "v_proj": "attention.self.value",
    "o_proj": "attention.output.dense",
    "up_proj": "intermediate.dense",
    "down_proj": "output.dense",
}


# LayerNorm parameter names of checkpoints saved before BERT used nn.LayerNorm (Google's own
# bert-base-* safetensors on the Hub still hold them), which transformers 5.23.0 renames on
# load for every model (the "legacy" renamings of conversion_mapping.py).
LEGACY_NORM_NAMES: Mapping[str, str] = {
    "LayerNorm.gamma": "LayerNorm.weight",
    "LayerNorm.beta": "LayerNorm.bias",
}


# The modules of BERT's classification head: the pooler and the classifier (both with biases).
HEAD_MODULES = ("bert.pooler.dense", "classifier")


@dataclass(frozen=True)
class BertConfig:
    """The shape of a BERT encoder and the sequence length it runs at."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    seq_len: int


def is_bert(raw: Mapping[str, Any]) -> bool:
    """Whether a ``config.json`` is of a BERT model."""
    archs = raw.get("architectures")
    if isinstance(archs, list) and archs:
        return all(a in BASES for a in archs)
    return raw.get("model_type") == MODEL_TYPE


def parse_config(
    raw: Mapping[str, Any], *, seq_len: int | None = None, source: str | Path = hf_config.CONFIG
) -> BertConfig:
    """The :class:`BertConfig` of a BERT ``config.json``; ``seq_len`` None takes what ``run
    --model`` takes of a decoder: :data:`trainer.config.MODEL_SEQ_LEN` capped at
    ``max_position_embeddings``.

    Raises:
        hf_config.HFConfigError: an activation other than ``gelu``, a decoder, a shape field that is
            not a positive integer, a hidden size not divisible by the heads, or ``seq_len``
            outside 1..``max_position_embeddings``.
    """

    def get(field: str) -> Any:
        return raw.get(field, DEFAULTS[field])

    if get("hidden_act") != "gelu" or get("is_decoder"):
        raise hf_config.HFConfigError(
            f"{source}: hidden_act {get('hidden_act')!r}, is_decoder {get('is_decoder')!r}: "
            "allowed: 'gelu', false (a BERT encoder)"
        )
    sizes = {}
    for field in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
    ):
        value = get(field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise hf_config.HFConfigError(
                f"{source}: {field} must be a positive integer, got {value!r}"
            )
        sizes[field] = value
    if sizes["hidden_size"] % sizes["num_attention_heads"]:
        raise hf_config.HFConfigError(
            f"{source}: hidden_size {sizes['hidden_size']} must be a multiple of "
            f"num_attention_heads {sizes['num_attention_heads']}"
        )
    limit = sizes["max_position_embeddings"]
    length = min(MODEL_SEQ_LEN, limit) if seq_len is None else seq_len
    if not 1 <= length <= limit:
        raise hf_config.HFConfigError(
            f"{source}: seq_len {length} must be between 1 and max_position_embeddings {limit}"
        )
    return BertConfig(**sizes, layer_norm_eps=float(get("layer_norm_eps")), seq_len=length)


def config_of(model_dir: str | Path, *, seq_len: int = 0) -> BertConfig | None:
    """The :class:`BertConfig` of ``model_dir`` at ``seq_len`` (0: see :func:`parse_config`),
    or None when it holds another model.

    Raises:
        hf_config.HFConfigError: no readable ``config.json``; see :func:`parse_config`.
    """
    raw = hf_config.read_config(model_dir)
    if not is_bert(raw):
        return None
    return parse_config(raw, seq_len=seq_len or None, source=Path(model_dir) / hf_config.CONFIG)


def shape(cfg: BertConfig) -> ModelConfig:
    """The training loop's view of the encoder's shape (layers, heads, width, feed-forward,
    vocabulary, sequence length), as the GPT-2-style decoder of the same shape without an
    output head of its own: what the run config records and what the loop's parameter count
    (for its memory plan) and attention FLOPs read. That decoder has BERT's parameters but for
    the pooler, the token-type table and the positions beyond ``seq_len`` (about 0.5% of
    BERT-base at 512); the model the run trains is :class:`BertClassifier`."""
    return ModelConfig(
        n_layer=cfg.num_hidden_layers,
        n_head=cfg.num_attention_heads,
        d_model=cfg.hidden_size,
        seq_len=cfg.seq_len,
        vocab_size=cfg.vocab_size,
        d_ff=cfg.intermediate_size,
        norm_eps=cfg.layer_norm_eps,
    )


def lora_layout(cfg: BertConfig) -> lora.Layout:
    """Where LoRA adapters go on BERT (see :data:`LORA_MODULES`): each layer's targeted linear
    layers, whose paths are transformers' too (our parameter names are BERT's)."""
    layout = {}
    for i in range(cfg.num_hidden_layers):
        for target, module in LORA_MODULES.items():
            path = f"bert.encoder.layer.{i}.{module}"
            rows = cfg.intermediate_size if target == "up_proj" else cfg.hidden_size
            layout[path] = ((path, target, rows),)
    return layout


class _Embeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[-1]
        x = self.word_embeddings(idx) + self.token_type_embeddings.weight[0]
        out: torch.Tensor = self.LayerNorm(x + self.position_embeddings.weight[:t])
        return out


class _SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape

        def split(proj: nn.Linear) -> torch.Tensor:
            heads: torch.Tensor = proj(x).view(b, t, self.heads, d // self.heads)
            return heads.transpose(1, 2)

        y = F.scaled_dot_product_attention(
            split(self.query), split(self.key), split(self.value), attn_mask=mask
        )
        return y.transpose(1, 2).reshape(b, t, d)


class _DenseNorm(nn.Module):
    """``LayerNorm(dense(x) + residual)``: BERT's output of attention and of the MLP."""

    def __init__(self, cfg: BertConfig, width: int) -> None:
        super().__init__()
        self.dense = nn.Linear(width, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.LayerNorm(self.dense(x) + residual)
        return out


class _Attention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.self = _SelfAttention(cfg)
        self.output = _DenseNorm(cfg, cfg.hidden_size)


class _Intermediate(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)


class _Layer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = _Attention(cfg)
        self.intermediate = _Intermediate(cfg)
        self.output = _DenseNorm(cfg, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention.output(self.attention.self(x, mask), x)
        out: torch.Tensor = self.output(F.gelu(self.intermediate.dense(x)), x)
        return out


class _Encoder(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_Layer(cfg) for _ in range(cfg.num_hidden_layers))


class _Pooler(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)


class _Bert(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.embeddings = _Embeddings(cfg)
        self.encoder = _Encoder(cfg)
        self.pooler = _Pooler(cfg)


class BertClassifier(ScoredForward, nn.Module):
    """BERT with a classifier of ``head.num_labels`` outputs; ``forward(idx, labels, rows)``
    and ``forward(idx)`` as :class:`trainer.classify.model.SequenceClassifier`'s."""

    def __init__(
        self, cfg: BertConfig, head: HeadSpec, class_weights: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        self.cfg, self.spec = cfg, head
        self.bert = _Bert(cfg)
        self.classifier = nn.Linear(cfg.hidden_size, head.num_labels)
        self.class_weights: torch.Tensor | None
        self.register_buffer("class_weights", class_weights, persistent=False)
        if self.classifier.weight.device.type != "meta":
            self.apply(_init)

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """``(batch, seq_len, hidden)``: the last layer's output."""
        t = idx.shape[-1]
        first = torch.arange(t, device=idx.device) == 0
        # (batch, 1, 1, seq_len): every query attends to the row's tokens (and position 0).
        mask = ((idx != self.spec.pad_token_id) | first)[:, None, None, :]
        x: torch.Tensor = self.bert.embeddings(idx)
        for layer in self.bert.encoder.layer:
            x = layer(x, mask)
        return x

    @property
    def blocks(self) -> nn.ModuleList:
        """The encoder's layers, as the decoder's ``blocks``: what activation checkpointing
        wraps and FSDP2 shards one by one (:mod:`trainer.parallel`); a wrapper keeps the
        state-dict names."""
        return self.bert.encoder.layer

    def head_parameters(self) -> list[torch.Tensor]:
        """The pooler's and the classifier's weights and biases (a LoRA run trains both: the
        pooler is new where the checkpoint had none, and PEFT keeps it with the classifier,
        see :mod:`trainer.classify.export`)."""
        return [*self.bert.pooler.parameters(), *self.classifier.parameters()]

    def scores(self, idx: torch.Tensor) -> torch.Tensor:
        """FP32 ``(batch, classes)`` logits."""
        first = self.hidden(idx)[:, 0]
        with torch.autocast(first.device.type, enabled=False):
            pooler = self.bert.pooler.dense
            pooled = torch.tanh(F.linear(first.float(), pooler.weight.float(), pooler.bias.float()))
            return F.linear(pooled, self.classifier.weight.float(), self.classifier.bias.float())


def _init(module: nn.Module) -> None:
    """transformers' BERT initialization: normal(0, 0.02) matrices, zero biases, unit norms."""
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, 0.0, INIT_STD)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def read_state(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """A BERT directory's encoder weights (``bert.*`` names; a ``BertModel``'s top-level names
    get the prefix; legacy ``LayerNorm.gamma``/``beta`` become ``weight``/``bias``, as
    transformers renames them) and its ``classifier.*`` when it has one, FP32; other heads
    (``cls.*``: pre-training) are left out."""
    files = hf.tensor_files(model_dir)
    state = {}
    with hf._opened(sorted(set(files.values()))) as handles:
        for name, path in files.items():
            ours = name if name.startswith(("bert.", "classifier.")) else f"bert.{name}"
            for legacy, current in LEGACY_NORM_NAMES.items():
                if ours.endswith(legacy):
                    ours = ours.removesuffix(legacy) + current
            if not ours.startswith("bert.cls") and not name.startswith("cls."):
                state[ours] = handles[path].get_tensor(name).float()
    state.pop("bert.embeddings.position_ids", None)
    return state


def _drawn(shape: tuple[int, ...], bias: bool) -> torch.Tensor:
    """A new head tensor as :func:`_init` draws it (from torch's global generator)."""
    return torch.zeros(shape) if bias else nn.init.normal_(torch.empty(shape), 0.0, INIT_STD)


def load(
    model_dir: str | Path, *, seq_len: int = 0, head: HeadSpec | None = None
) -> BertClassifier:
    """The BERT classifier of ``model_dir``: a ``BertForSequenceClassification`` with its own
    head, or (``head`` given) any BERT checkpoint's encoder with a new classifier drawn from
    torch's global generator (the pooler kept when the checkpoint has one, else drawn too).

    Raises:
        hf_config.HFConfigError: see :func:`parse_config` and
            :func:`trainer.classify.model.head_of`.
        hf.HFWeightsError: the weights do not fit the config, or (``head`` None) hold no
            classifier.
    """
    raw = hf_config.read_config(model_dir)
    source = Path(model_dir) / hf_config.CONFIG
    cfg = parse_config(raw, seq_len=seq_len or None, source=source)
    new_head = head is not None
    head = head or head_of(raw, source)
    with torch.device("meta"):
        model = BertClassifier(cfg, head)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state = read_state(model_dir)
    if new_head:
        state = {k: v for k, v in state.items() if not k.startswith("classifier.")}
        for name, shape in expected.items():
            if name.startswith(("classifier.", "bert.pooler.")) and name not in state:
                state[name] = _drawn(shape, name.endswith(".bias"))
    elif "classifier.weight" not in state:
        # A classifier to evaluate or predict with is never drawn: its scores would be noise.
        raise hf.HFWeightsError(
            f"{model_dir}: holds no classifier weights (classifier.weight): not a "
            f"{CLASSIFIER}; `trn-train run --task classify --model` trains one on it"
        )
    found = {k: tuple(v.shape) for k, v in state.items()}
    if found != expected:
        wrong = sorted(set(found.items()) ^ set(expected.items()))[:5]
        raise hf.HFWeightsError(f"{model_dir}: weights do not fit its config.json: {wrong}")
    return from_state(cfg, head, state)


def from_state(
    cfg: BertConfig, head: HeadSpec, state: Mapping[str, torch.Tensor]
) -> BertClassifier:
    """A BERT classifier of ``cfg`` and ``head`` holding ``state`` (built on the meta device,
    then assigned)."""
    with torch.device("meta"):
        model = BertClassifier(cfg, head)
    model.load_state_dict(dict(state), assign=True)
    return model
