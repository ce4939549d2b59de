"""The loop's extension point: a task other than the causal LM plugs into the step and what
follows it (trainer.task.Task), and the loop asks it for exactly what the protocol says, in
order."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from trainer import loop, metrics
from trainer.config import TrainConfig
from trainer.task import Batch, Forward


class _Probe:
    """Not the causal LM: one fixed batch, each micro-batch's loss scaled by a weight of 0.5,
    an eval figure of its own; it records what the loop asks of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.tokens = torch.arange(2 * 17).reshape(2, 17) % 256

    def batch(self, step: int, micro: int) -> Batch:
        self.calls.append(("batch", step, micro))
        return self.tokens[:, :-1], self.tokens[:, 1:]

    def step_weight(self, step: int) -> torch.Tensor:
        self.calls.append(("weight", step))
        return torch.tensor(0.5)

    def loss(self, forward: Forward, batch: Batch, weight: torch.Tensor | None) -> torch.Tensor:
        assert weight is not None
        self.calls.append(("loss", float(weight)))
        x, y = batch
        loss: torch.Tensor = forward(x, y) * weight
        return loss

    def evaluate(self, forward: Forward) -> dict[str, object]:
        self.calls.append(("evaluate",))
        with torch.no_grad():
            return {"probe_loss": float(forward(self.tokens[:, :-1], self.tokens[:, 1:]))}


def test_a_new_task_plugs_into_the_step_unchanged(corpus_dir: Path, tmp_path: Path) -> None:
    cfg = TrainConfig(
        preset="tiny",
        device="cpu",
        compile="none",
        data=str(corpus_dir),
        seq_len=16,
        max_steps=4,
        grad_accum=2,
        log_every=2,
        metrics=str(tmp_path / "m.jsonl"),
    )
    run = loop.set_up(cfg)
    probe = _Probe()
    # The causal LM's set-up, then the probe in its place (with eval on: the corpus has no
    # held-out split for the causal LM's eval).
    run = dataclasses.replace(
        run,
        cfg=dataclasses.replace(cfg, eval_every=2),
        task=probe,
        batches=run.backend.batches(loop._stream(probe, 0, 4, 2)),
    )
    result = loop.run_steps(run)

    def one_step(s: int) -> list[tuple[object, ...]]:
        return [("weight", s), ("batch", s, 0), ("loss", 0.5), ("batch", s, 1), ("loss", 0.5)]

    evaluated = [("evaluate",)]
    assert probe.calls == [
        *one_step(0), *one_step(1), *evaluated, *one_step(2), *one_step(3), *evaluated
    ]  # fmt: skip
    assert result.steps_done == 4 and not result.preempted
    records = metrics.read(tmp_path / "m.jsonl")
    assert [r["step"] for r in records] == [2, 4]
    evals = metrics.read(tmp_path / "m.jsonl", kind="eval")
    assert [(r["step"], sorted(r)) for r in evals] == [
        (s, ["elapsed_s", "kind", "probe_loss", "step"]) for s in (2, 4)
    ]
    # The probe's loss (half the model's, each micro-batch) is what the loop logs.
    assert records[-1]["loss"] < records[0]["loss"]
