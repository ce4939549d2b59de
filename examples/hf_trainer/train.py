"""A Hugging Face ``transformers.Trainer`` script, as a team might bring it: a tiny Llama built
from a config in this file (no hub download) trained as a causal LM on a tiny text.

It runs unchanged on CPU, on NVIDIA GPUs and on Trainium (TorchNeuron, the image's stack for
trn2 and trn3); only ``--device`` differs:

    python train.py --device cpu --max-steps 30
    torchrun --nproc-per-node 8 train.py --device cuda
    torchrun train.py --device neuron          # in a trnctl job: rendezvous from the job

The Trainer picks the accelerator itself (accelerate's device detection, which knows CUDA and
TorchNeuron's ``neuron`` device) and DDP under torchrun; ``--device`` says which one you expect,
and the script stops rather than train on another one (or on CPU). Output (checkpoints) goes to
``$TRN_CHECKPOINT_DIR`` when set (the platform sets it to the job's directory on FSx), else
``--output-dir``; a rerun resumes from the newest checkpoint there.

It prints one JSON line per logged step: ``{"step": N, "loss": L}``. On the platform's images,
where a job sets ``TRN_METRICS_FILE``, it also writes the metrics ``trnctl compare`` reads
(``trainer.runlog``); elsewhere that module is absent and nothing changes.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint

try:  # the platform's images: metrics for `trnctl compare` (written where TRN_METRICS_FILE is set)
    from trainer import runlog
except ImportError:  # anywhere else
    runlog = None  # type: ignore[assignment,unused-ignore]

TEXT = (
    "the quick brown fox jumps over the lazy dog. "
    "a journey of a thousand miles begins with a single step. "
    "all that glitters is not gold. "
)
DEVICES = ("cpu", "cuda", "neuron")


class ByteWindows(Dataset[dict[str, torch.Tensor]]):
    """Fixed-length windows of the text's bytes; labels are the inputs (the model shifts them)."""

    def __init__(self, text: str, seq_len: int) -> None:
        data = torch.tensor(list(text.encode()) * 8, dtype=torch.long)
        self.windows = data.unfold(0, seq_len, seq_len // 2)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.windows[index]
        return {"input_ids": window, "labels": window}


def tiny_llama(seq_len: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=seq_len,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


class PrintLoss(TrainerCallback):
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        if state.is_world_process_zero and logs and "loss" in logs:
            print(json.dumps({"step": state.global_step, "loss": logs["loss"]}), flush=True)


class RunMetrics(TrainerCallback):
    """The platform's metrics file (``trainer.runlog``), where there is one: opened when
    training begins (after a resumed checkpoint is loaded), a record per logged loss."""

    def __init__(self, seq_len: int, precision: str) -> None:
        self.seq_len, self.precision = seq_len, precision
        self.log: Any = None

    def tokens_per_step(self, args: Any) -> int:
        sequences = args.per_device_train_batch_size * args.gradient_accumulation_steps
        return int(sequences * args.world_size * self.seq_len)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if runlog is None:
            return
        params = sum(p.numel() for p in kw["model"].parameters())
        self.log = runlog.start(
            model="tiny-llama",
            device=args.device.type,
            precision=self.precision,
            global_batch_tokens=self.tokens_per_step(args),
            seq_len=self.seq_len,
            flops_per_token=6.0 * params,  # forward and backward through every weight, about
            start_tokens=state.global_step * self.tokens_per_step(args),
        )

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        if self.log is not None and logs and "loss" in logs:
            tokens = state.global_step * self.tokens_per_step(args)
            self.log.step(state.global_step, logs["loss"], tokens)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.log is not None:
            self.log.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8, help="Sequences per device.")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path(os.environ.get("TRN_CHECKPOINT_DIR", "hf-output")),
        help="Default: $TRN_CHECKPOINT_DIR, else ./hf-output.",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    found = torch.accelerator.current_accelerator()
    if args.device != "cpu" and (found is None or found.type != args.device):
        have = found.type if found is not None else "none"
        raise SystemExit(f"--device {args.device}, but this machine's accelerator is {have}")
    training = TrainingArguments(
        output_dir=str(args.output_dir),
        use_cpu=args.device == "cpu",
        # bf16 mixed precision on accelerators (autocast on CUDA and TorchNeuron), FP32 on CPU.
        bf16=args.device != "cpu",
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        seed=args.seed,
        logging_steps=args.log_every,
        save_steps=args.save_every,
        save_total_limit=2,
        report_to=[],
        disable_tqdm=True,
        dataloader_drop_last=True,  # every step the same shape: no recompilation on the last one
    )
    if training.device.type != args.device:
        raise SystemExit(f"--device {args.device}, but the Trainer chose {training.device}")
    torch.manual_seed(args.seed)
    trainer = Trainer(
        model=tiny_llama(args.seq_len),
        args=training,
        train_dataset=ByteWindows(TEXT, args.seq_len),
        callbacks=[
            PrintLoss(),
            RunMetrics(args.seq_len, "fp32" if args.device == "cpu" else "bf16 autocast"),
        ],
    )
    resume = None
    if args.output_dir.is_dir():
        resume = get_last_checkpoint(str(args.output_dir))  # type: ignore[no-untyped-call]
    trainer.train(resume_from_checkpoint=resume)


if __name__ == "__main__":
    main()
