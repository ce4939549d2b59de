"""Hugging Face model directories read: safetensors weights into our model
(:func:`load_pretrained`), the files a checkpoint carries, the model's fingerprint, and
``trn-train score``. Their ``config.json`` is :mod:`trainer.hf_config`'s, the names of their
tensors :mod:`trainer.hf_llama`'s; writing them is :mod:`trainer.hf_export`.

Loading (:func:`load_pretrained`) builds the model on the meta device and assigns the tensors
read from the safetensors files (memory-mapped by the library) as FP32 parameters: no random
initialization, and one FP32 copy of the weights in the process that reads, converted on one
intra-op thread (see :func:`_one_intra_op_thread`). A run on several
FSDP2 ranks reads on rank 0 alone and broadcasts into the other ranks' shards (see
:func:`trainer.loop.build_model`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from trainer import hf_llama, tokenizing
from trainer.config import ModelConfig
from trainer.hf_config import CONFIG, model_config
from trainer.model import GPT
from trn_catalog import hf_models

SINGLE = hf_models.WEIGHTS_FILE
INDEX = hf_models.WEIGHTS_INDEX_FILE
# Files of a model directory that a checkpoint carries so that export needs nothing else: the
# config and generation defaults, and the tokenizer's files.
CARRIED = (CONFIG, "generation_config.json", *tokenizing.TOKENIZER_FILES)
# Set, read_weights appends a JSON line (RANK, the files read) to the file it names at each
# read: a debug record of which ranks read the safetensors files (the tests check it).
READ_LOG_ENV = "TRN_WEIGHTS_READ_LOG"
# Tensors some checkpoints carry that are not weights (RoPE tables saved by old versions).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class HFWeightsError(ValueError):
    """The safetensors files do not hold the model ``config.json`` describes; the message names
    the file or tensor."""


class ScoreInputError(ValueError):
    """The token file for ``trn-train score`` is not a list of equal-length lists of token ids."""


def tensor_files(model_dir: str | Path) -> dict[str, Path]:
    """Each tensor name of ``model_dir``'s weights and the safetensors file that holds it:
    from ``model.safetensors.index.json`` when there is one, else ``model.safetensors``.

    Raises:
        HFWeightsError: neither file exists, the index is unreadable or names a missing shard.
    """
    root = Path(model_dir)
    if (root / INDEX).is_file():
        try:
            weight_map = json.loads((root / INDEX).read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise HFWeightsError(f"{root / INDEX}: unreadable weight_map ({e})") from e
        files = {str(name): root / str(file) for name, file in weight_map.items()}
        for path in sorted(set(files.values())):
            if not path.is_file():
                raise HFWeightsError(f"{root / INDEX}: names {path.name}, which is missing")
        return files
    if (root / SINGLE).is_file():
        with safe_open(str(root / SINGLE), framework="pt") as f:
            return dict.fromkeys(f.keys(), root / SINGLE)
    raise HFWeightsError(
        f"{root}: holds neither {SINGLE} nor {INDEX} (only safetensors weights are read; "
        "convert pytorch_model.bin files with transformers' save_pretrained first)"
    )


def read_weights(model_dir: str | Path, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """``model_dir``'s weights under our names, as FP32 CPU tensors (fused where ours are).
    One process reads the files; a later multi-rank loader can call this on one rank per node
    and broadcast or shard the result.

    Raises:
        HFWeightsError: a tensor is missing, unexpected or of the wrong shape (see
            :func:`tensor_files` for the files themselves).
    """
    with torch.device("meta"):
        model = GPT(cfg)
    return _read_weights(model_dir, cfg, _shapes(model))


def _read_weights(
    model_dir: str | Path, cfg: ModelConfig, expected: Mapping[str, tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    """:func:`read_weights` given the shapes of our parameters (``expected``)."""
    files = tensor_files(model_dir)
    wanted = {hf for parts in hf_llama.names(cfg).values() for hf, _ in parts}
    extra = sorted(
        n
        for n in set(files) - wanted
        if not n.endswith(IGNORED_SUFFIXES) and not (cfg.tie_embeddings and n == "lm_head.weight")
    )
    if extra:
        raise HFWeightsError(
            f"{model_dir}: tensors not part of the model config.json describes: "
            f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}"
        )
    missing = sorted(wanted - set(files))
    if missing:
        raise HFWeightsError(
            f"{model_dir}: tensors missing from the safetensors files: "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
        )
    _record_read(sorted(set(files.values())))
    with _opened(sorted(set(files.values()))) as handles, _one_intra_op_thread():

        def read(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            piece: torch.Tensor = handles[files[name]].get_tensor(name)
            if tuple(piece.shape) != shape:
                raise HFWeightsError(
                    f"{files[name]}: tensor {name} has shape {tuple(piece.shape)}, "
                    f"config.json implies {shape}"
                )
            return piece

        return hf_llama.from_hf(cfg, expected, read)


def _record_read(paths: Sequence[Path]) -> None:
    log = os.environ.get(READ_LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            record = {"rank": int(os.environ.get("RANK", "0")), "files": [p.name for p in paths]}
            f.write(json.dumps(record) + "\n")


@contextlib.contextmanager
def _opened(paths: Sequence[Path]) -> Iterator[dict[Path, Any]]:
    with contextlib.ExitStack() as stack:
        yield {p: stack.enter_context(safe_open(str(p), framework="pt")) for p in paths}


def _shapes(model: GPT) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@contextlib.contextmanager
def _one_intra_op_thread() -> Iterator[None]:
    """torch's intra-op threads set to one, then restored. Each tensor's copy into its FP32
    parameter is a short, memory-bound parallel region that ends at a barrier waiting for its
    slowest thread; with other work on the cores every barrier can cost a scheduler time slice.
    On the project's 2-core machine at load 7-8, loading bench/hf_bench.py's ~155M BF16
    parameters took a median 0.21 to 0.30 s on one thread, 1.2 s on two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def load_pretrained(model_dir: str | Path, cfg: ModelConfig) -> GPT:
    """Our model with ``model_dir``'s weights (FP32, CPU): built on the meta device, then the
    tensors of :func:`read_weights` assigned as its parameters and the RoPE tables computed.

    Raises:
        HFWeightsError: see :func:`read_weights`.
    """
    with torch.device("meta"):
        model = GPT(cfg)
    model.load_state_dict(_read_weights(model_dir, cfg, _shapes(model)), assign=True)
    model.tie_weights()
    model.init_rope()
    return model


def carried_files(model_dir: str | Path) -> tuple[Path, ...]:
    """The files of :data:`CARRIED` that ``model_dir`` holds (``config.json`` always)."""
    root = Path(model_dir)
    return tuple(root / name for name in CARRIED if (root / name).is_file())


def fingerprint(model_dir: str | Path) -> str:
    """An identity of ``model_dir``'s model for the resume check, cheap for any size: the SHA-256
    of ``config.json`` and, for each safetensors file, its name, size, header (tensor names,
    dtypes, shapes) and first and last MiB. Two fine-tunes of one base differ in those bytes
    unless their first and last tensors' edges are equal; it is not a full content hash."""
    root = Path(model_dir)
    digest = hashlib.sha256((root / CONFIG).read_bytes())
    for path in sorted(set(tensor_files(root).values())):
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with path.open("rb") as f:
            header = int.from_bytes(f.read(8), "little")
            digest.update(f.read(min(header, size)))
            digest.update(f.read(1 << 20))
            f.seek(max(0, size - (1 << 20)))
            digest.update(f.read())
    return digest.hexdigest()


def read_token_file(path: str | Path) -> torch.Tensor:
    """The sequences of a JSON file holding a list of equal-length lists of token ids (at least
    two tokens each), as an int64 ``(sequences, length)`` tensor.

    Raises:
        ScoreInputError: the file is unreadable or not of that form; the message says where.
    """
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ScoreInputError(f"{path}: unreadable token file ({e})") from e
    if not isinstance(rows, list) or not rows:
        raise ScoreInputError(f"{path}: must hold a non-empty JSON list of lists of token ids")
    length = len(rows[0]) if isinstance(rows[0], list) else -1
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != length:
            raise ScoreInputError(
                f"{path}: sequence {i} must be a list of {length} token ids like sequence 0"
            )
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in row):
            raise ScoreInputError(f"{path}: sequence {i} holds a value that is not a token id >= 0")
    if length < 2:
        raise ScoreInputError(f"{path}: sequences need at least 2 tokens, got {length}")
    return torch.tensor(rows, dtype=torch.int64)


def score(
    model_dir: str | Path,
    tokens_file: str | Path,
    *,
    batch: int = 8,
    adapt: Callable[[GPT, ModelConfig], GPT] | None = None,
) -> tuple[float, int]:
    """The mean next-token cross-entropy (FP32, CPU) of ``model_dir``'s model over the sequences
    in ``tokens_file`` (see :func:`read_token_file`), and the number of tokens it averages:
    every position but each sequence's first is predicted from those before it, so a file of
    S sequences of L tokens counts S * (L - 1). This is the loss transformers' causal LMs return
    with ``labels=input_ids``. Sequences go through ``batch`` (default 8) at a time. ``adapt``
    (default none) changes the loaded model before it scores, e.g. adds a LoRA adapter
    (:meth:`trainer.lora.PeftAdapter.apply_to`).

    Raises:
        ScoreInputError: the token file is malformed or holds an id outside the vocabulary.
        trainer.hf_config.HFConfigError: the model is unsupported, or its sequences are longer than
            ``max_position_embeddings`` + 1.
        HFWeightsError: see :func:`read_weights`.
    """
    tokens = read_token_file(tokens_file)
    cfg = model_config(model_dir, seq_len=tokens.shape[1] - 1)
    if int(tokens.max()) >= cfg.vocab_size:
        raise ScoreInputError(
            f"{tokens_file}: token id {int(tokens.max())} is outside the model's vocabulary "
            f"(vocab_size {cfg.vocab_size})"
        )
    model = load_pretrained(model_dir, cfg)
    model = (model if adapt is None else adapt(model, cfg)).eval()
    total = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for chunk in torch.split(tokens, batch):
            loss = model(chunk[:, :-1], chunk[:, 1:])
            total += loss.double() * chunk[:, 1:].numel()
    count = tokens[:, 1:].numel()
    return float(total / count), count
