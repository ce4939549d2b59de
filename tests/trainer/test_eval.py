"""Eval loss on the held-out split: at the right steps, equal to an independent computation, in
its own metrics records, exact across a resume, plotted by the report."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tiny_tokenizer
import torch
import two_ranks as two_ranks_launch
from two_ranks import TwoRanks

from trainer import cli, data, metrics, report, tokenizing
from trainer.config import PRESETS, TrainConfig
from trainer.loop import train
from trainer.model import GPT


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Conversations with masked prompts and a held-out tail of 20%."""
    return two_ranks_launch.write_chat(tmp_path_factory.mktemp("chat"))


def _config(data_dir: Path, tmp_path: Path, **overrides: object) -> TrainConfig:
    options: dict[str, object] = {
        "preset": "tiny",
        "device": "cpu",
        "compile": "none",
        "data": str(data_dir),
        "max_steps": 4,
        "micro_batch": 2,
        "log_every": 1,
        "eval_every": 2,
        "eval_batches": 3,
        "checkpoint_every": 2,
        "checkpoint_dir": str(tmp_path / "ck"),
        "metrics": str(tmp_path / "m.jsonl"),
        "seed": 7,
    }
    return TrainConfig(**{**options, **overrides})  # type: ignore[arg-type]


def _model_at(checkpoint_dir: Path, step: int) -> GPT:
    state = torch.load(checkpoint_dir / f"step_{step:08d}" / "state.pt", weights_only=True)
    model = GPT(PRESETS["tiny"].model)
    model.load_state_dict(state["model"])
    return model


def _independent_eval_loss(model: GPT, dataset: data.Dataset, batches: int, seed: int) -> float:
    """Sum of -log p(target) over every trained target of the held-out batches, over their count,
    from the model's logits."""
    assert dataset.eval_split is not None
    sampler = data.WindowSampler(dataset.eval_split, seq_len=64, micro_batch=2, seed=seed)
    captured: list[torch.Tensor] = []
    model.head.register_forward_hook(lambda module, args, out: captured.append(out))
    total, count = 0.0, 0
    with torch.no_grad():
        for k in range(batches):
            x, y = sampler.batch(k)
            model(x, y)
            log_probs = torch.log_softmax(captured.pop().double(), dim=-1)
            keep = y != data.IGNORE_INDEX
            total -= float(log_probs[keep].gather(1, y[keep].unsqueeze(1)).sum())
            count += int(keep.sum())
    return total / count


def test_eval_loss_at_its_steps_equals_an_independent_computation(
    chat_data: Path, tmp_path: Path
) -> None:
    cfg = _config(chat_data, tmp_path)
    train(cfg)
    evals = metrics.read(tmp_path / "m.jsonl", metrics.EVAL)
    assert [r["step"] for r in evals] == [2, 4]
    # Training records are still all there: an eval record does not replace its step's.
    assert [r["step"] for r in metrics.read(tmp_path / "m.jsonl")] == [1, 2, 3, 4]
    dataset = data.open_dataset(chat_data)
    for record in evals:
        model = _model_at(tmp_path / "ck", record["step"])
        expected = _independent_eval_loss(model, dataset, 3, seed=7)
        assert record["eval_loss"] == pytest.approx(expected, rel=1e-5)
        assert 0 < record["eval_tokens"] < 3 * 2 * 64  # prompts are not counted


def test_resume_is_exact_with_masks_and_eval(chat_data: Path, tmp_path: Path) -> None:
    cfg = _config(chat_data, tmp_path)
    train(cfg)
    straight = torch.load(tmp_path / "ck" / "step_00000004" / "state.pt", weights_only=True)
    straight_eval = metrics.read(tmp_path / "m.jsonl", metrics.EVAL)[-1]
    shutil.rmtree(tmp_path / "ck" / "step_00000004")
    train(_config(chat_data, tmp_path, metrics=str(tmp_path / "resumed.jsonl")))
    resumed = torch.load(tmp_path / "ck" / "step_00000004" / "state.pt", weights_only=True)
    for name, value in straight["model"].items():
        assert torch.equal(value, resumed["model"][name]), name
    resumed_evals = metrics.read(tmp_path / "resumed.jsonl", metrics.EVAL)
    assert [r["step"] for r in resumed_evals] == [4]
    assert resumed_evals[0]["eval_loss"] == straight_eval["eval_loss"]


def test_eval_without_a_held_out_split_is_refused(corpus_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"eval_every 2 needs a held-out split; .* has none"):
        train(_config(corpus_dir, tmp_path))


def test_a_held_out_split_shorter_than_a_window_is_refused(tmp_path: Path) -> None:
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    (tmp_path / "t.txt").write_text("the cat sat on a mat " * 30)
    tokenizing.prepare(tmp_path / "d", tok_dir, tmp_path / "t.txt", "text", eval_fraction=0.1)
    with pytest.raises(ValueError, match=r"held-out split of .* has no shard of 65 tokens"):
        train(_config(tmp_path / "d", tmp_path))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("eval_every", -1, r"eval_every must be >= 0 \(0: no eval\), got -1"),
        ("eval_batches", 0, r"eval_batches must be >= 1, got 0"),
    ],
)
def test_eval_settings_are_validated(field: str, value: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(data="d", **{field: value}).validate()  # type: ignore[arg-type]


def test_cli_passes_eval_flags() -> None:
    args = cli._parser().parse_args(
        ["run", "--data", "d", "--eval-every", "50", "--eval-batches", "4"]
    )
    assert (args.eval_every, args.eval_batches) == (50, 4)
    assert cli._parser().parse_args(["run", "--data", "d"]).eval_every == 0


def test_report_draws_the_eval_loss(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    log = metrics.MetricsLog(str(path), total_steps=4, progress=False)
    for step in (1, 2):
        log.write({"step": step, "loss": 3.0 - step, "lr": 1e-3, "tokens_per_s": 10.0})
    log.write_eval({"step": 2, "eval_loss": 2.5, "eval_tokens": 40})
    log.close()
    assert [r["loss"] for r in metrics.read(path)] == [2.0, 1.0]
    assert metrics.read(path, metrics.EVAL) == [
        {"kind": "eval", "step": 2, "eval_loss": 2.5, "eval_tokens": 40}
    ]
    figure = report.figure(path)
    ax_loss = figure.axes[0]
    lines = {line.get_label(): line for line in ax_loss.get_lines()}
    assert set(lines) == {"train", "eval"}
    assert np.asarray(lines["eval"].get_xdata()).tolist() == [2]
    assert np.asarray(lines["eval"].get_ydata()).tolist() == [2.5]
    assert report.plot(path, tmp_path / "m.png").stat().st_size > 0


@pytest.mark.slow
def test_eval_on_the_compiled_path_adds_no_graph(chat_data: Path, tmp_path: Path) -> None:
    """The forward compiled for training is not recompiled for eval (no gradients): eval runs it
    eagerly, so fail_on_recompile holds, and its losses are the eager run's."""
    from torch._dynamo.utils import counters

    eager = _config(chat_data, tmp_path, checkpoint_dir="", checkpoint_every=0)
    train(eager)
    torch._dynamo.reset()
    counters.clear()
    compiled = _config(
        chat_data,
        tmp_path,
        compile="aot_eager",
        fail_on_recompile=True,
        checkpoint_dir="",
        checkpoint_every=0,
        metrics=str(tmp_path / "compiled.jsonl"),
    )
    try:
        train(compiled)
        assert counters["stats"]["unique_graphs"] == 1
    finally:
        torch._dynamo.reset()
    expected = [r["eval_loss"] for r in metrics.read(tmp_path / "m.jsonl", metrics.EVAL)]
    got = [r["eval_loss"] for r in metrics.read(tmp_path / "compiled.jsonl", metrics.EVAL)]
    assert got == pytest.approx(expected, rel=1e-5) and len(got) == 2


@pytest.mark.xdist_group(two_ranks_launch.GROUP)
def test_two_fsdp_ranks_report_the_one_rank_eval_loss(two_ranks: TwoRanks, tmp_path: Path) -> None:
    """Each rank trains on and evaluates its rows and the sums over trained targets are
    combined: two ranks of 2 rows give the training and eval losses of one rank of 4 rows. The
    two ranks are the job "eval-fsdp" of tests/trainer/two_ranks.py, on the same data."""
    one = _config(
        two_ranks.chat,
        tmp_path,
        micro_batch=4,
        checkpoint_dir="",
        checkpoint_every=0,
        metrics=str(tmp_path / "one.jsonl"),
    )
    train(one)
    assert [r["exit"] for r in two_ranks.results("eval-fsdp")] == [0, 0]
    two = two_ranks.root / "eval-fsdp" / "two.jsonl"
    # The step's loss is the mean over its trained targets however the rows are split.
    two_rank, one_rank = metrics.read(two), metrics.read(tmp_path / "one.jsonl")
    assert [r["step"] for r in two_rank] == [r["step"] for r in one_rank] == [1, 2, 3, 4]
    for mine, reference in zip(two_rank, one_rank, strict=True):
        assert mine["loss"] == pytest.approx(reference["loss"], rel=1e-5), mine["step"]
    expected = metrics.read(tmp_path / "one.jsonl", metrics.EVAL)
    got = metrics.read(two, metrics.EVAL)
    assert [r["step"] for r in got] == [2, 4]
    for mine, reference in zip(got, expected, strict=True):
        assert mine["eval_tokens"] == reference["eval_tokens"]
        assert mine["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-5)
