"""The `trn-train run` flags that shape a run, through the CLI's own entry and the loop: the
warm-up default, --lr, gradient clipping, --keep-checkpoints and an s3:// checkpoint dir."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch
from moto import mock_aws
from torch.optim.optimizer import register_optimizer_step_pre_hook

from trainer import cli, metrics
from trainer.config import PRESETS, TrainConfig
from trainer.loop import train

CPU = ("--preset", "tiny", "--device", "cpu", "--compile", "none", "--log-every", "1")


def run(corpus: Path, tmp_path: Path, *flags: str) -> list[dict[str, Any]]:
    """`trn-train run` in-process (as the entrypoint's workers run it); its metrics records."""
    out = tmp_path / "m.jsonl"
    assert cli.main(["run", *CPU, "--data", str(corpus), "--metrics", str(out), *flags]) == 0
    return metrics.read(out)


def expected_lr(step: int, *, peak: float, warmup: int, total: int) -> float:
    """The schedule as the config documents it, written out here: linear warm-up to ``peak``
    over ``warmup`` steps (step 0 at peak / warmup), cosine down to a tenth of it at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / (total - warmup)
    return 0.1 * peak + 0.45 * peak * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize(
    ("flags", "peak", "warmup"),
    [
        ((), PRESETS["tiny"].lr, 20),  # default warm-up: the floor, the whole run; preset's peak
        (("--lr", "0.01"), 0.01, 20),
        (("--warmup-steps", "5", "--lr", "0.002"), 0.002, 5),
    ],
    ids=["defaults", "lr", "warmup-steps"],
)
def test_learning_rate_flags_reach_every_step(
    corpus_dir: Path, tmp_path: Path, flags: tuple[str, ...], peak: float, warmup: int
) -> None:
    records = run(corpus_dir, tmp_path, "--max-steps", "20", *flags)

    # A record's lr is the one its step trained at: step s (from 1) is schedule step s - 1.
    got = [r["lr"] for r in records]
    want = [expected_lr(s, peak=peak, warmup=warmup, total=20) for s in range(20)]
    assert [r["step"] for r in records] == list(range(1, 21))
    assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    ("max_steps", "warmup"),
    [(5, 5), (20, 20), (30, 20), (250, 25), (999, 99), (5000, 100)],
)
def test_default_warmup_is_a_tenth_of_the_run_from_20_to_100_steps(
    max_steps: int, warmup: int
) -> None:
    args = cli._parser().parse_args(["run", "--data", "d", "--max-steps", str(max_steps)])
    assert cli.train_config(args).warmup == warmup


def _grad_norm(optimizer: torch.optim.Optimizer) -> float:
    grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
    return float(
        torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    )


def test_the_optimizer_steps_on_gradients_clipped_to_1(corpus_dir: Path, tmp_path: Path) -> None:
    """The logged grad_norm is the norm before clipping; what AdamW steps on is at most 1.0."""
    seen: list[float] = []
    hook = register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: seen.append(_grad_norm(optimizer))
    )
    try:
        train(
            TrainConfig(
                preset="tiny",
                device="cpu",
                compile="none",
                data=str(corpus_dir),
                max_steps=8,
                log_every=1,
                metrics=str(tmp_path / "m.jsonl"),
            )
        )
    finally:
        hook.remove()
    logged = [r["grad_norm"] for r in metrics.read(tmp_path / "m.jsonl")]
    assert len(seen) == len(logged) == 8
    assert max(logged) > 1.0  # the tiny model starts above the threshold: clipping is exercised
    for before, after in zip(logged, seen, strict=True):
        assert after == pytest.approx(min(before, 1.0), rel=1e-4)


def test_keep_checkpoints_keeps_the_newest(corpus_dir: Path, tmp_path: Path) -> None:
    flags = ("--max-steps", "5", "--checkpoint-every", "1", "--keep-checkpoints", "2")
    run(corpus_dir, tmp_path, *flags, "--checkpoint-dir", str(tmp_path / "ck"))

    kept = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert kept == ["step_00000004", "step_00000005"]


def test_keep_checkpoints_below_1_is_refused(corpus_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^keep_checkpoints must be >= 1, got 0$"):
        run(corpus_dir, tmp_path, "--keep-checkpoints", "0", "--debug")


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-2",
    }.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_REGION"):
        monkeypatch.delenv(key, raising=False)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-2")
        client.create_bucket(
            Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "us-east-2"}
        )
        yield client


# A one-process run's checkpoint: meta.json and torch.distributed.checkpoint's files.
CHECKPOINT_FILES = ("meta.json", "shards/.metadata", "shards/__0_0.distcp")


def test_an_s3_checkpoint_dir_saves_prunes_and_resumes(
    corpus_dir: Path, tmp_path: Path, s3: Any
) -> None:
    flags = ("--max-steps", "6", "--checkpoint-dir", "s3://ckpt/runs/r1")
    flags += ("--checkpoint-every", "2", "--keep-checkpoints", "2")
    first = run(corpus_dir, tmp_path / "a", *flags)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="ckpt")["Contents"])
    assert keys == [f"runs/r1/step_0000000{n}/{f}" for n in (4, 6) for f in CHECKPOINT_FILES]
    # A run stopped before its last save (a preemption): only step 4 is left to resume from.
    for name in CHECKPOINT_FILES:
        s3.delete_object(Bucket="ckpt", Key=f"runs/r1/step_00000006/{name}")

    resumed = run(corpus_dir, tmp_path / "b", *flags)

    assert [r["step"] for r in first] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in resumed] == [5, 6]  # from the S3 checkpoint, not from step 0
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="ckpt")["Contents"])
    assert keys == [f"runs/r1/step_0000000{n}/{f}" for n in (4, 6) for f in CHECKPOINT_FILES]
