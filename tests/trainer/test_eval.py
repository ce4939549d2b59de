"""Eval loss on the held-out split: every example once, at the right steps, equal to an
independent computation and to `trn-train eval` (whatever the order of the examples and the batch
size), in its own metrics records, exact across a resume, plotted by the report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import hf_tiny
import numpy as np
import pytest
import tiny_tokenizer
import torch
import two_ranks as two_ranks_launch
from two_ranks import TwoRanks

from trainer import cli, data, evaluation, metrics, report, tokenizing
from trainer.checkpoint import Checkpointer, CheckpointError, LocalStore
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
    state = Checkpointer(LocalStore(checkpoint_dir)).load(f"step_{step:08d}")
    model = GPT(PRESETS["tiny"].model)
    model.load_state_dict(state["model"])
    return model


def _independent_eval_loss(model: GPT, split: data.Dataset) -> tuple[float, int]:
    """Sum of -log p(target) over every trained target of every held-out example, each alone in
    a row of its own (no row-mates), over their count, from the model's logits in FP64."""
    assert split.index is not None and split.masks is not None
    total, count = 0.0, 0
    with torch.no_grad():
        for shard, mask, offsets in zip(split.shards, split.masks, split.index, strict=True):
            for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
                tokens = torch.from_numpy(np.asarray(shard[start:end], dtype=np.int64))
                trained = torch.from_numpy(np.asarray(mask[start + 1 : end]) == 1)
                x = torch.zeros(1, 64, dtype=torch.int64)
                x[0, : tokens.numel()] = tokens
                positions = torch.arange(64).unsqueeze(0)  # one example, then padding
                positions[0, tokens.numel() :] -= tokens.numel()
                logits = model.logits(x, positions)[0, : tokens.numel() - 1].double()
                picked = torch.log_softmax(logits, -1).gather(1, tokens[1:].unsqueeze(1))
                total -= float(picked.squeeze(1)[trained].sum())
                count += int(trained.sum())
    return total / count, count


def test_eval_loss_at_its_steps_equals_an_independent_computation(
    chat_data: Path, tmp_path: Path
) -> None:
    """The in-run eval covers every held-out example once: its loss is each example's own,
    computed alone; `trn-train eval` of the checkpoint gives the same number."""
    cfg = _config(chat_data, tmp_path)
    train(cfg)
    evals = metrics.read(tmp_path / "m.jsonl", metrics.EVAL)
    assert [r["step"] for r in evals] == [2, 4]
    # Training records are still all there: an eval record does not replace its step's.
    assert [r["step"] for r in metrics.read(tmp_path / "m.jsonl")] == [1, 2, 3, 4]
    dataset = data.open_dataset(chat_data)
    assert dataset.eval_split is not None
    for record in evals:
        model = _model_at(tmp_path / "ck", record["step"])
        expected, targets = _independent_eval_loss(model, dataset.eval_split)
        assert record["eval_loss"] == pytest.approx(expected, rel=1e-5)
        assert record["eval_tokens"] == targets
    result = evaluation.run(
        data_dir=str(chat_data), checkpoint_dir=str(tmp_path / "ck"), device_name="cpu"
    )
    assert result.loss == pytest.approx(evals[-1]["eval_loss"], rel=1e-5)
    assert result.tokens == evals[-1]["eval_tokens"]
    assert result.examples == dataset.eval_split.num_examples == 24


def test_resume_is_exact_with_masks_and_eval(chat_data: Path, tmp_path: Path) -> None:
    cfg = _config(chat_data, tmp_path)
    train(cfg)
    straight = Checkpointer(LocalStore(tmp_path / "ck")).load("step_00000004")
    straight_eval = metrics.read(tmp_path / "m.jsonl", metrics.EVAL)[-1]
    shutil.rmtree(tmp_path / "ck" / "step_00000004")
    train(_config(chat_data, tmp_path, metrics=str(tmp_path / "resumed.jsonl")))
    resumed = Checkpointer(LocalStore(tmp_path / "ck")).load("step_00000004")
    for name, value in straight["model"].items():
        assert torch.equal(value, resumed["model"][name]), name
    resumed_evals = metrics.read(tmp_path / "resumed.jsonl", metrics.EVAL)
    assert [r["step"] for r in resumed_evals] == [4]
    assert resumed_evals[0]["eval_loss"] == straight_eval["eval_loss"]


def test_eval_without_a_held_out_split_is_refused(corpus_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"eval_every 2 needs a held-out split; .* has none"):
        train(_config(corpus_dir, tmp_path))


def test_a_held_out_split_shorter_than_a_row_of_the_run_is_refused(tmp_path: Path) -> None:
    """Prepared for a shorter sequence than the run's: the run says so before its first step."""
    tok_dir = tiny_tokenizer.build(tmp_path / "tok")
    (tmp_path / "t.txt").write_text("the cat sat on a mat " * 30)
    tokenizing.prepare(
        tmp_path / "d", tok_dir, tmp_path / "t.txt", "text", eval_fraction=0.1, seq_len=16
    )
    with pytest.raises(ValueError, match=r"held-out split of .* has nothing for a row of seq_len"):
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


def _hf_chats(root: Path, model: Path, order: list[int] | None = None) -> Path:
    """Conversations of one or two turns in the tiny models' words (w2 ... w99), in ``order``
    (default: as drawn), prepared with the model's tokenizer; a quarter held out."""
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(24):
        messages = []
        for _turn in range(int(rng.integers(1, 3))):
            for role in ("user", "assistant"):
                words = rng.integers(2, 100, int(rng.integers(1, 5)))
                messages.append({"role": role, "content": " ".join(f"w{w}" for w in words)})
        lines.append(json.dumps({"messages": messages}) + "\n")
    root.mkdir(parents=True, exist_ok=True)
    (root / "chat.jsonl").write_text("".join(lines[i] for i in order or range(len(lines))))
    tokenizing.prepare(
        root / "data", model, root / "chat.jsonl", "chat", eval_fraction=0.25, seq_len=16
    )
    return root / "data"


def _eval_cli(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, float]:
    assert cli.main(["eval", "--device", "cpu", *args]) == 0
    result: dict[str, float] = json.loads(capsys.readouterr().out)
    return result


def test_trn_train_eval_does_not_depend_on_order_or_batch_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same examples in another order of the input file, in other batch sizes: the same
    loss (other packings run other kernels: a tolerance), which is transformers' own loss of
    each held-out example alone, over the assistant tokens."""
    source = hf_tiny.model_dir(tmp_path, "llama")
    first = _hf_chats(tmp_path / "a", source)
    shuffled = _hf_chats(
        tmp_path / "b", source, order=list(np.random.default_rng(1).permutation(24))
    )
    one = _eval_cli(capsys, "--model", str(source), "--data", str(first), "--micro-batch", "1")
    other = _eval_cli(capsys, "--model", str(source), "--data", str(shuffled), "--micro-batch", "3")
    assert one["examples"] == other["examples"] == 6
    assert one["tokens"] == other["tokens"] > 0
    assert other["loss"] == pytest.approx(one["loss"], rel=1e-5)

    theirs = hf_tiny.build("llama")
    split = data.open_dataset(first).eval_split
    assert split is not None and split.index is not None and split.masks is not None
    total, count = 0.0, 0
    for shard, mask, offsets in zip(split.shards, split.masks, split.index, strict=True):
        for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
            tokens = torch.from_numpy(np.asarray(shard[start:end], dtype=np.int64)).unsqueeze(0)
            labels = tokens.clone()
            labels[0, torch.from_numpy(np.asarray(mask[start:end]) == 0)] = -100
            trained = int((labels[0, 1:] != -100).sum())
            with torch.no_grad():
                total += float(theirs(input_ids=tokens, labels=labels).loss) * trained
            count += trained
    assert one["tokens"] == count
    assert one["loss"] == pytest.approx(total / count, rel=1e-5)
    # Every split at once is the token-weighted mean of the two.
    train_only = _eval_cli(capsys, "--model", str(source), "--data", str(first), "--split", "train")
    both = _eval_cli(capsys, "--model", str(source), "--data", str(first), "--split", "all")
    assert both["tokens"] == one["tokens"] + train_only["tokens"]
    weighted = (one["loss"] * one["tokens"] + train_only["loss"] * train_only["tokens"]) / (
        both["tokens"]
    )
    assert both["loss"] == pytest.approx(weighted, rel=1e-5)


@pytest.mark.parametrize("lora_flags", [[], ["--lora-rank", "4"]], ids=["full", "lora"])
def test_the_in_run_eval_equals_trn_train_eval_of_its_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lora_flags: list[str]
) -> None:
    source = hf_tiny.model_dir(tmp_path, "qwen3")
    chats = _hf_chats(tmp_path / "chats", source)
    ck, log = tmp_path / "ck", tmp_path / "m.jsonl"
    argv = hf_tiny.run_args(
        source,
        chats,
        ck,
        "--eval-every",
        "2",
        "--metrics",
        str(log),
        *lora_flags,
        lr="3e-3",
        max_steps="4",
    )
    assert cli.main(argv) == 0
    in_run = metrics.read(log, metrics.EVAL)[-1]
    capsys.readouterr()
    result = _eval_cli(capsys, "--checkpoint-dir", str(ck), "--data", str(chats))
    assert result["tokens"] == in_run["eval_tokens"]
    assert result["loss"] == pytest.approx(in_run["eval_loss"], rel=1e-5)
    # Trained: the checkpoint's model, not the base model, was evaluated.
    base = _eval_cli(capsys, "--model", str(source), "--data", str(chats), "--seq-len", "16")
    assert base["loss"] != pytest.approx(result["loss"], rel=1e-3)


def test_trn_train_eval_refuses_what_it_cannot_read(corpus_dir: Path, tmp_path: Path) -> None:
    source = hf_tiny.model_dir(tmp_path, "llama")
    with pytest.raises(ValueError, match=r"is a token stream .* trn-train eval reads data of"):
        evaluation.run(data_dir=str(corpus_dir), model_dir=str(source), device_name="cpu")
    chats = _hf_chats(tmp_path / "c", source)
    with pytest.raises(ValueError, match=r"give exactly one of --model DIR and --checkpoint-dir"):
        evaluation.run(data_dir=str(chats), device_name="cpu")
    with pytest.raises(CheckpointError, match=r"holds no valid checkpoint to evaluate"):
        evaluation.run(data_dir=str(chats), checkpoint_dir=str(tmp_path), device_name="cpu")
