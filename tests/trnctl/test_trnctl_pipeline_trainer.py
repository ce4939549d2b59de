"""A pipeline's runs end to end with the real trainer: against moto (S3, SNS, SageMaker) and the
fake API server, whose stand-in pods run each TrainJob's own command with `trn-train` on CPU (a
tiny Llama, a few LoRA steps): training, export with the adapter merged, and `trn-train eval`
of the candidate and of the model in service, the pod mounts as local directories.

The data: the base model and its tokenizer staged with `trnctl model stage`; week 1 and week 2
prepared with `trn-train prepare-data` and staged with `trnctl data stage`. Week 1 and the eval
data are one word sequence, week 2 another: the week-1 candidate beats the base model and is
promoted; the week-2 candidate, trained on data unlike the eval data, loses to it and is
rejected. A run without new data is skipped; a run whose pod is killed during the export
resumes without training again."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
import test_trnctl_kube
from fake_kube import FakeKube
from test_trnctl_pipeline_run import (
    BUCKET,
    CHECKPOINTS,
    PIPELINE,
    SUPPORT,
    Killed,
    manifest,
    published,
    run,
)

from tests.trainer import hf_tiny
from trainer import cli
from trn_catalog import workspace as ws
from trnctl import pipeline_run, registry, versioning

fake = test_trnctl_kube.fake
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pipeline-trainer")]
# LoRA with a large alpha: a few steps at the LoRA learning rate move the tiny model's loss well
# past the gate's margin, where a full fine-tune at its default rate would barely move it.
LORA = replace(
    PIPELINE,
    training={"max_steps": 12, "seq_len": 16, "lora_rank": 4, "lora_alpha": 128.0},
)
# Flags the image's entrypoint would give on a trn node, here CPU and eager, by subcommand.
ON_CPU = {
    "run": ["--device", "cpu", "--compile", "none", "--no-progress"],
    "eval": ["--device", "cpu"],
}
WEEK_1 = [f"w{i}" for i in range(10, 42)]
WEEK_2 = [f"w{i}" for i in range(200, 232)]


class Pods:
    """The fake API server's nodes: a TrainJob the run creates is running until the controller
    next waits (its ``sleep``, :meth:`work`), when its pod runs the job's command (the image's
    entrypoint runs ``trn-train run`` with the args; an export or eval job names its ``python3
    -m trainer`` subcommand) with the trainer on CPU, the pod's mounts as local directories
    (``/datasets``: the datasets bucket as Mountpoint for S3 shows it; ``/fsx``: a directory
    whose ``checkpoints/`` the FSx data repository association exports to the checkpoints
    bucket); then the TrainJob is finished as the trainer exited, its pod's log what the trainer
    printed. The trainer runs in this process's main thread (it installs signal handlers), not
    in the API server's."""

    def __init__(self, state: FakeKube, root: Path) -> None:
        self.state = state
        self.mounts = {ws.DATASETS_MOUNT: root / "datasets", ws.FSX_MOUNT: root / "fsx"}
        self.queue: list[dict[str, Any]] = []
        self.ran: list[str] = []
        state.on_create = self.created

    def created(self, job: dict[str, Any]) -> None:
        self.state.statuses[job["metadata"]["name"]] = [{"conditions": []}]
        self.queue.append(job)

    def work(self, _seconds: float) -> None:
        while self.queue:
            self._run(self.queue.pop(0))

    def _run(self, job: dict[str, Any]) -> None:
        name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
        sub = trainer["command"][-1] if "command" in trainer else "run"
        self._mount_datasets()
        printed = io.StringIO()
        with redirect_stdout(printed):
            code = cli.main([sub, *map(self._local, trainer["args"]), *ON_CPU.get(sub, [])])
        self.ran.append(sub)
        self._export_fsx()
        finished = test_trnctl_kube._finished("Complete" if code == 0 else "Failed")
        self.state.statuses[name] = [finished]
        self.state.add_pod(name, 0, printed.getvalue())

    def _local(self, arg: str) -> str:
        for mount, local in self.mounts.items():
            if arg == mount or arg.startswith(f"{mount}/"):
                return str(local) + arg[len(mount) :]
        return arg

    def _mount_datasets(self) -> None:
        s3, local = boto3.client("s3"), self.mounts[ws.DATASETS_MOUNT]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            for item in page.get("Contents", []):
                path = local / item["Key"]
                if not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    s3.download_file(BUCKET, item["Key"], str(path))

    def _export_fsx(self) -> None:
        s3, root = boto3.client("s3"), self.mounts[ws.FSX_MOUNT] / "checkpoints"
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            s3.upload_file(str(path), CHECKPOINTS, str(path.relative_to(root)))


def _jsonl(path: Path, words: list[str], examples: int) -> Path:
    """``examples`` documents of ``words`` repeated, each starting at another word."""
    lines = []
    for i in range(examples):
        shifted = words[i % len(words) :] + words[: i % len(words)]
        lines.append(json.dumps({"text": " ".join(shifted * 2)}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _stage_data(trnctl: Any, model: Path, tmp: Path, name: str, words: list[str]) -> None:
    source = _jsonl(tmp / f"{name}.jsonl", words, 24)
    out = tmp / f"{name}-prepared"
    prepare = ["prepare-data", "--tokenizer", str(model), "--input", str(source)]
    assert cli.main([*prepare, "--seq-len", "16", "--out", str(out)]) == 0
    staged = trnctl("data", "stage", str(out), f"datasets/{name}", "--env", "trn-dev")
    assert staged.exit_code == 0, staged.stderr


@pytest.fixture
def env(fake: FakeKube, trnctl: Any, tmp_path: Path) -> dict[str, Any]:
    """trn-dev with its buckets, outputs parameter and alert topic (a queue subscribed to read
    what is published), a tiny Llama staged as models/llama, week 1 as datasets/tickets@v1 and
    the eval data as datasets/tickets-eval@v1."""
    from test_trnctl_aws import OUTPUTS

    s3 = boto3.client("s3")
    for bucket in (BUCKET, CHECKPOINTS):
        s3.create_bucket(
            Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-east-2"}
        )
    sns, sqs = boto3.client("sns"), boto3.client("sqs")
    topic = sns.create_topic(Name="trn-dev-alerts")["TopicArn"]
    queue = sqs.create_queue(QueueName="alerts")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn["QueueArn"])
    outputs = replace(OUTPUTS, alert_topic_arn=topic)
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs",
        Value=outputs.to_json(),
        Type="String",
        Overwrite=True,
    )
    model = hf_tiny.model_dir(tmp_path)
    assert trnctl("model", "stage", "--env", "trn-dev", str(model), "llama").exit_code == 0
    _stage_data(trnctl, model, tmp_path, "tickets", WEEK_1)
    _stage_data(trnctl, model, tmp_path, "tickets-eval", WEEK_1)
    return {
        "s3": s3,
        "outputs": outputs,
        "queue": queue,
        "pods": Pods(fake, tmp_path / "cluster"),
        "model": model,
        "tmp": tmp_path,
        "trnctl": trnctl,
    }


def test_better_is_promoted_worse_rejected_and_no_new_data_skipped(env: dict[str, Any]) -> None:
    work = env["pods"].work
    week1 = run(env, "support-29000000", LORA, sleep=work)
    week1_again = run(env, "support-29000060", LORA, sleep=work)
    _stage_data(env["trnctl"], env["model"], env["tmp"], "tickets", WEEK_2)
    week2 = run(env, "support-29010080", LORA, sleep=work)

    assert week1["status"] == "promoted", week1["reason"]
    candidate, base = week1["evaluation"]["candidate"], week1["evaluation"]["current"]
    assert base["model"] == "models/llama/v1"
    assert candidate["loss"] < base["loss"] - 0.01
    assert week1_again["status"] == "skipped"
    assert week1_again["reason"].startswith("no new data: datasets/tickets@v1")
    assert week2["status"] == "rejected", week2["reason"]
    served = week2["evaluation"]["current"]
    assert served["model"] == "models/support/v1"
    assert served["loss"] == pytest.approx(candidate["loss"], rel=1e-4)
    assert week2["evaluation"]["candidate"]["loss"] > served["loss"]
    assert env["pods"].ran == ["run", "export", "eval", "eval"] * 2
    assert manifest(env["s3"], 1)["status"] == "promoted"
    assert manifest(env["s3"], 2)["status"] == "rejected"
    assert registry.resolve(env["s3"], BUCKET, "models/support", "trn-dev").path == (
        "models/support/v1"
    )
    (message,) = published(env)  # the rejection; a run without new data is not news
    assert message["Subject"].endswith(f"run {week2['run']} rejected")


def test_a_run_killed_during_the_export_resumes_without_training_again(
    env: dict[str, Any],
) -> None:
    polls = iter(range(100))

    def killed_in_the_export(seconds: float) -> None:
        if next(polls) == 1:  # each TrainJob is waited for once: the export's wait
            raise Killed
        env["pods"].work(seconds)

    with pytest.raises(Killed):
        run(env, "support-29000000", LORA, sleep=killed_in_the_export)
    record = run(env, "support-29000000", LORA, sleep=env["pods"].work)

    assert record["status"] == "promoted", record["reason"]
    assert env["pods"].ran == ["run", "export", "eval", "eval"]
    assert set(versioning.records(env["s3"], BUCKET, SUPPORT)) == {1}
    rid = pipeline_run.run_id("support-29000000")
    assert manifest(env["s3"], 1)["lineage"]["job"] == f"support-{rid}-train"
