"""A plain PyTorch training script, as a team might bring it: a small causal transformer trained
on a tiny text, data parallel (DDP) under torchrun, with checkpoints and resume.

It runs unchanged on CPU, on NVIDIA GPUs and on Trainium (TorchNeuron, the image's stack for
trn2 and trn3); only ``--device`` differs:

    python train.py --device cpu --steps 30
    torchrun --nproc-per-node 8 train.py --device cuda
    torchrun train.py --device neuron          # in a trnctl job: rendezvous from the job

Checkpoints go to ``$TRN_CHECKPOINT_DIR`` (the platform sets it to the job's directory on FSx)
or ``--checkpoint-dir``; a rerun resumes from the newest one. On SIGTERM (preemption, the end of
a Capacity Block) every rank stops after its current step and rank 0 saves a checkpoint.

It prints one JSON line per logged step: ``{"step": N, "loss": L, "tokens": T}``. On the
platform's images, where a job sets ``TRN_METRICS_FILE``, it also writes the metrics ``trnctl
compare`` reads (``trainer.runlog``); elsewhere that module is absent and nothing changes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

try:  # the platform's images: metrics for `trnctl compare` (written where TRN_METRICS_FILE is set)
    from trainer import runlog
except ImportError:  # anywhere else
    runlog = None  # type: ignore[assignment,unused-ignore]

TEXT = (
    "the quick brown fox jumps over the lazy dog. "
    "a journey of a thousand miles begins with a single step. "
    "all that glitters is not gold. "
)
# Process group backend per device type: gloo on CPU, NCCL on NVIDIA GPUs, TorchNeuron's own.
DIST_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "neuron": "neuron"}


class TinyLM(nn.Module):
    """Byte embeddings, a few pre-norm transformer layers with a causal mask, a byte head."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))
        layer = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.blocks(x, mask=self.mask, is_causal=True))  # type: ignore[no-any-return]


def batches(
    data: torch.Tensor, batch: int, seq_len: int, rank: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Random windows of ``data`` (inputs, next-byte targets), a different stream per rank."""
    generator = torch.Generator().manual_seed(seed + rank)
    while True:
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=generator)
        window = torch.stack([data[s : s + seq_len + 1] for s in starts])
        yield window[:, :-1], window[:, 1:]


def device_of(name: str, local_rank: int) -> torch.device:
    """This rank's device: ``cpu``, or ``cuda``/``neuron``: index 0 where the process sees one
    device (TorchNeuron pinning a rank to its core, as the platform's notes have it; untried on
    a device here), else its local rank."""
    if name == "cpu":
        return torch.device("cpu")
    found = torch.accelerator.current_accelerator()
    if found is None or found.type != name:
        have = found.type if found is not None else "none"
        raise SystemExit(f"--device {name}, but this machine's accelerator is {have}")
    count = torch.accelerator.device_count()
    index = 0 if count == 1 else local_rank
    if index >= count:
        raise SystemExit(f"local rank {local_rank} but this process sees {count} {name} devices")
    torch.accelerator.set_device_index(index)
    return torch.device(name, index)


def newest_checkpoint(directory: Path | None) -> Path | None:
    if directory is None:
        return None
    found = sorted(directory.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    return found[-1] if found else None


def save(directory: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Writes ``step-N.pt`` through a temporary name, so a half-written file is never newest."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    partial = directory / f".step-{step}.pt.partial"
    torch.save(state, partial)
    partial.rename(directory / f"step-{step}.pt")


def agreed_stop(stopping: bool, control: dist.ProcessGroup | None) -> bool:
    """Whether any rank got a SIGTERM: a MAX all-reduce of the flag in ``control``, a CPU
    (gloo) group; the flag itself with one rank."""
    if control is None:
        return stopping
    flag = torch.tensor([int(stopping)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=control)
    return bool(flag.item())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=sorted(DIST_BACKENDS), default="cpu")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8, help="Sequences per rank per step.")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="0: only at the end.")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=Path(os.environ["TRN_CHECKPOINT_DIR"])
        if "TRN_CHECKPOINT_DIR" in os.environ
        else None,
        help="Default: $TRN_CHECKPOINT_DIR; none: no checkpoints.",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1:
        dist.init_process_group(DIST_BACKENDS[args.device])
    # The ranks agree on a stop over the CPU (gloo), so the agreement never waits for the
    # accelerator: a flag on the device read with .item() would sync host and device every step.
    control = dist.new_group(backend="gloo") if world > 1 else None
    device = device_of(args.device, local_rank)
    torch.manual_seed(args.seed)
    model: nn.Module = TinyLM(256, args.dim, args.layers, 4, args.seq_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    start = 0
    newest = newest_checkpoint(args.checkpoint_dir)
    if newest is not None:
        state = torch.load(newest, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    if world > 1:
        model = DistributedDataParallel(model)
    data = torch.tensor(list(TEXT.encode()) * 8, dtype=torch.long)
    stream = batches(data, args.batch_size, args.seq_len, rank, args.seed + start)
    # bf16 autocast on accelerators (TorchNeuron follows CUDA's autocast conventions), FP32 on CPU.
    precision = (
        torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        if device.type != "cpu"
        else contextlib.nullcontext()
    )
    tokens_per_step = world * args.batch_size * args.seq_len
    params = sum(p.numel() for p in model.parameters())
    metrics = (
        runlog.start(
            model="tiny-lm",
            device=device.type,
            precision="fp32" if device.type == "cpu" else "bf16 autocast",
            global_batch_tokens=tokens_per_step,
            seq_len=args.seq_len,
            flops_per_token=6.0 * params,  # forward and backward through every weight, about
            start_tokens=start * tokens_per_step,
        )
        if runlog is not None
        else None
    )
    step = start
    for step in range(start + 1, args.steps + 1):
        inputs, targets = (t.to(device) for t in next(stream))
        with precision:
            logits = model(inputs)
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if step % args.log_every == 0 or step == args.steps:
            loss_value = loss.detach()
            if world > 1:
                dist.all_reduce(loss_value)
                loss_value /= world
            tokens = step * tokens_per_step
            if rank == 0:
                print(json.dumps({"step": step, "loss": loss_value.item(), "tokens": tokens}))
            if metrics is not None:
                metrics.step(step, loss_value.item(), tokens)
        # Every rank stops at the same step: a rank that went on alone would wait in its next
        # all-reduce until the grace period ends.
        stop_now = agreed_stop(stopping, control)
        every = args.checkpoint_every
        due = stop_now or step == args.steps or (every and step % every == 0)
        if due and rank == 0 and args.checkpoint_dir is not None:
            inner = model.module if isinstance(model, DistributedDataParallel) else model
            save(args.checkpoint_dir, step, inner, optimizer)
        if stop_now:
            break
    if metrics is not None:
        metrics.close()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
