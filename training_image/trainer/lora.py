"""LoRA for runs from a Hugging Face model directory: frozen base weights, trained low-rank
adapters, their names in PEFT's layout (written by :func:`trainer.hf_export.save_adapter`, read
back by :func:`read_adapter`) or merged into the weights.

Our attention has one fused ``qkv`` projection and our MLP one fused ``up`` ([gate; up]); each
Hugging Face module named in the targets (``q_proj`` ... ``down_proj``) gets its own adapter
pair over its rows of the fused weight, so that the adapters are exactly the ones PEFT would
train on the transformers model. The modules and their rows come from
:func:`trainer.hf_llama.names`, the one name mapping.

As PEFT 0.21.2's ``LoraLayer`` (``peft/tuners/lora/layer.py``): ``lora_A`` (rank x in) is
initialised kaiming-uniform with ``a = sqrt(5)``, ``lora_B`` (out x rank) zero, so that step 0
is the base model; the update is ``scaling * B @ A`` with ``scaling = alpha / rank``; no dropout
and no adapter bias.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from trainer import hf_config, hf_llama
from trainer.config import ModelConfig
from trainer.model import GPT

# The Hugging Face module names an adapter may target: every linear projection of a block.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Targeted without --lora-targets: all of them, as PEFT's target_modules="all-linear" does for
# these models and TRL's "LoRA Without Regret" guide recommends (docs/source/
# lora_without_regret.md at v1.9.0: attention-only LoRA underperforms even at a higher rank).
DEFAULT_TARGETS = TARGETS
# PEFT's file names and the prefix of its saved adapter tensors (peft/utils/constants.py,
# peft/utils/save_and_load.py at 0.21.2).
ADAPTER_CONFIG = hf_config.ADAPTER_CONFIG
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoraSpec:
    """Rank, alpha and target modules of a LoRA run; ``alpha`` defaults to ``rank`` (scaling
    1, as PEFT's defaults r=8, lora_alpha=8)."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = DEFAULT_TARGETS

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def as_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LoraSpec:
        return cls(int(raw["rank"]), float(raw["alpha"]), tuple(raw["targets"]))


def spec(
    rank: int | None, alpha: float | None, targets: str | None, model_dir: str
) -> LoraSpec | None:
    """The :class:`LoraSpec` of the run flags, or None without ``--lora-rank``.

    Raises:
        ValueError: a flag is out of range (rank below 1, alpha not a finite number above 0,
            a target not in :data:`TARGETS` or named twice), ``--lora-alpha`` or
            ``--lora-targets`` without ``--lora-rank``, or LoRA without ``--model``.
    """
    if rank is None:
        for flag, value in (("--lora-alpha", alpha), ("--lora-targets", targets)):
            if value is not None:
                raise ValueError(f"{flag} {value} needs --lora-rank")
        return None
    if not model_dir:
        raise ValueError(
            f"--lora-rank {rank} needs --model: LoRA fine-tunes a Hugging Face model directory"
        )
    if rank < 1:
        raise ValueError(f"--lora-rank must be >= 1, got {rank}")
    if alpha is not None and not 0 < alpha < math.inf:
        raise ValueError(f"--lora-alpha must be a number above 0, got {alpha}")
    return LoraSpec(rank, float(rank) if alpha is None else alpha, parse_targets(targets))


def parse_targets(text: str | None) -> tuple[str, ...]:
    """The modules of a comma list (None: :data:`DEFAULT_TARGETS`), in :data:`TARGETS` order.

    Raises:
        ValueError: an empty list, an unknown name or one named twice.
    """
    if text is None:
        return DEFAULT_TARGETS
    names = [n.strip() for n in text.split(",")]
    allowed = f"allowed: a comma list of {', '.join(TARGETS)}"
    for name in names:
        if name not in TARGETS:
            raise ValueError(f"--lora-targets {text!r}: {name!r} is not a target module; {allowed}")
        if names.count(name) > 1:
            raise ValueError(f"--lora-targets {text!r}: {name!r} is named twice; {allowed}")
    return tuple(t for t in TARGETS if t in names)


class LoraLinear(nn.Module):
    """A frozen linear layer (the fused one's ``weight`` and ``bias``, under the same names)
    plus adapters ``lora_A.<target>`` and ``lora_B.<target>`` for each targeted part of its
    rows. ``parts``: every part's Hugging Face module name and rows, in row order."""

    def __init__(self, base: nn.Linear, parts: Sequence[tuple[str, int]], lora: LoraSpec) -> None:
        super().__init__()
        self.weight = base.weight
        self.bias = base.bias
        self.scaling = lora.scaling
        self.parts = tuple((name, rows, name in lora.targets) for name, rows in parts)
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        for name, rows, targeted in self.parts:
            if targeted:
                a = torch.empty(lora.rank, base.in_features, device=base.weight.device)
                nn.init.kaiming_uniform_(a, a=math.sqrt(5))
                self.lora_A[name] = nn.Parameter(a)
                self.lora_B[name] = nn.Parameter(
                    torch.zeros(rows, lora.rank, device=base.weight.device)
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        pieces = torch.split(out, [rows for _, rows, _ in self.parts], dim=-1)
        updated = [
            piece + self.scaling * F.linear(F.linear(x, self.lora_A[name]), self.lora_B[name])
            if targeted
            else piece
            for piece, (name, _, targeted) in zip(pieces, self.parts, strict=True)
        ]
        return updated[0] if len(updated) == 1 else torch.cat(updated, dim=-1)


# Where a model's adapters go: each of our linear layers that holds a possible target (its path
# in our model) and its parts, in row order, as (Hugging Face module path, target name, rows).
Layout = Mapping[str, tuple[tuple[str, str, int], ...]]


def _layout(on: ModelConfig | Layout) -> Layout:
    """The :data:`Layout` of the decoder of a :class:`ModelConfig` (:func:`_modules`), or
    ``on`` itself."""
    return _modules(on) if isinstance(on, ModelConfig) else on


def _modules(cfg: ModelConfig) -> dict[str, tuple[tuple[str, str, int], ...]]:
    """The decoder's :data:`Layout`, from :func:`trainer.hf_llama.names`."""
    modules = {}
    for ours, parts in hf_llama.names(cfg).items():
        paths = [hf_name.removesuffix(".weight") for hf_name, _ in parts]
        if ours.endswith(".weight") and all(p.rsplit(".", 1)[-1] in TARGETS for p in paths):
            modules[ours.removesuffix(".weight")] = tuple(
                (path, path.rsplit(".", 1)[-1], rows)
                for path, (_, rows) in zip(paths, parts, strict=True)
            )
    return modules


def cast_frozen(model: nn.Module, dtype: torch.dtype) -> int:
    """Casts the frozen weights of ``model``'s linear layers (a :class:`LoraLinear`'s base, a
    frozen ``nn.Linear`` such as an untied output head) to ``dtype`` in place and returns how
    many it cast. The embedding table (also a tied head), norms and biases stay as they are,
    so the residual stream keeps its precision; trained parameters are never cast. On
    accelerators autocast runs the products in ``dtype`` anyway, so this halves the memory of
    a frozen BF16 base at no cost in what the products compute."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    cast = 0
    for module in model.modules():
        if not isinstance(module, nn.Linear | LoraLinear):
            continue
        weight = module.weight
        if weight.requires_grad or id(weight) in embeddings or weight.dtype == dtype:
            continue
        weight.data = weight.data.to(dtype)
        cast += 1
    return cast


def apply(model: nn.Module, on: ModelConfig | Layout, lora: LoraSpec) -> nn.Module:
    """Freezes every parameter of ``model`` (the decoder of the config ``on``, or a model whose
    linear layers the :data:`Layout` ``on`` names: BERT's,
    :func:`trainer.classify.encoder.lora_layout`) and replaces each linear layer holding a
    target of ``lora`` by a :class:`LoraLinear` (adapters drawn from torch's global generator).
    Returns ``model``."""
    for p in model.parameters():
        p.requires_grad_(False)
    for path, parts in _layout(on).items():
        if not any(target in lora.targets for _, target, _ in parts):
            continue
        parent_path, _, attr = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        base = getattr(parent, attr)
        setattr(parent, attr, LoraLinear(base, [(t, rows) for _, t, rows in parts], lora))
    return model


def peft_names(on: ModelConfig | Layout, lora: LoraSpec) -> dict[str, str]:
    """Our adapter tensors' names to the names PEFT saves them under
    (``base_model.model.<module>.lora_A.weight``), on the model of ``on`` (see :func:`apply`)."""
    names = {}
    for path, parts in _layout(on).items():
        for hf_path, target, _ in parts:
            if target in lora.targets:
                for kind in ("lora_A", "lora_B"):
                    names[f"{path}.{kind}.{target}"] = f"{PEFT_PREFIX}{hf_path}.{kind}.weight"
    return names


def merged(
    state: Mapping[str, torch.Tensor], on: ModelConfig | Layout, lora: LoraSpec
) -> dict[str, torch.Tensor]:
    """``state`` with each adapter merged into its rows of the fused weight
    (``W + scaling * B @ A``, in FP32) and the adapter tensors left out, on the model of ``on``
    (see :func:`apply`)."""
    out = {k: v for k, v in state.items() if ".lora_" not in k}
    for path, parts in _layout(on).items():
        if not any(target in lora.targets for _, target, _ in parts):
            continue
        pieces = list(torch.split(out[f"{path}.weight"].float(), [rows for _, _, rows in parts]))
        for i, (_, target, _) in enumerate(parts):
            if target in lora.targets:
                a, b = state[f"{path}.lora_A.{target}"], state[f"{path}.lora_B.{target}"]
                pieces[i] = pieces[i] + lora.scaling * (b.float() @ a.float())
        out[f"{path}.weight"] = torch.cat(pieces)
    return out


# adapter_config.json fields whose PEFT defaults are the only values this trainer implements
# (LoraConfig at 0.21.2); an adapter with another value would compute something else here.
_PEFT_FIXED: Mapping[str, object] = {
    "bias": "none",
    "use_rslora": False,
    "use_dora": False,
    "fan_in_fan_out": False,
    "modules_to_save": None,
    "layers_to_transform": None,
}


@dataclass(frozen=True)
class PeftAdapter:
    """A PEFT LoRA adapter directory read back: its :class:`LoraSpec`, its tensors under PEFT's
    names and its ``base_model_name_or_path``."""

    spec: LoraSpec
    tensors: Mapping[str, torch.Tensor]
    base_model: str

    def apply_to(self, model: GPT, cfg: ModelConfig) -> GPT:
        """``model`` (of ``cfg``) with this adapter's layers and weights (see :func:`apply`).

        Raises:
            ValueError: the adapter's tensors are not those of ``cfg``'s model.
        """
        apply(model, cfg, self.spec)
        names = peft_names(cfg, self.spec)
        if set(names.values()) != set(self.tensors):
            raise ValueError(
                f"the adapter's tensors do not fit the base model: it has {len(self.tensors)}, "
                f"a rank-{self.spec.rank} adapter on {', '.join(self.spec.targets)} of this "
                f"model has {len(names)}"
            )
        state = {ours: self.tensors[theirs] for ours, theirs in names.items()}
        model.load_state_dict(state, strict=False, assign=False)
        return model


def read_adapter(directory: str | Path) -> PeftAdapter:
    """The PEFT LoRA adapter in ``directory`` (``adapter_config.json`` and
    ``adapter_model.safetensors``, as :func:`trainer.hf_export.save_adapter` or PEFT writes
    them).

    Raises:
        ValueError: a file is missing or unreadable, or the adapter is not a plain LoRA adapter
            on the modules of :data:`TARGETS` (the message names the field).
    """
    root = Path(directory)
    try:
        config = json.loads((root / ADAPTER_CONFIG).read_text())
        tensors = load_file(str(root / ADAPTER_WEIGHTS))
    except (OSError, ValueError) as error:
        raise ValueError(f"{root}: not a readable PEFT adapter ({error})") from error
    where = root / ADAPTER_CONFIG
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{where}: peft_type {config.get('peft_type')!r}; allowed: 'LORA'")
    for field, value in _PEFT_FIXED.items():
        if config.get(field, value) not in (value, [], {}):
            raise ValueError(
                f"{where}: {field} {config[field]!r} is not supported; allowed: {value!r}"
            )
    targets = (
        TARGETS if config.get("target_modules") == "all-linear" else config.get("target_modules")
    )
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(targets, list | tuple) or not targets or not set(targets) <= set(TARGETS):
        raise ValueError(
            f"{where}: target_modules {targets!r} is not supported; allowed: 'all-linear' or a "
            f"list of {', '.join(TARGETS)}"
        )
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{where}: r {rank!r} must be an integer >= 1")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < math.inf:
        raise ValueError(f"{where}: lora_alpha {alpha!r} must be a number above 0")
    spec = LoraSpec(rank, float(alpha), tuple(t for t in TARGETS if t in targets))
    return PeftAdapter(spec, tensors, str(config.get("base_model_name_or_path") or ""))
