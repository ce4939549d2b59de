"""Rows of whole examples: no example crosses a row, positions restart, attention stays inside an
example, the cutting rule, epochs as a function of (seed, epoch), an exact mid-epoch resume, and
the step's loss over its trained targets with padding left out."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tolerance import assert_fp32_close
from trainer import data, metrics, packing
from trainer.checkpoint import Checkpointer, LocalStore
from trainer.config import ModelConfig, TrainConfig
from trainer.loop import train
from trainer.model import GPT
from trainer.model_spec import model_config

IDENTITY = {"tokenizer": "test", "tokenizer_sha256": "0" * 64, "eos_token_id": 0}
LENGTHS = [3, 17, 40, 9, 64, 5, 30, 22, 11, 70, 2, 48, 13, 26, 7, 35, 19, 44, 6, 28]


def _write(root: Path, examples: list[data.Example], **kwargs: object) -> Path:
    data.write_examples_dataset(
        root,
        examples,
        [],
        vocab_size=256,
        identity=IDENTITY,
        **kwargs,  # type: ignore[arg-type]
    )
    return root


def _numbered(root: Path, lengths: list[int] = LENGTHS, **kwargs: object) -> Path:
    """Example ``i`` is ``lengths[i]`` tokens of id ``i + 1``, so a row shows what it holds."""
    return _write(root, [(np.full(n, i + 1), None) for i, n in enumerate(lengths)], **kwargs)


def _segments(x: torch.Tensor, positions: torch.Tensor) -> list[tuple[int, int]]:
    """(first token, length) of each stretch of a row whose positions count up from 0."""
    starts = [*torch.nonzero(positions == 0).flatten().tolist(), positions.numel()]
    return [(int(x[a]), b - a) for a, b in itertools.pairwise(starts)]


def test_rows_hold_whole_examples_whose_positions_restart(tmp_path: Path) -> None:
    """Each example sits whole in one row (cut at 32 by the rule for documents), its positions
    count from 0, its targets are its own next tokens and never the next example's, and
    padding (token 0, after the examples) has positions of its own and is never a target."""
    dataset = data.open_dataset(_numbered(tmp_path, shard_tokens=100))
    assert len(dataset.shards) > 1  # examples never split across shards
    sampler = packing.PackedSampler(dataset, seq_len=32, micro_batch=4, seed=1)
    seen: list[int] = []
    for step in range(sampler.steps_in(0)):
        x, y, positions = sampler.batch(step)
        assert x.shape == y.shape == positions.shape == (4, 32)
        for row_x, row_y, row_p in zip(x, y, positions, strict=True):
            at = 0
            for token, length in _segments(row_x, row_p):
                if token == 0:  # padding: the rest of the row
                    assert at + length == 32 and row_x[at:].eq(0).all()
                    assert row_y[at:].eq(data.IGNORE_INDEX).all()
                    break
                assert length == min(LENGTHS[token - 1], 32)
                assert row_x[at : at + length].eq(token).all()
                assert row_y[at : at + length - 1].eq(token).all()
                assert int(row_y[at + length - 1]) == data.IGNORE_INDEX
                seen.append(token - 1)
                at += length
    assert sorted(seen) == list(range(len(LENGTHS)))
    assert sampler.report == packing.CutReport(seq_len=32, examples=20, cut=6, dropped=0)


def test_packing_fills_rows_and_places_every_example_once() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 400, 3000)
    order = rng.permutation(lengths.size)
    rows = packing.pack_rows(lengths, order, 512)
    assert sorted(e for row in rows for e in row) == list(range(lengths.size))
    assert max(sum(lengths[row]) for row in rows) <= 512
    fill = lengths.sum() / (len(rows) * 512)
    assert fill > 0.97, fill


def _visits(sampler: packing.PackedSampler, epoch: int) -> list[int]:
    first = sampler.steps_for(epoch)
    seen = []
    for step in range(first, first + sampler.steps_in(epoch)):
        for micro in range(sampler.grad_accum):
            x, _, positions = sampler.batch(step, micro)
            seen += [t - 1 for row in zip(x, positions, strict=True) for t, _ in _segments(*row)]
    return [e for e in seen if e >= 0]  # padding rows start with token 0


def test_each_epoch_visits_every_example_once_in_an_order_of_seed_and_epoch(
    tmp_path: Path,
) -> None:
    dataset = data.open_dataset(_numbered(tmp_path))
    options = {"seq_len": 80, "micro_batch": 2, "grad_accum": 2}
    a = packing.PackedSampler(dataset, seed=3, **options)  # type: ignore[arg-type]
    again = packing.PackedSampler(dataset, seed=3, **options)  # type: ignore[arg-type]
    other = packing.PackedSampler(dataset, seed=4, **options)  # type: ignore[arg-type]
    epochs = [_visits(a, e) for e in range(3)]
    for visits in epochs:
        assert sorted(visits) == list(range(len(LENGTHS)))
    assert epochs[0] != epochs[1] != epochs[2]
    assert _visits(other, 1) != epochs[1]
    assert [_visits(again, e) for e in range(3)] == epochs
    # The steps run on from epoch to epoch: step -> (epoch, step in epoch).
    first = a.steps_in(0)
    assert a.locate(first - 1) == (0, first - 1) and a.locate(first) == (1, 0)
    assert a.steps_for(2) == first + a.steps_in(1)


def test_ranks_and_micro_steps_split_the_same_global_batch_of_rows(tmp_path: Path) -> None:
    dataset = data.open_dataset(_numbered(tmp_path))
    whole = packing.PackedSampler(dataset, seq_len=64, micro_batch=4, seed=2).batch(3)
    ranks = [
        packing.PackedSampler(dataset, seq_len=64, micro_batch=2, seed=2, rank=r, world_size=2)
        for r in (0, 1)
    ]
    accumulating = packing.PackedSampler(dataset, seq_len=64, micro_batch=2, seed=2, grad_accum=2)
    for part in range(3):
        assert torch.equal(torch.cat([s.batch(3)[part] for s in ranks]), whole[part])
        assert torch.equal(torch.cat([accumulating.batch(3, m)[part] for m in (0, 1)]), whole[part])


def _row(examples: list[torch.Tensor], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One packed row of ``examples`` and its positions, padded with token 0."""
    x = torch.zeros(seq_len, dtype=torch.int64)
    positions = torch.zeros(seq_len, dtype=torch.int64)
    at = 0
    for example in examples:
        x[at : at + example.numel()] = example
        positions[at : at + example.numel()] = torch.arange(example.numel())
        at += example.numel()
    positions[at:] = torch.arange(seq_len - at)
    return x.unsqueeze(0), positions.unsqueeze(0)


def _losses(model: GPT, examples: list[torch.Tensor], which: int) -> torch.Tensor:
    """Per-target cross-entropy of example ``which`` of a row packed with ``examples``."""
    x, positions = _row(examples, model.cfg.seq_len)
    start = sum(e.numel() for e in examples[:which])
    target = examples[which]
    with torch.no_grad():
        logits = model.logits(x, positions)[0, start : start + target.numel() - 1]
    return torch.nn.functional.cross_entropy(logits, target[1:], reduction="none")


@pytest.mark.parametrize("llama_style", [False, True], ids=["learned-positions", "rope"])
def test_an_examples_loss_does_not_change_when_its_row_mate_changes(llama_style: bool) -> None:
    """Attention and positions stay inside an example: the loss of each target of A is the same
    beside B or beside another C, before or after it, and alone in its row."""
    cfg = ModelConfig(
        n_layer=2,
        n_head=4,
        n_kv_head=2 if llama_style else 0,
        d_model=32,
        seq_len=32,
        vocab_size=64,
        llama_style=llama_style,
    )
    torch.manual_seed(0)
    model = GPT(cfg)
    a, b, c = (torch.randint(1, 64, (n,)) for n in (9, 11, 14))
    alone = _losses(model, [a], 0)
    for others in ([b], [c]):
        # Other row-mates, another place in the row: other attention blocks, other roundings.
        assert_fp32_close(_losses(model, [a, *others], 0), alone)
        assert_fp32_close(_losses(model, [*others, a], 1), alone)
    # The mask matters: without it (plain causal attention, positions running on) A after B
    # would see B.
    x, _ = _row([b, a], cfg.seq_len)
    with torch.no_grad():
        unmasked = model.logits(x)[0, b.numel() : b.numel() + a.numel() - 1]
    across = torch.nn.functional.cross_entropy(unmasked, a[1:], reduction="none")
    with pytest.raises(AssertionError):
        assert_fp32_close(across, alone)


@pytest.mark.parametrize(
    ("mask", "seq_len", "kept"),
    [
        # prompt (0), reply (1), prompt, reply: reply ends after tokens 4 and 9.
        ([0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0], 20, 11),  # fits: whole
        ([0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0], 9, 5),  # the second reply is cut off whole
        ([0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0], 5, 5),  # the first reply ends at the limit
        ([0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0], 4, 0),  # the first reply does not fit: dropped
        ([0, 0, 1, 1, 1, 1, 1, 1], 6, 0),  # a reply that runs past the limit is never cut
        (None, 6, 6),  # a document keeps its first seq_len tokens
    ],
)
def test_the_cutting_rule_keeps_whole_turns_from_the_start(
    mask: list[int] | None, seq_len: int, kept: int
) -> None:
    length = 11 if mask is None else len(mask)
    array = None if mask is None else np.asarray(mask, dtype=np.uint8)
    assert packing.kept_length(length, array, seq_len) == kept


def _config(root: Path, tmp_path: Path, **overrides: object) -> TrainConfig:
    options: dict[str, object] = {
        "preset": "tiny",
        "device": "cpu",
        "compile": "none",
        "data": str(root),
        "seq_len": 32,
        "micro_batch": 2,
        "log_every": 1,
        "seed": 5,
        "metrics": str(tmp_path / "m.jsonl"),
    }
    return TrainConfig(**{**options, **overrides})  # type: ignore[arg-type]


def test_a_resume_mid_epoch_trains_the_batches_of_the_uninterrupted_run(tmp_path: Path) -> None:
    root = _numbered(tmp_path / "d")
    checkpoints = {"checkpoint_dir": str(tmp_path / "ck"), "keep_checkpoints": 100}
    result = train(_config(root, tmp_path, epochs=2, checkpoint_every=1, **checkpoints))
    sampler = packing.PackedSampler(data.open_dataset(root), seq_len=32, micro_batch=2, seed=5)
    per_epoch = sampler.steps_in(0)
    assert result.steps_done == sampler.steps_for(2) == per_epoch + sampler.steps_in(1)
    straight = Checkpointer(LocalStore(tmp_path / "ck")).load(str(result.checkpoint))
    # Keep the checkpoints up to one step into the second epoch, then run again.
    resume_at = per_epoch + 1
    assert sampler.locate(resume_at) == (1, 1)
    for path in (tmp_path / "ck").glob("step_*"):
        if int(path.name.removeprefix("step_")) > resume_at:
            shutil.rmtree(path)
    again = train(_config(root, tmp_path, epochs=2, **checkpoints))
    assert again.checkpoint == result.checkpoint
    resumed = Checkpointer(LocalStore(tmp_path / "ck")).load(str(again.checkpoint))
    for name, value in straight["model"].items():
        assert torch.equal(value, resumed["model"][name]), name
    first, second = metrics.headers(tmp_path / "m.jsonl")
    assert first["data"] == second["data"]
    assert first["data"]["train"] == {"examples": 20, "cut": 6, "dropped": 0}
    assert first["data"]["steps_per_epoch"] == per_epoch


def test_a_resume_with_other_epochs_is_refused(tmp_path: Path) -> None:
    from trainer.checkpoint import RunConfigError

    root = _numbered(tmp_path / "d")
    train(_config(root, tmp_path, epochs=1, checkpoint_dir=str(tmp_path / "ck")))
    with pytest.raises(RunConfigError, match=r"epochs 1 in the checkpoint, 2 now"):
        train(_config(root, tmp_path, epochs=2, checkpoint_dir=str(tmp_path / "ck")))


def test_the_step_loss_is_the_mean_over_trained_targets_with_padding_left_out(
    tmp_path: Path,
) -> None:
    """Two micro-steps of rows with padding: the logged loss is -log p summed over every target
    of the step's examples (not padding, not an example's last token), over their count."""
    rng = np.random.default_rng(0)
    examples = [(rng.integers(1, 256, n), None) for n in rng.integers(4, 30, 12)]
    root = _write(tmp_path / "d", examples)
    train(_config(root, tmp_path, max_steps=1, grad_accum=2))
    (record,) = metrics.read(tmp_path / "m.jsonl")
    sampler = packing.PackedSampler(
        data.open_dataset(root), seq_len=32, micro_batch=2, seed=5, grad_accum=2
    )
    torch.manual_seed(5)
    model = GPT(model_config(TrainConfig(seq_len=32)))
    total, count = 0.0, 0
    with torch.no_grad():
        for micro in (0, 1):
            x, y, positions = sampler.batch(0, micro)
            log_probs = torch.log_softmax(model.logits(x, positions).double(), dim=-1)
            keep = y != data.IGNORE_INDEX
            total -= float(log_probs[keep].gather(1, y[keep].unsqueeze(1)).sum())
            count += int(keep.sum())
    assert count == sampler.trained_targets(0) < 4 * 32 - 4
    # The trainer's FP32 loss kernel against log-softmax in FP64 of the same logits.
    assert_fp32_close(record["loss"], total / count)


def test_epochs_and_max_steps_exclude_each_other(corpus_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"max_steps 5 and epochs 2 exclude each other"):
        TrainConfig(data="d", epochs=2, max_steps=5).validate()
    with pytest.raises(ValueError, match=r"epochs must be >= 0 \(0: count steps\), got -1"):
        TrainConfig(data="d", epochs=-1).validate()
    with pytest.raises(ValueError, match=r"epochs 1: .* is a token stream"):
        train(_config(corpus_dir, tmp_path, epochs=1))


def test_a_manifest_whose_index_does_not_cut_its_shard_is_refused(tmp_path: Path) -> None:
    root = _numbered(tmp_path)
    index = root / "shard_00000.idx"
    offsets = np.cumsum([0, *LENGTHS]).astype("<u8")
    offsets[3] = offsets[2]  # an empty example
    index.write_bytes(data.HEADER.pack(data.INDEX_MAGIC, 1, 8, offsets.size) + offsets.tobytes())
    with pytest.raises(data.ShardError, match=r"shard_00000.idx: its offsets do not cut"):
        data.open_dataset(root, verify=False)
