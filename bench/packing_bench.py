"""Packed rows against the token stream (issue 30): merges bench/results.json["packing"].

- packed_useful_vs_stream_tokens_per_s: ``trn-train run --model`` on conversations of varied
  lengths prepared as whole examples (format 3: each row packs whole conversations, the rest of
  it padding), counting only the example (non-padding) tokens per second, over the same run on
  the same tokens prepared as today's stream of windows (format 2), counting every token. The
  fine-tuning benchmark's Llama (bench/hf_bench.py), batch and sequence length, CPU, FP32,
  eager; the two runs alternate in each round (which goes first alternates too) and the figure
  is the median of the rounds' ratios (goal >= 0.9, asserted: the script exits 1 below it).
- fill: example tokens over row positions of the packed epoch, the share packing does not
  waste on padding.
- paired (no goal of its own): a training step (model and optimizer) on a packed batch and one
  on a stream batch in turn in one process, which goes first alternating; the median of the
  pairs' ratios of useful tokens/s, with quartiles. The rounds above run each for seconds at
  different moments of a shared machine; the two steps of a pair see nearly the same machine,
  so this says what the rows cost per step (their mask, their positions) beside their padding.

Usage: python bench/packing_bench.py [--results bench/results.json] [--rounds 5] [--pairs 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import hf_bench
import numpy as np
import results_file
import torch

from trainer import data, hf, hf_config, optim, packing
from trainer.config import TrainConfig

WARMUP, MEASURED = hf_bench.WARMUP, hf_bench.MEASURED
GOALS = {"packed_useful_vs_stream_tokens_per_s": 0.9}


def conversations(count: int, vocab: int, seed: int = 0) -> list[data.Example]:
    """``count`` conversations of one to three turns, each a prompt of 4 to 63 tokens (mask 0)
    and a reply of 4 to 95 (mask 1): 8 to 474 tokens, random ids below ``vocab``."""
    rng = np.random.default_rng(seed)
    out: list[data.Example] = []
    for _ in range(count):
        parts = []
        for _turn in range(int(rng.integers(1, 4))):
            parts += [
                np.zeros(rng.integers(4, 64), np.uint8),
                np.ones(rng.integers(4, 96), np.uint8),
            ]
        mask = np.concatenate(parts)
        out.append((rng.integers(1, vocab, mask.size), mask))
    return out


def write_both(
    work: Path, examples: list[data.Example], vocab: int, model_dir: Path
) -> tuple[Path, Path]:
    """The conversations as whole examples (format 3) and as one stream (format 2), both
    recorded as tokenized with ``model_dir``'s tokenizer (``--model`` runs refuse other data)."""
    packed, stream = work / "packed", work / "stream"
    identity = hf_bench.identity_of(model_dir)
    data.write_examples_dataset(packed, examples, [], vocab_size=vocab, identity=identity)
    data.write_split_dataset(stream, examples, vocab_size=vocab, identity=identity, eval_fraction=0)
    return packed, stream


def useful_tokens(data_dir: Path, steps: range) -> int:
    """Example tokens of ``steps`` of the run :func:`run_round` makes of ``data_dir``: every
    position for a stream, the non-padding ones for packed rows."""
    dataset = data.open_dataset(data_dir)
    if dataset.index is None:
        return len(steps) * hf_bench.BATCH * hf_bench.SEQ_LEN
    rows = packing.PackedSampler(
        dataset, seq_len=hf_bench.SEQ_LEN, micro_batch=hf_bench.BATCH, seed=TrainConfig.seed
    )
    return sum(rows.tokens(step) for step in steps)


def run_round(model_dir: Path, data_dir: Path, work: Path) -> float:
    """Steady-state useful tokens/s of the trainer on ``data_dir`` (records after warm-up)."""
    seconds = hf_bench.steady_seconds(model_dir, data_dir, work)
    return float(useful_tokens(data_dir, range(WARMUP, WARMUP + MEASURED)) / seconds)


def fill(data_dir: Path) -> float:
    """Example tokens over row positions of epoch 0 of the packed data."""
    rows = packing.PackedSampler(
        data.open_dataset(data_dir),
        seq_len=hf_bench.SEQ_LEN,
        micro_batch=hf_bench.BATCH,
        seed=TrainConfig.seed,
    )
    epoch = rows.rows(0)
    return float(epoch.tokens.sum() / (epoch.count * hf_bench.SEQ_LEN))


def paired_steps(model_dir: Path, packed: Path, stream: Path, pairs: int) -> dict[str, Any]:
    """A step of the trainer's model and optimizer on a packed batch and one on a stream batch,
    in turn, ``pairs`` times after :data:`WARMUP` pairs: the median of the pairs' ratios of
    useful tokens/s (``ratio``), its quartiles and each side's seconds per step."""
    model = hf.load_pretrained(
        model_dir, hf_config.model_config(model_dir, seq_len=hf_bench.SEQ_LEN)
    )
    model.train()
    opt = optim.build(model, lr=2e-5, weight_decay=0.1, betas=(0.9, 0.95))
    seq_len, micro_batch = hf_bench.SEQ_LEN, hf_bench.BATCH
    rows = packing.PackedSampler(
        data.open_dataset(packed), seq_len=seq_len, micro_batch=micro_batch, seed=0
    )
    windows = data.WindowSampler(
        data.open_dataset(stream), seq_len=seq_len, micro_batch=micro_batch, seed=0
    )
    batches: dict[str, list[tuple[torch.Tensor, ...]]] = {
        "packed": [rows.batch(s) for s in range(4)],
        "stream": [windows.batch(s) for s in range(4)],
    }
    tokens = {
        "packed": [rows.tokens(s) for s in range(4)],
        "stream": [hf_bench.BATCH * hf_bench.SEQ_LEN] * 4,
    }
    seconds: dict[str, list[float]] = {"packed": [], "stream": []}
    rates: dict[str, list[float]] = {"packed": [], "stream": []}
    for pair in range(WARMUP + pairs):
        for name in sorted(batches, reverse=pair % 2 == 1):
            began = time.perf_counter()
            model(*batches[name][pair % 4]).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if pair >= WARMUP:
                seconds[name].append(time.perf_counter() - began)
                rates[name].append(tokens[name][pair % 4] / seconds[name][-1])
    ratios = [p / s for p, s in zip(rates["packed"], rates["stream"], strict=True)]
    low, median, high = statistics.quantiles(ratios, n=4, method="inclusive")
    return {"ratio": median, "quartiles": [low, high], "seconds": seconds}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(Path(__file__).with_name("results.json")))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pairs", type=int, default=20)
    args = p.parse_args()
    if args.pairs < 2:
        p.error(f"--pairs: {args.pairs}; a median and quartiles need at least 2 pairs")
    vocab = hf_bench.LLAMA["vocab_size"]
    with tempfile.TemporaryDirectory(prefix="packing-bench-") as tmp:
        work = Path(tmp)
        model_dir = hf_bench.make_model(
            work, hf_bench.LLAMA, dtype=torch.float32, max_shard_bytes=8 << 20
        )
        examples = conversations(2000, vocab)
        packed, stream = write_both(work, examples, vocab, model_dir)
        rates: dict[str, list[float]] = {"packed": [], "stream": []}
        for round_ in range(args.rounds):
            for name in sorted(rates, reverse=round_ % 2 == 1):
                rates[name].append(
                    run_round(model_dir, packed if name == "packed" else stream, work)
                )
        packed_fill = fill(packed)
        paired = paired_steps(model_dir, packed, stream, args.pairs)
    per_round = [a / b for a, b in zip(rates["packed"], rates["stream"], strict=True)]
    figures = {"packed_useful_vs_stream_tokens_per_s": statistics.median(per_round)}
    section: dict[str, Any] = {
        **figures,
        "fill": packed_fill,
        "goals": GOALS,
        "meets_goals": {k: figures[k] >= GOALS[k] for k in GOALS},
        "details": {
            "packed_useful_tokens_per_s": rates["packed"],
            "stream_tokens_per_s": rates["stream"],
            "per_round": per_round,
            "paired": paired,
            "rounds": args.rounds,
            "pairs": args.pairs,
            "conversations": len(examples),
            "conversation_tokens": int(sum(tokens.size for tokens, _ in examples)),
            "llama": hf_bench.LLAMA,
            "batch": hf_bench.BATCH,
            "seq_len": hf_bench.SEQ_LEN,
            "open_rows": packing.OPEN_ROWS,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "load_average_1m": os.getloadavg()[0],
        },
        "command": f"python {Path(__file__).resolve()}",
    }
    results_file.merge(args.results, "packing", section)
    print(
        json.dumps({**{k: round(v, 4) for k, v in figures.items()}, "fill": round(packed_fill, 4)})
    )
    return 0 if all(section["meets_goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
