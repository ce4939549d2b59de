"""`trnctl job export --merge-lora`: a LoRA job's export is its PEFT adapter by default and the
merged full model with the flag; the flag on a job without LoRA is refused before anything is
submitted, from the job's own arguments. Against the fake API server of the other job tests
(tests/trnctl/fake_kube.py) with the real kubernetes client."""

from __future__ import annotations

import dataclasses
from typing import Any

import boto3
import pytest
import test_trnctl_kube
import yaml
from fake_kube import FakeKube
from test_trnctl_aws import OUTPUTS
from test_trnctl_model_jobs import _export_finishes
from test_trnctl_target import GPU_OUTPUTS

from trainer.cli import _parser
from trnctl import jobs
from trnctl.errors import ExitCode

fake = test_trnctl_kube.fake
EXPORT = ("job", "export", "ft-1", "--env", "trn-dev", "--poll", "0.01")
LORA_ARGS = jobs.TrainingArgs(None, "chats", model="llama-3.2-1b", lora_rank=16).argv("ft-1")
FULL_ARGS = jobs.TrainingArgs(None, "chats", model="llama-3.2-1b").argv("ft-1")


def _source(fake: FakeKube, args: list[str]) -> None:
    """A --model TrainJob ``ft-1`` as trnctl job submit renders it, with ``args``."""
    job = jobs.render(
        name="ft-1",
        outputs=OUTPUTS,
        nodes=1,
        args=args,
        image="example.com/trainer:7",
        labels={jobs.MODEL_LABEL: "llama-3.2-1b"},
    )
    fake.trainjobs["ft-1"] = job


def _created(fake: FakeKube) -> dict[str, Any]:
    (export,) = [n for n in fake.trainjobs if n != "ft-1"]
    job: dict[str, Any] = fake.trainjobs[export]
    return job


@pytest.mark.parametrize("merge", [False, True])
def test_trn_train_export_reads_the_merge_choice_of_the_export_job(merge: bool) -> None:
    job = jobs.render_export(
        job_name="ft-1", export="ft-1-export-1201120000", outputs=OUTPUTS, merge_lora=merge
    )
    trainer = job["spec"]["trainer"]

    parsed = _parser().parse_args([trainer["command"][-1], *trainer["args"]])

    assert parsed.merge_lora is merge
    assert parsed.out == "/fsx/checkpoints/ft-1/export/ft-1-export-1201120000"
    jobs.check_schema(job)


def test_a_job_is_lora_when_its_arguments_pass_a_lora_rank() -> None:
    assert jobs.is_lora({"spec": {"trainer": {"args": LORA_ARGS}}})
    assert jobs.is_lora({"spec": {"trainer": {"args": ["--model", "/m", "--lora-rank=8"]}}})
    assert not jobs.is_lora({"spec": {"trainer": {"args": FULL_ARGS}}})
    assert not jobs.is_lora({"spec": {"trainer": {}}})
    assert not jobs.is_lora({})


def test_a_lora_job_exports_its_adapter_by_default(fake: FakeKube, trnctl: Any) -> None:
    _source(fake, LORA_ARGS)
    _export_finishes(fake, "Complete")

    run = trnctl(*EXPORT)

    assert run.exit_code == 0, run.stderr
    created = _created(fake)
    assert jobs.MERGE_LORA_FLAG not in created["spec"]["trainer"]["args"]
    assert run.stdout.startswith("exported the newest checkpoint of ft-1 as a PEFT adapter: ")


def test_a_lora_job_exports_the_merged_model_with_merge_lora(fake: FakeKube, trnctl: Any) -> None:
    _source(fake, LORA_ARGS)
    _export_finishes(fake, "Complete")

    run = trnctl(*EXPORT, "--merge-lora")

    assert run.exit_code == 0, run.stderr
    created = _created(fake)
    assert created["spec"]["trainer"]["args"][-1] == jobs.MERGE_LORA_FLAG
    assert created["spec"]["trainer"]["image"] == "example.com/trainer:7"
    jobs.check_schema(created)
    assert run.stdout.startswith(
        "exported the newest checkpoint of ft-1 as a Hugging Face model (LoRA adapters merged): "
    )


def test_merge_lora_on_a_job_without_lora_is_refused_before_submitting(
    fake: FakeKube, trnctl: Any
) -> None:
    _source(fake, FULL_ARGS)

    run = trnctl(*EXPORT, "--merge-lora")

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr == (
        "trnctl: --merge-lora: TrainJob 'ft-1' is not a LoRA fine-tune (its arguments have no "
        "--lora-rank); its export is the full model already, so leave out --merge-lora\n"
    )
    assert list(fake.trainjobs) == ["ft-1"]
    assert not [r for r in fake.requests if r.method == "POST"]


def test_a_full_fine_tune_still_exports_the_full_model(fake: FakeKube, trnctl: Any) -> None:
    _source(fake, FULL_ARGS)
    _export_finishes(fake, "Complete")

    run = trnctl(*EXPORT)

    assert run.exit_code == 0, run.stderr
    assert jobs.MERGE_LORA_FLAG not in _created(fake)["spec"]["trainer"]["args"]
    assert run.stdout.startswith("exported the newest checkpoint of ft-1 as a Hugging Face model: ")


def test_export_dry_run_prints_the_merge_flag(fake: FakeKube, trnctl: Any) -> None:
    run = trnctl("job", "export", "ft-1", "--env", "trn-dev", "--merge-lora", "--dry-run")

    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    assert job["spec"]["trainer"]["args"][-1] == "--merge-lora"
    assert not fake.requests


def _gpu_source(fake: FakeKube, gpu_nodes: int) -> None:
    """An environment with a GPU group of ``gpu_nodes`` and a --target gpu --model job ``ft-1``."""
    outputs = dataclasses.replace(GPU_OUTPUTS, gpu_nodes=gpu_nodes)
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=outputs.to_json(), Type="String", Overwrite=True
    )
    fake.trainjobs["ft-1"] = jobs.render(
        name="ft-1",
        outputs=outputs,
        nodes=1,
        args=FULL_ARGS,
        labels={jobs.MODEL_LABEL: "llama-3.2-1b"},
        target=jobs.GPU,
    )


def test_a_gpu_job_exports_on_the_gpu_group_with_its_cuda_image(
    fake: FakeKube, trnctl: Any
) -> None:
    _gpu_source(fake, gpu_nodes=1)
    _export_finishes(fake, "Complete")

    run = trnctl(*EXPORT)

    assert run.exit_code == 0, run.stderr
    created = _created(fake)
    assert created["spec"]["runtimeRef"]["name"] == "cuda-torch"
    assert created["spec"]["trainer"]["image"] == GPU_OUTPUTS.gpu_image_uri
    assert created["metadata"]["labels"][jobs.TARGET_LABEL] == jobs.GPU
    jobs.check_schema(created)


def test_an_export_on_an_empty_group_is_refused_before_submitting(
    fake: FakeKube, trnctl: Any
) -> None:
    _gpu_source(fake, gpu_nodes=0)

    # A short --timeout: were the export submitted, the test would fail in a second, not hang.
    run = trnctl(*EXPORT, "--timeout", "1")

    assert run.exit_code == ExitCode.USAGE
    assert "the GPU node group of trn-dev has 0 nodes" in run.stderr
    assert "-c gpu_nodes=N (N >= 1)" in run.stderr
    assert list(fake.trainjobs) == ["ft-1"]


def test_a_lora_export_passes_the_base_model_id_to_trn_train(fake: FakeKube, trnctl: Any) -> None:
    _source(fake, LORA_ARGS)
    _export_finishes(fake, "Complete")

    run = trnctl(*EXPORT, "--base-model-id", "meta-llama/Llama-3.2-1B")

    assert run.exit_code == 0, run.stderr
    trainer = _created(fake)["spec"]["trainer"]
    parsed = _parser().parse_args([trainer["command"][-1], *trainer["args"]])
    assert parsed.base_model_id == "meta-llama/Llama-3.2-1B"
    assert parsed.merge_lora is False


def test_without_a_base_model_id_trn_train_keeps_its_default(fake: FakeKube, trnctl: Any) -> None:
    _source(fake, LORA_ARGS)
    _export_finishes(fake, "Complete")

    assert trnctl(*EXPORT).exit_code == 0
    trainer = _created(fake)["spec"]["trainer"]
    assert jobs.BASE_MODEL_ID_FLAG not in trainer["args"]


@pytest.mark.parametrize(
    ("args", "source_args", "message"),
    [
        (
            ("--base-model-id", "org/m", "--merge-lora"),
            LORA_ARGS,
            "trnctl: --base-model-id: a merged model names no base model (only a PEFT adapter "
            "does); leave out --base-model-id or --merge-lora\n",
        ),
        (
            ("--base-model-id", "org/my model"),
            LORA_ARGS,
            "trnctl: --base-model-id 'org/my model': a model id has no spaces or control "
            "characters; give the hub id, e.g. meta-llama/Llama-3.2-1B\n",
        ),
        (
            ("--base-model-id", "org/m"),
            FULL_ARGS,
            "trnctl: --base-model-id: TrainJob 'ft-1' is not a LoRA fine-tune (its arguments "
            "have no --lora-rank); only an adapter names a base model, so leave it out\n",
        ),
    ],
)
def test_a_base_model_id_no_adapter_would_carry_is_refused_before_submitting(
    fake: FakeKube, trnctl: Any, args: tuple[str, ...], source_args: list[str], message: str
) -> None:
    _source(fake, source_args)

    run = trnctl(*EXPORT, *args)

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr == message
    assert not [r for r in fake.requests if r.method == "POST"]
