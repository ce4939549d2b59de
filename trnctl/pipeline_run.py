"""One run of a pipeline (``trnctl pipeline tick``, what its CronJob's pod runs).

The steps, each recorded in the run's record ``pipelines/<pipeline>/runs/<run>.json`` in the
datasets bucket (and as a Kubernetes event on the pipeline's CronJob) before the next begins:

1. resolve the newest dataset version; the version the last trained run used again: record
   ``skipped: no new data`` and stop;
2. train: a TrainJob like ``job submit --model``'s, named after the run; one whose pods find no
   trn capacity for the pipeline's wait is deleted, and the run ``skipped: no capacity``;
3. export it (``trn-train export``, as ``job export``);
4. evaluate the candidate (the export) and the model in service (before there is one: the base
   model) on the same eval data with ``trn-train eval``, each as a one-node TrainJob whose log's
   last JSON line is the result;
5. register the candidate (``model register``: a copy of the export, once FSx has exported it to
   S3) with its lineage and both evaluations, and promote it when the gate holds, else reject it;
6. publish a rejection, a skip for capacity or a failure to the environment's alert topic (SNS).

The run is the CronJob's Job (:data:`trnctl.pipelines.JOB_ENV`): a pod the Job retries resumes
the same run from its record, and every TrainJob has a name derived from the run, so that a
retried run finds its TrainJob instead of training twice.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from trn_catalog.outputs import EnvironmentOutputs
from trnctl import datasets, jobs, registry, sagemaker_registry, transfer, versioning
from trnctl.errors import ExitCode, TrnctlError
from trnctl.pipelines import Pipeline

RUNS = "runs"
# Final states of a run.
PROMOTED, REJECTED, SKIPPED, FAILED = "promoted", "rejected", "skipped", "failed"
FINAL = (PROMOTED, REJECTED, SKIPPED, FAILED)
TRAINED = (PROMOTED, REJECTED)
EVAL_COMMAND = ("python3", "-m", "trainer", "eval")
# How long an export may take to appear in S3 after its TrainJob finished (FSx exports changed
# files to the linked bucket asynchronously).
EXPORT_SYNC_S = 1800


def run_id(job_name: str) -> str:
    """Eight hex digits naming the run of the Job ``job_name`` (the same for each of its pods)."""
    return hashlib.sha256(job_name.encode()).hexdigest()[:8]


def runs_prefix(pipeline: str) -> str:
    return f"pipelines/{pipeline}/{RUNS}/"


def record_key(pipeline: str, run: str) -> str:
    return f"{runs_prefix(pipeline)}{run}.json"


def history(s3: Any, bucket: str, pipeline: str) -> list[dict[str, Any]]:
    """Every run record of ``pipeline``, oldest first (by start time).

    Raises:
        botocore.exceptions.ClientError: S3 refused a call.
    """
    found = []
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=runs_prefix(pipeline)
    )
    for page in pages:
        for item in page.get("Contents", []):
            got = versioning.get_json(s3, bucket, item["Key"])
            if got is not None:
                found.append(got[0])
    return sorted(found, key=lambda r: (str(r.get("started_at", "")), str(r.get("run", ""))))


@dataclass
class Services:
    """What a run talks to: S3, the training namespace's TrainJobs (:class:`trnctl.kube.Cluster`),
    its events (:class:`trnctl.kube.CronJobs`), SNS and (None unless the registry is mirrored)
    SageMaker; and how it waits (``sleep``, ``clock``, ``poll`` seconds between checks)."""

    s3: Any
    cluster: Any
    events: Any
    sns: Any
    sagemaker: Any | None = None
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    poll: float = 30.0


class Stop(Exception):
    """The run ends here with ``status`` (skipped or failed) for ``reason``, published to the
    alert topic unless ``publish`` is False (default True): a week without new data is the
    usual case, not news."""

    def __init__(self, status: str, reason: str, *, publish: bool = True) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.publish = publish


@dataclass
class Run:
    """One run of ``pipeline`` in ``outputs``' environment, as the Job ``job`` (its id
    :func:`run_id`)."""

    pipeline: Pipeline
    outputs: EnvironmentOutputs
    job: str
    services: Services
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return run_id(self.job)

    @property
    def bucket(self) -> str:
        return self.outputs.datasets_bucket

    def name(self, step: str) -> str:
        """The TrainJob of ``step`` in this run: ``<pipeline>-<run>-<step>``."""
        return jobs.validate_name(f"{self.pipeline.name}-{self.id}-{step}")

    # --- the record ---------------------------------------------------------------------

    def load(self) -> None:
        found = versioning.get_json(self.services.s3, self.bucket, self._key)
        self.record = (
            found[0]
            if found is not None
            else {
                "pipeline": self.pipeline.name,
                "run": self.id,
                "job": self.job,
                "started_at": versioning.now(),
                "status": "running",
                "steps": [],
            }
        )

    @property
    def _key(self) -> str:
        return record_key(self.pipeline.name, self.id)

    def step(self, step: str, detail: str, **fields: Any) -> None:
        """Records ``step`` (and ``fields`` in the record), in S3 and as an event."""
        self.record.setdefault("steps", []).append(
            {"step": step, "detail": detail, "at": versioning.now()}
        )
        self.record.update(fields)
        versioning.put_json(self.services.s3, self.bucket, self._key, self.record)
        self._event(step, detail)

    def _event(self, step: str, detail: str) -> None:
        warning = step in (REJECTED, SKIPPED, FAILED)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.services.events.event(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "generateName": f"{self.pipeline.name}.",
                    "namespace": self.outputs.namespace,
                },
                "involvedObject": {
                    "apiVersion": "batch/v1",
                    "kind": "CronJob",
                    "name": self.pipeline.name,
                    "namespace": self.outputs.namespace,
                },
                "reason": f"Pipeline{step.title().replace('-', '')}",
                "message": f"run {self.id}: {detail}"[:1024],
                "type": "Warning" if warning else "Normal",
                "source": {"component": "trnctl-pipeline"},
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
        )

    def done(self, step: str) -> bool:
        return any(s.get("step") == step for s in self.record.get("steps", []))

    # --- the run ------------------------------------------------------------------------

    def execute(self) -> dict[str, Any]:
        """Runs (or resumes) the run to its end; returns its record. A run already finished
        returns its record unchanged.

        Raises:
            botocore.exceptions.ClientError, TrnctlError: what a call refused beyond the run's
                own failures (those end the run ``failed``, recorded and published).
        """
        self.load()
        if self.record.get("status") in FINAL:
            return self.record
        try:
            self._steps()
        except Stop as stop:
            self.finish(stop.status, stop.reason, publish=stop.publish)
        except TrnctlError as error:
            self.finish(FAILED, str(error))
        return self.record

    def finish(self, status: str, reason: str, *, publish: bool = True) -> None:
        """Records the run's end with ``status`` and ``reason``, and publishes it unless it
        was promoted or ``publish`` is False."""
        self.step(status, reason, status=status, reason=reason, finished_at=versioning.now())
        if publish and status != PROMOTED:
            self._publish(status, reason)

    def _publish(self, status: str, reason: str) -> None:
        topic = self.outputs.alert_topic_arn
        if not topic:
            return
        subject = f"trn-platform pipeline {self.pipeline.name}: run {self.id} {status}"
        self.services.sns.publish(
            TopicArn=topic,
            Subject=subject[:100],
            Message=json.dumps(self.record, indent=1, sort_keys=True),
        )

    def _steps(self) -> None:
        data = self._data()
        train = self._train(data)
        export = self._export(train)
        candidate, current = self._evaluate(export)
        self._decide(train, export, self._metric(candidate), self._metric(current))

    def _data(self) -> datasets.ResolvedData:
        s3, pipeline = self.services.s3, self.pipeline
        if "data" in self.record:
            return datasets.resolve(s3, self.bucket, self.record["data"], pipeline.environment)
        data = datasets.resolve(s3, self.bucket, pipeline.data, pipeline.environment)
        assert data.version is not None  # the pipeline names a versioned dataset
        trained = [
            r.get("data")
            for r in history(s3, self.bucket, pipeline.name)
            if r.get("status") in TRAINED
        ]
        if trained and trained[-1] == str(data.version):
            raise Stop(
                SKIPPED,
                f"no new data: {data.version} is what the last run trained on",
                publish=False,
            )
        self.step("data", f"training on {data.version}", data=str(data.version))
        return data

    def _train(self, data: datasets.ResolvedData) -> str:
        name = self.name("train")
        if self.done("trained"):
            return name
        if self.services.cluster.find(name) is None:
            self.services.cluster.create(self._train_job(name, data))
            self.step("train", f"TrainJob {name} submitted", train_job=name)
        self._wait(name, capacity=True)
        self.step("trained", f"TrainJob {name} complete")
        return name

    def _train_job(self, name: str, data: datasets.ResolvedData) -> dict[str, Any]:
        s3, pipeline = self.services.s3, self.pipeline
        base = registry.resolve(s3, self.bucket, pipeline.model, pipeline.environment)
        args = pipeline.training_args(base.path.removeprefix(f"{versioning.MODELS}/"), data.path)
        notes = {jobs.DATA_ANNOTATION: data.path, jobs.MODEL_VERSION_ANNOTATION: base.path}
        if data.manifest_sha256:
            notes[jobs.DATA_SHA256_ANNOTATION] = data.manifest_sha256
        return jobs.render(
            name=name,
            outputs=self.outputs,
            nodes=pipeline.nodes,
            args=args.argv(name),
            image=pipeline.image or None,
            labels={
                jobs.MODEL_LABEL: base.path.split("/")[1],
                "trn-platform/pipeline": pipeline.name,
            },
            annotations=notes,
        )

    def _export(self, train: str) -> str:
        name = self.name("export")
        if not self.done("exported"):
            if self.services.cluster.find(name) is None:
                job = jobs.render_export(
                    job_name=train,
                    export=name,
                    outputs=self.outputs,
                    image=self.pipeline.image or None,
                    merge_lora=self.pipeline.training.get("lora_rank") is not None,
                )
                self.services.cluster.create(job)
            self._wait(name)
            self.step("exported", f"{jobs.export_dir(train, name)}", export=name)
        return name

    def _evaluate(self, export: str) -> tuple[dict[str, Any], dict[str, Any]]:
        if "evaluation" in self.record:
            found = self.record["evaluation"]
            return dict(found["candidate"]), dict(found["current"])
        s3, pipeline = self.services.s3, self.pipeline
        eval_data = datasets.resolve(s3, self.bucket, pipeline.eval_data, pipeline.environment)
        current = self._current()
        train = self.name("train")
        candidate_dir = jobs.export_dir(train, export)
        got = self._eval("eval-new", ["--model", candidate_dir], eval_data)
        base = self._eval("eval-base", ["--model", f"/datasets/{current}"], eval_data)
        served: dict[str, Any] = {**base, "model": current}
        evaluation = {
            "eval_data": str(eval_data.version or eval_data.path),
            "candidate": got,
            "current": served,
        }
        detail = f"candidate loss {got['loss']:.4f}, {current} loss {base['loss']:.4f}"
        self.step("evaluated", detail, evaluation=evaluation)
        return got, served

    def _current(self) -> str:
        """The path of the model the candidate must beat: the version of ``register_as`` in
        service, else the base model."""
        s3, pipeline = self.services.s3, self.pipeline
        found = versioning.records(s3, self.bucket, pipeline.registered)
        serving = registry.in_service(found)
        if serving is not None:
            return pipeline.registered.at(serving).path
        return registry.resolve(s3, self.bucket, pipeline.model, pipeline.environment).path

    def _eval(self, step: str, source: list[str], data: datasets.ResolvedData) -> dict[str, Any]:
        name = self.name(step)
        if self.services.cluster.find(name) is None:
            job = jobs.render(
                name=name,
                outputs=self.outputs,
                nodes=1,
                args=[*source, "--data", f"/datasets/{data.path}", "--split", "all"],
                image=self.pipeline.image or None,
                command=EVAL_COMMAND,
                labels={jobs.PURPOSE_LABEL: "eval", "trn-platform/pipeline": self.pipeline.name},
            )
            self.services.cluster.create(job)
        self._wait(name)
        return self._result(name)

    def _result(self, name: str) -> dict[str, Any]:
        """The last JSON line of the eval TrainJob's pod log: ``{"loss": ...}``.

        Raises:
            TrnctlError: FAILED when the log has none.
        """
        for pod in self.services.cluster.pods(name):
            for line in reversed(self.services.cluster.log(pod.metadata.name).splitlines()):
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if isinstance(value, dict) and isinstance(value.get("loss"), (int, float)):
                    return value
        raise TrnctlError(f"TrainJob {name} printed no trn-train eval result", ExitCode.FAILED)

    def _metric(self, result: dict[str, Any]) -> float:
        """The gate's metric in one `trn-train eval` result.

        Raises:
            Stop: FAILED when the result has no such metric (accuracy of data that is not
                classification data).
        """
        gate = self.pipeline.gate_of()
        value = result.get(gate.key)
        if not isinstance(value, (int, float)):
            raise Stop(
                FAILED,
                f"the gate needs {gate.metric}, which trn-train eval did not report for "
                f"{self.pipeline.eval_data} (it reports accuracy and macro_f1 of classification "
                "data only)",
            )
        return float(value)

    def _decide(self, train: str, export: str, candidate: float, current: float) -> None:
        gate = self.pipeline.gate_of()
        verdict = gate.describe(candidate, current)
        version = self._register(train, export)
        ref = self.pipeline.registered.at(version)
        by = f"pipeline {self.pipeline.name} (run {self.id})"
        s3 = self.services.s3
        if gate.holds(candidate, current):
            status = PROMOTED
            record = registry.set_status(s3, self.bucket, ref, PROMOTED, by, verdict)
        else:
            status = REJECTED
            record = registry.set_status(s3, self.bucket, ref, REJECTED, by, verdict)
        sagemaker_registry.mirror(
            self.services.sagemaker, s3, self.outputs.environment, self.bucket, ref, record
        )
        raise_final = f"{ref}: {verdict}"
        self.finish(status, raise_final)

    def _register(self, train: str, export: str) -> int:
        if "candidate" in self.record:
            parsed = registry.model_ref(self.record["candidate"], "candidate")
            return parsed.number
        s3 = self.services.s3
        where = transfer.S3Prefix(self.outputs.checkpoints_bucket, f"{train}/export/{export}/")
        self._wait_for_export(where)
        lineage = jobs.lineage(self.services.cluster.get(train))
        staged = registry.register_export(
            s3,
            self.bucket,
            self.pipeline.registered,
            where,
            by=f"pipeline {self.pipeline.name} (run {self.id})",
            lineage=lineage,
            reason=f"trained by pipeline {self.pipeline.name}, run {self.id}",
        )
        evaluation = self.record["evaluation"]
        registry.update(
            s3, self.bucket, staged.version, lambda found: {**found, "evaluation": evaluation}
        )
        self.step("registered", f"{staged.version} from {where}", candidate=str(staged.version))
        return staged.version.number

    def _wait_for_export(self, where: transfer.S3Prefix) -> None:
        start = self.services.clock()
        marker = where.key("config.json")
        while transfer.head(self.services.s3, where.bucket, marker) is None:
            if self.services.clock() - start > EXPORT_SYNC_S:
                raise Stop(
                    FAILED,
                    f"the export is not in {where} after {EXPORT_SYNC_S} s: is the FSx data "
                    "repository association exporting /fsx/checkpoints?",
                )
            self.services.sleep(self.services.poll)

    def _wait(self, name: str, *, capacity: bool = False) -> None:
        """Until the TrainJob ``name`` completes. With ``capacity``: a job none of whose pods
        runs after the pipeline's capacity wait is deleted and the run skipped.

        Raises:
            Stop: FAILED when it failed; SKIPPED for no capacity.
        """
        start = self.services.clock()
        limit = self.pipeline.capacity_wait_minutes * 60
        while True:
            job = self.services.cluster.get(name)
            result = jobs.outcome(job)
            if result == "Complete":
                return
            if result == "Failed":
                reason = next(
                    (c.message for c in jobs.conditions(job) if c.type == "Failed"), "failed"
                )
                raise Stop(FAILED, f"TrainJob {name} failed: {reason}")
            if capacity and self.services.clock() - start > limit and not self._running(name):
                self.services.cluster.delete(name)
                raise Stop(
                    SKIPPED,
                    f"no capacity: TrainJob {name}'s pods found no free trn node in "
                    f"{self.pipeline.capacity_wait_minutes} minutes",
                )
            self.services.sleep(self.services.poll)

    def _running(self, name: str) -> bool:
        pods = self.services.cluster.pods(name)
        return any(
            p.status is not None and p.status.phase in ("Running", "Succeeded") for p in pods
        )
