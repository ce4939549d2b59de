"""Model presets and the one training config dataclass: plain data, which imports no other
trainer module. What its fields name (a Hugging Face model directory's ``config.json``, the
LoRA spec) is read by :func:`trainer.model_spec.resolve`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Parallel = Literal["ddp", "fsdp"]
ACTIVATION_CHECKPOINTING = ("on", "off", "auto")
# What a run trains: next-token prediction, a classification head (trainer.classify), or a
# two-tower retrieval model (trainer.recommend).
TASKS = ("causal-lm", "classify", "recommend")
CLASS_WEIGHTS = ("none", "auto")
# Whether a two-tower run splits its embedding tables row-wise across the ranks: auto does when
# their training state outgrows one rank's device memory (trainer.recommend.task.shards_tables).
SHARD_EMBEDDINGS = ("auto", "on", "off")
# ``auto`` turns activation checkpointing on above this many parameters (~1e9: Llama-3.2-1B's
# 1.24e9 and up). Our choice: below it a fine-tune's activations at the default sequence length
# fit next to the sharded state, above it they dominate device memory.
AUTO_CHECKPOINT_PARAMS = 1_000_000_000


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's RoPE frequency scaling (Hugging Face ``rope_type`` "llama3"): wavelengths longer
    than ``original_max_position_embeddings / low_freq_factor`` are stretched by ``factor``,
    those shorter than ``original_max_position_embeddings / high_freq_factor`` are kept, and the
    ones between are blended."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the decoder.

    ``llama_style`` switches learned positions, LayerNorm and a GELU MLP (GPT-2) for RoPE,
    RMSNorm and SwiGLU (Llama); ``n_kv_head`` below ``n_head`` is grouped-query attention.
    The fields after ``rope_theta`` describe Hugging Face models (see :mod:`trainer.hf_config`) and
    default to the presets' choices: ``d_head`` 0 (``d_model // n_head``), ``norm_eps`` 1e-5,
    no RoPE scaling, and in the Llama style no attention biases (``qkv_bias``: q, k and v;
    ``out_bias``: the output projection) and no per-head RMSNorm of queries and keys
    (``qk_norm``, Qwen3's). The GPT-2 style always has biases.
    """

    n_layer: int
    n_head: int
    d_model: int
    seq_len: int
    vocab_size: int
    d_ff: int = 0  # 0: 4 * d_model
    n_kv_head: int = 0  # 0: n_head
    llama_style: bool = False
    tie_embeddings: bool = True
    rope_theta: float = 500_000.0
    d_head: int = 0  # 0: d_model // n_head
    norm_eps: float = 1e-5
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False
    out_bias: bool = False
    qk_norm: bool = False

    @property
    def ffn_width(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_head

    def __post_init__(self) -> None:
        if not self.d_head and self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} must be divisible by n_head {self.n_head}")
        if self.n_head % self.kv_heads:
            raise ValueError(
                f"n_head {self.n_head} must be a multiple of n_kv_head {self.kv_heads}"
            )


@dataclass(frozen=True)
class RunDefaults:
    """What a run takes when its flags leave micro batch, parallelism or learning rate unset."""

    micro_batch: int
    parallel: Parallel
    lr: float


@dataclass(frozen=True)
class Preset:
    model: ModelConfig
    micro_batch: int
    parallel: Parallel
    lr: float


PRESETS: dict[str, Preset] = {
    # Seconds on a laptop CPU: what the tests train.
    "tiny": Preset(
        ModelConfig(n_layer=2, n_head=2, d_model=64, seq_len=64, vocab_size=256), 8, "ddp", 3e-3
    ),
    # ~11M parameters (nanoGPT's character model shape): the benchmark model.
    "small": Preset(
        ModelConfig(n_layer=6, n_head=6, d_model=384, seq_len=256, vocab_size=256), 8, "ddp", 1e-3
    ),
    # GPT-2 small, vocabulary padded to a multiple of 64.
    "125m": Preset(
        ModelConfig(n_layer=12, n_head=12, d_model=768, seq_len=2048, vocab_size=50304),
        4,
        "ddp",
        6e-4,
    ),
    # Llama-3.2-1B's shape (config.json of meta-llama/Llama-3.2-1B): sharded with FSDP2.
    "1b": Preset(
        ModelConfig(
            n_layer=16,
            n_head=32,
            n_kv_head=8,
            d_model=2048,
            d_ff=8192,
            seq_len=2048,
            vocab_size=128256,
            llama_style=True,
        ),
        1,
        "fsdp",
        3e-4,
    ),
}


# Fine-tuning a Hugging Face model (``--model``): one sequence per rank, a full fine-tuning
# learning rate (our choice, the order of magnitude published full fine-tunes of Llama-family
# models use) and FSDP, which shards a model of any size (one rank trains it unwrapped).
MODEL_DEFAULTS = RunDefaults(micro_batch=1, parallel="fsdp", lr=2e-5)
# A LoRA run's learning rate: ten times full fine-tuning's, as TRL recommends for SFT (its
# docs/source/peft_integration.md at v1.9.0: 2.0e-5 full, 2.0e-4 with LoRA); at the full rate
# the adapters barely move.
LORA_LR = 2e-4
# AdamW's weight decay on matrices: 0.1 for full training (nanoGPT's and the presets'); none on
# LoRA adapters, transformers' Trainer default (TrainingArguments.weight_decay 0.0 at 5.23.0),
# which PEFT's and TRL's LoRA examples keep.
WEIGHT_DECAY = 0.1
LORA_WEIGHT_DECAY = 0.0
# A two-tower run (task recommend): rows of interactions, whose in-batch negatives grow with the
# micro batch (our choice: 256, a batch of rows costs little next to a token sequence), and
# AdamW's rate for embedding tables and small MLPs; DDP, big tables being split row-wise across
# the ranks by the model itself (trainer.recommend.sharding).
RECOMMEND_DEFAULTS = RunDefaults(micro_batch=256, parallel="ddp", lr=3e-3)
# The two-tower model's width and softmax temperature unless set (trainer.recommend.model's
# DEFAULT_DIM and DEFAULT_TEMPERATURE); another task refuses either set otherwise.
RECOMMEND_EMBEDDING_DIM = 64
RECOMMEND_TEMPERATURE = 0.05
# The sequence length of a --model run without --seq-len, capped at max_position_embeddings.
MODEL_SEQ_LEN = 2048
# Steps of a run given neither max_steps nor epochs.
DEFAULT_MAX_STEPS = 100
# The default warm-up: a tenth of the run, at most WARMUP_CAP steps and at least WARMUP_FLOOR
# (never more than the run). The floor is for short runs: AdamW's first updates are about the
# learning rate in size whatever the gradient, and `small` at its 1e-3 climbed to loss 8.1 (9.1
# over 24 steps), far above the uniform guess ln(256) = 5.5, after the 3-step warm-up (2 steps)
# that a tenth of a 30-step run gave (issue 36). Over 30-step runs of `small` (seeds 0-2), a
# 10-step warm-up still let the loss jump to 5.05 inside it; with 20 the largest jump was to 4.3
# and every loss after it stayed below 2.62. nanoGPT's character-level config warms up for 100
# steps at that learning rate, torchtitan for 200 by default (clamped to the run): fixed counts.
WARMUP_FLOOR = 20
WARMUP_CAP = 100


def preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"preset {name!r} is unknown; known: {', '.join(PRESETS)}") from None


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; the CLI fills it from flags.

    Defaults: ``device="auto"`` (xla on Neuron, else neuron, cuda, cpu: see
    :func:`trainer.device.select`), ``compile="auto"`` (the backend's own choice), micro batch,
    learning rate and parallelism from the preset when left at 0/None,
    ``max_steps`` :data:`DEFAULT_MAX_STEPS` unless ``epochs`` (default 0: none) asks for whole
    epochs of a dataset of examples (the steps then come from the data: each epoch's packed
    rows over the global batch; the two exclude each other),
    warm-up 10% of the run's steps between 20 and 100 (see :meth:`warmup_for`), cosine decay
    to 10% of the peak, AdamW (0.9, 0.95), weight decay (``weight_decay`` None:
    :data:`WEIGHT_DECAY`, with LoRA :data:`LORA_WEIGHT_DECAY`), gradient clipping at 1.0, keep
    the last 3 checkpoints, shards checked by header and size (``verify_data``: also every
    shard's SHA-256), no eval (``eval_every`` 0; when on, the mean loss over every held-out
    example of data of examples, or of ``eval_batches`` (8) held-out batches of a token stream).

    ``model_dir`` (a Hugging Face model directory) replaces the preset: the architecture comes
    from its ``config.json`` (see :func:`trainer.model_spec.model_config`) and the first
    weights from its safetensors; micro batch, learning rate and parallelism then default to
    :data:`MODEL_DEFAULTS`. ``seq_len`` 0 keeps the preset's, or with ``model_dir`` takes
    :data:`MODEL_SEQ_LEN` capped at the model's ``max_position_embeddings``.

    ``lora_rank`` (default None: full fine-tuning) trains LoRA adapters of that rank on the
    ``model_dir`` model's ``lora_targets`` (a comma list; default every linear projection of a
    block: q, k, v, o, gate, up and down) with its weights frozen, scaled by
    ``lora_alpha / lora_rank`` (``lora_alpha`` defaults to the rank), at a peak learning rate
    of :data:`LORA_LR` unless ``lr`` says otherwise; see :mod:`trainer.lora` and
    :func:`trainer.model_spec.lora_spec`.

    ``task``: ``causal-lm`` (default: next-token cross-entropy) or ``classify`` (a score head
    on ``model_dir``'s decoder, data of ``prepare-data --format classify``; see
    :mod:`trainer.classify`), whose cross-entropy ``class_weights`` ``auto`` weighs by inverse
    class frequency (default ``none``), or ``recommend`` (a two-tower retrieval model of
    ``embedding_dim`` (default 64) and softmax ``temperature`` (default 0.05) on data of
    ``prepare-data --format interactions``; see :mod:`trainer.recommend`; micro batch, learning
    rate and parallelism then default to :data:`RECOMMEND_DEFAULTS`; ``shard_embeddings``,
    default ``auto``, splits its tables row-wise across the ranks when they outgrow one rank's
    device memory, ``on`` always with several ranks, ``off`` never). ``best_metric`` (default
    none) names an eval figure
    (``eval_loss``, ``eval_accuracy``, ...): each eval that improves it writes a checkpoint
    that pruning keeps, which ``trn-train export --best`` reads.

    ``activation_checkpointing``: ``on`` recomputes each transformer block's forward in backward
    instead of keeping its activations, ``off`` keeps them, ``auto`` (default) is ``on`` for
    models above :data:`AUTO_CHECKPOINT_PARAMS` parameters (see :meth:`checkpoints_blocks`).
    """

    preset: str = "tiny"
    model_dir: str = ""
    seq_len: int = 0
    data: str = ""
    max_steps: int | None = None
    epochs: int = 0
    device: str = "auto"
    compile: str = "auto"
    seed: int = 0
    micro_batch: int = 0
    grad_accum: int = 1
    lr: float = 0.0
    min_lr_ratio: float = 0.1
    warmup_steps: int = -1
    weight_decay: float | None = None
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    parallel: Parallel | None = None
    checkpoint_dir: str = ""
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    metrics: str = ""
    log_every: int = 10
    instance_type: str = ""  # none given: a Neuron device refuses to guess
    fail_on_recompile: bool = False
    progress: bool | None = None
    peak_flops: float = 0.0
    verify_data: bool = False
    eval_every: int = 0
    eval_batches: int = 8
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_targets: str | None = None
    activation_checkpointing: str = "auto"
    task: str = "causal-lm"
    class_weights: str = "none"
    best_metric: str = ""
    embedding_dim: int = RECOMMEND_EMBEDDING_DIM
    temperature: float = RECOMMEND_TEMPERATURE
    shard_embeddings: str = "auto"

    @property
    def _defaults(self) -> RunDefaults | Preset:
        if self.task == "recommend":
            return RECOMMEND_DEFAULTS
        return MODEL_DEFAULTS if self.model_dir else preset(self.preset)

    @property
    def batch_per_rank(self) -> int:
        return self.micro_batch or self._defaults.micro_batch

    @property
    def peak_lr(self) -> float:
        if self.lr:
            return self.lr
        return LORA_LR if self.lora_rank is not None else self._defaults.lr

    @property
    def decay(self) -> float:
        """AdamW's weight decay on matrices: ``weight_decay``, or the default for the run's
        kind (:data:`WEIGHT_DECAY`; :data:`LORA_WEIGHT_DECAY` with LoRA)."""
        if self.weight_decay is not None:
            return self.weight_decay
        return LORA_WEIGHT_DECAY if self.lora_rank is not None else WEIGHT_DECAY

    @property
    def steps(self) -> int:
        """Steps of a run counted in steps (not ``epochs``): ``max_steps``, or
        :data:`DEFAULT_MAX_STEPS`."""
        return DEFAULT_MAX_STEPS if self.max_steps is None else self.max_steps

    def warmup_for(self, total_steps: int) -> int:
        """Warm-up steps of a run of ``total_steps``: ``warmup_steps``, or when it is negative
        (the default) a tenth of the run between :data:`WARMUP_FLOOR` and :data:`WARMUP_CAP`
        steps, never more than the run."""
        if self.warmup_steps >= 0:
            return self.warmup_steps
        return min(total_steps, max(WARMUP_FLOOR, min(WARMUP_CAP, total_steps // 10)))

    @property
    def warmup(self) -> int:
        """:meth:`warmup_for` the run's :attr:`steps`."""
        return self.warmup_for(self.steps)

    @property
    def parallelism(self) -> Parallel:
        return self.parallel or self._defaults.parallel

    def checkpoints_blocks(self, num_params: int) -> bool:
        """Whether blocks are activation-checkpointed for a model of ``num_params`` parameters:
        ``activation_checkpointing`` on, or auto and above :data:`AUTO_CHECKPOINT_PARAMS`."""
        if self.activation_checkpointing == "auto":
            return num_params > AUTO_CHECKPOINT_PARAMS
        return self.activation_checkpointing == "on"

    def validate_model_fields(self) -> None:
        """Checks the fields that choose the model's shape: ``preset`` and ``seq_len``.

        Raises:
            ValueError: naming the field, its value and what is allowed.
        """
        preset(self.preset)
        if self.seq_len < 0:
            raise ValueError(f"seq_len must be >= 0 (0: the default), got {self.seq_len}")

    def validate(self) -> None:
        """Checks the values that the loop cannot recover from (the model directory and the LoRA
        flags are checked as :func:`trainer.model_spec.resolve` reads them).

        Raises:
            ValueError: naming the field, its value and what is allowed.
        """
        self.validate_model_fields()
        if not self.data:
            raise ValueError("data must name a directory made by `trn-train prepare-data`")
        for name in ("steps", "grad_accum", "log_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                field = "max_steps" if name == "steps" else name
                raise ValueError(f"{field} must be >= 1, got {getattr(self, name)}")
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0 (0: count steps), got {self.epochs}")
        if self.micro_batch < 0:
            raise ValueError(f"micro_batch must be >= 0 (0: the default), got {self.micro_batch}")
        if self.epochs and self.max_steps is not None:
            raise ValueError(
                f"max_steps {self.max_steps} and epochs {self.epochs} exclude each other: "
                "epochs derives the steps from the data (each epoch's rows over the global "
                "batch); give one of them"
            )
        if self.checkpoint_every < 0:
            raise ValueError(
                f"checkpoint_every must be >= 0 (0: only at the end), got {self.checkpoint_every}"
            )
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0 (0: no eval), got {self.eval_every}")
        if self.weight_decay is not None and not 0 <= self.weight_decay < float("inf"):
            raise ValueError(f"weight_decay must be a number >= 0, got {self.weight_decay}")
        if self.eval_batches < 1:
            raise ValueError(f"eval_batches must be >= 1, got {self.eval_batches}")
        if self.activation_checkpointing not in ACTIVATION_CHECKPOINTING:
            raise ValueError(
                f"activation_checkpointing {self.activation_checkpointing!r} is not one of "
                f"{', '.join(ACTIVATION_CHECKPOINTING)}"
            )
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ValueError("checkpoint_every needs checkpoint_dir")
        self._validate_task()

    def _validate_recommend(self) -> None:
        if self.model_dir or self.lora_rank is not None:
            raise ValueError(
                "task recommend trains its own two-tower model: model_dir and lora_rank do not "
                "apply (docs/recommendation.md)"
            )
        if self.parallel == "fsdp":
            raise ValueError(
                "parallel 'fsdp' is not available with task recommend: it trains with ddp, "
                "its embedding tables split row-wise across the ranks"
            )
        if self.embedding_dim < 1:
            raise ValueError(f"embedding_dim must be >= 1, got {self.embedding_dim}")
        if self.batch_per_rank < 2:
            # A row's negatives are the other rows of its micro-batch: with one row the
            # softmax has the positive alone, its loss and gradients are zero.
            raise ValueError(
                f"micro_batch {self.batch_per_rank} leaves a row no in-batch negatives: task "
                "recommend needs at least 2 (default 256)"
            )
        if self.shard_embeddings not in SHARD_EMBEDDINGS:
            raise ValueError(
                f"shard_embeddings {self.shard_embeddings!r} is not one of "
                f"{', '.join(SHARD_EMBEDDINGS)}"
            )
        if not 0 < self.temperature < float("inf"):
            raise ValueError(f"temperature must be a number above 0, got {self.temperature}")

    def _validate_task(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task {self.task!r} is not one of {', '.join(TASKS)}")
        if self.class_weights not in CLASS_WEIGHTS:
            raise ValueError(
                f"class_weights {self.class_weights!r} is not one of {', '.join(CLASS_WEIGHTS)}"
            )
        if self.task == "classify" and not self.model_dir:
            raise ValueError(
                "task classify needs model_dir: the classifier is a Hugging Face model's "
                "decoder with a score head (docs/classification.md)"
            )
        if self.class_weights != "none" and self.task != "classify":
            raise ValueError(f"class_weights {self.class_weights!r} needs task classify")
        if self.shard_embeddings == "on" and self.task != "recommend":
            raise ValueError("shard_embeddings 'on' needs task recommend")
        for name, default in (
            ("embedding_dim", RECOMMEND_EMBEDDING_DIM),
            ("temperature", RECOMMEND_TEMPERATURE),
        ):
            if self.task != "recommend" and getattr(self, name) != default:
                # Only the two-tower model reads them: a set value would go unused.
                raise ValueError(
                    f"{name} {getattr(self, name)} needs task recommend (task {self.task!r} "
                    "has no two-tower model)"
                )
        if self.task == "recommend":
            self._validate_recommend()
        if self.best_metric and not (
            self.best_metric.startswith("eval_") and self.eval_every and self.checkpoint_dir
        ):
            raise ValueError(
                f"best_metric {self.best_metric!r} names an eval record's figure (eval_loss; "
                "classify: eval_accuracy or, multi-label, eval_exact_match, eval_macro_f1, "
                "eval_micro_f1; recommend: "
                "eval_recall@10, eval_ndcg@10, eval_mrr) and needs eval_every and "
                "checkpoint_dir"
            )
