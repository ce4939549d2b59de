"""Classification benchmark (issue 33): ``trn-train run --task classify`` on a Hugging Face Llama
and on a BERT encoder, each against a plain PyTorch loop over transformers' own
``LlamaForSequenceClassification`` / ``BertForSequenceClassification``.

- classifier_vs_transformers_examples_per_s (Llama) and
  bert_classifier_vs_transformers_examples_per_s (a BERT of the Llama's width, depth, heads,
  feed-forward and vocabulary): the trainer (CPU, FP32, eager, one rank; its records'
  ``step_time_s`` after :data:`WARMUP` steps) over a plain loop (``model(input_ids,
  labels=labels)``, backward, gradient clipping, torch's default AdamW, zero_grad) on the same
  config, batch and sequence length, every row a whole :data:`SEQ_LEN` tokens on both sides, in
  the same rounds, which loop goes first alternating; the median of each round's ratio (goal
  >= 1.0). The optimizers are each side's own, as in ``hf_bench.py``.

Usage: python bench/classify_bench.py [--results bench/results.json] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# A benchmark never reaches the hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import hf_bench
import results_file
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForSequenceClassification, BertConfig, BertForMaskedLM

from trainer.classify import data as classify_data

# The fine-tuning bench's round (hf_bench.steady_seconds) and its steps.
WARMUP, MEASURED = hf_bench.WARMUP, hf_bench.MEASURED
BATCH, SEQ_LEN = 8, 256
CLASSES = ("a", "b", "c", "d")
DOCUMENTS = 256
FIGURES = {
    "llama": "classifier_vs_transformers_examples_per_s",
    "bert": "bert_classifier_vs_transformers_examples_per_s",
}
GOALS = dict.fromkeys(FIGURES.values(), 1.0)


def bert_shape(llama: dict[str, Any]) -> dict[str, Any]:
    """A BERT of the Llama ``shape``'s width, depth, heads, feed-forward and vocabulary, its
    positions covering :data:`SEQ_LEN`, padded with token 0, without dropout (the trainer's
    runs have none; BertConfig's default of 0.1 would make transformers' side do more work)."""
    same = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
    )
    return {
        **{k: llama[k] for k in same},
        "max_position_embeddings": max(SEQ_LEN, 512),
        "pad_token_id": 0,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }


def make_model(root: Path, shape: dict[str, Any], arch: str = "llama") -> Path:
    """A random FP32 model of ``shape``: ``hf_bench``'s Llama, or (``arch`` ``bert``) a
    masked-LM BERT (the classifier is drawn on it, as on ``bert-base``); with a word-level
    tokenizer splitting on whitespace whose config names the EOS (the word ``w0``; BERT's the
    pad token, as BERT has no EOS), as ``prepare-data`` wants."""
    if arch == "bert":
        torch.manual_seed(0)
        out = root / f"bert-{shape['hidden_size']}"
        BertForMaskedLM(BertConfig(**shape)).save_pretrained(out)
    else:
        out = hf_bench.make_model(root, shape, dtype=torch.float32, max_shard_bytes=8 << 20)
    words = {f"w{i}": i for i in range(shape["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(words, "w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(out / "tokenizer.json"))
    special = "pad_token" if arch == "bert" else "eos_token"
    config = {"tokenizer_class": "PreTrainedTokenizerFast", special: "w0", "unk_token": "w0"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def make_data(root: Path, model_dir: Path, vocab: int) -> Path:
    """:data:`DOCUMENTS` labelled documents of random words, each longer than a row, prepared
    with ``prepare-data --format classify`` (nothing held out)."""
    rng = random.Random(0)
    lines = [
        {
            "text": " ".join(f"w{rng.randrange(1, vocab)}" for _ in range(SEQ_LEN + 8)),
            "label": CLASSES[i % len(CLASSES)],
        }
        for i in range(DOCUMENTS)
    ]
    source = root / "docs.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = root / "data"
    classify_data.prepare(out, model_dir, source, eval_fraction=0.0, seq_len=SEQ_LEN)
    return out


def trainer_round(model_dir: Path, data_dir: Path, work: Path) -> float:
    """Examples per second of ``trn-train run --task classify``."""
    seconds = hf_bench.steady_seconds(
        model_dir, data_dir, work, task="classify", seq_len=SEQ_LEN, micro_batch=BATCH
    )
    return MEASURED * BATCH / seconds


def transformers_round(model_dir: Path, vocab: int) -> float:
    """Examples per second of a plain loop over transformers' classifier."""
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=len(CLASSES), pad_token_id=0, dtype=torch.float32
    )
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, betas=(0.9, 0.95), weight_decay=0.1)
    batches = [
        (torch.randint(1, vocab, (BATCH, SEQ_LEN)), torch.randint(0, len(CLASSES), (BATCH,)))
        for _ in range(4)
    ]
    began = 0.0
    for step in range(WARMUP + MEASURED):
        if step == WARMUP:
            began = time.perf_counter()
        ids, labels = batches[step % 4]
        model(input_ids=ids, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return MEASURED * BATCH / (time.perf_counter() - began)


def rounds(model_dir: Path, data_dir: Path, work: Path, count: int, vocab: int) -> dict[str, Any]:
    """``count`` rounds of each loop, which goes first alternating: each side's examples/s and
    the median of the rounds' ratios."""
    ours, theirs = [], []
    for round_ in range(count):
        order = ["ours", "transformers"] if round_ % 2 else ["transformers", "ours"]
        for side in order:
            if side == "ours":
                ours.append(trainer_round(model_dir, data_dir, work))
            else:
                theirs.append(transformers_round(model_dir, vocab))
    per_round = [a / b for a, b in zip(ours, theirs, strict=True)]
    return {"ratio": statistics.median(per_round), "ours": ours, "theirs": theirs}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(Path(__file__).with_name("results.json")))
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    shapes = {"llama": hf_bench.LLAMA, "bert": bert_shape(hf_bench.LLAMA)}
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arch, shape in shapes.items():
            work = Path(tmp, arch)
            work.mkdir()
            model_dir = make_model(work, shape, arch)
            data_dir = make_data(work, model_dir, shape["vocab_size"])
            found[arch] = rounds(model_dir, data_dir, work, args.rounds, shape["vocab_size"])
    figures = {FIGURES[arch]: f["ratio"] for arch, f in found.items()}
    section: dict[str, Any] = {
        **figures,
        "goals": GOALS,
        "meets_goals": {k: figures[k] >= GOALS[k] for k in GOALS},
        "details": {
            "trainer_examples_per_s": found["llama"]["ours"],
            "transformers_examples_per_s": found["llama"]["theirs"],
            "bert_trainer_examples_per_s": found["bert"]["ours"],
            "bert_transformers_examples_per_s": found["bert"]["theirs"],
            "rounds": args.rounds,
            "llama": shapes["llama"],
            "bert": shapes["bert"],
            "classes": len(CLASSES),
            "batch": BATCH,
            "seq_len": SEQ_LEN,
            "torch": torch.__version__,
        },
        "command": f"python {Path(__file__).resolve()}",
    }
    results_file.merge(args.results, "classification", section)
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}))
    return 0 if all(section["meets_goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
