"""`trnctl job submit --task classify` and `trnctl job export --best`: every classification
flag reaches `trn-train run` as the trainer parses it, what the trainer would refuse is refused
before anything is submitted, and the export of a job's best checkpoint asks `trn-train export
--best` (against the fake API server of the other job tests, tests/trnctl/fake_kube.py)."""

from __future__ import annotations

from typing import Any

import pytest
import test_trnctl_kube
import test_trnctl_model_jobs
import yaml
from fake_kube import FakeKube
from test_trnctl_export_lora import EXPORT, _created, _source
from test_trnctl_model_jobs import SUBMIT, _export_finishes

from trainer.cli import _parser
from trnctl import jobs
from trnctl.errors import ExitCode, TrnctlError

fake = test_trnctl_kube.fake
deployed = test_trnctl_model_jobs.deployed
no_kubernetes = test_trnctl_model_jobs.no_kubernetes
CLASSIFY = (
    "--model", "models/llama-3.2-1b", "--task", "classify", "--class-weights", "auto",
    "--epochs", "3", "--eval-every", "50", "--best-metric", "eval_macro_f1", "--lora-rank", "8",
)  # fmt: skip


def test_a_classification_job_passes_every_flag_to_trn_train_run(
    deployed: None, no_kubernetes: None, trnctl: Any
) -> None:
    run = trnctl(*SUBMIT, *CLASSIFY, "--name", "docs-clf")

    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    jobs.check_schema(job)
    parsed = _parser().parse_args(["run", *job["spec"]["trainer"]["args"]])
    assert parsed.model_dir == "/datasets/models/llama-3.2-1b"
    assert (parsed.task, parsed.class_weights, parsed.best_metric) == (
        "classify",
        "auto",
        "eval_macro_f1",
    )
    assert (parsed.epochs, parsed.eval_every, parsed.lora_rank) == (3, 50, 8)
    assert parsed.checkpoint_dir == "/fsx/checkpoints/docs-clf"


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (("--best-metric", "eval_accuracy"), "--best-metric 'eval_accuracy' names an eval"),
        (("--best-metric", "accuracy", "--eval-every", "5"), "--best-metric 'accuracy' names"),
        (("--class-weights", "auto"), "--class-weights needs --task classify"),
    ],
)
def test_what_trn_train_would_refuse_is_refused_before_submitting(
    deployed: None, no_kubernetes: None, trnctl: Any, extra: tuple[str, ...], line: str
) -> None:
    run = trnctl(*SUBMIT, "--model", "models/llama-3.2-1b", *extra)

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr.startswith(f"trnctl: {line}")


def test_best_metric_needs_eval_every_as_the_trainer_does() -> None:
    with pytest.raises(TrnctlError, match="needs --eval-every N above 0"):
        jobs.TrainingArgs(None, "d", model="m", best_metric="eval_loss", eval_every=0)
    args = jobs.TrainingArgs(None, "d", model="m", best_metric="eval_loss", eval_every=10)
    assert _parser().parse_args(["run", *args.argv("j")]).best_metric == "eval_loss"


def test_a_job_s_best_metric_is_read_from_its_arguments() -> None:
    args = jobs.TrainingArgs(
        None, "d", model="m", task="classify", eval_every=5, best_metric="eval_accuracy"
    ).argv("j")
    assert jobs.best_metric_of({"spec": {"trainer": {"args": args}}}) == "eval_accuracy"
    assert jobs.best_metric_of({"spec": {"trainer": {"args": ["--best-metric=eval_loss"]}}}) == (
        "eval_loss"
    )
    assert jobs.best_metric_of({"spec": {"trainer": {"args": ["--model", "/m"]}}}) is None


def test_export_best_asks_trn_train_for_the_best_checkpoint(fake: FakeKube, trnctl: Any) -> None:
    args = jobs.TrainingArgs(
        None, "docs", model="llama-3.2-1b", task="classify", eval_every=5, best_metric="eval_loss"
    ).argv("ft-1")
    _source(fake, args)
    _export_finishes(fake, "Complete")

    run = trnctl(*EXPORT, "--best")

    assert run.exit_code == 0, run.stderr
    created = _created(fake)
    jobs.check_schema(created)
    trainer = created["spec"]["trainer"]
    assert _parser().parse_args([trainer["command"][-1], *trainer["args"]]).best is True
    assert run.stdout.startswith("exported the best checkpoint of ft-1 as a Hugging Face model: ")


def test_export_best_of_a_job_without_a_best_metric_is_refused(fake: FakeKube, trnctl: Any) -> None:
    _source(fake, jobs.TrainingArgs(None, "docs", model="llama-3.2-1b").argv("ft-1"))

    run = trnctl(*EXPORT, "--best")

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr.startswith("trnctl: --best: TrainJob 'ft-1' was not submitted with")
    assert list(fake.trainjobs) == ["ft-1"]
