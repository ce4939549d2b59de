"""Scheduled fine-tuning pipelines: what one is (:class:`Pipeline`), its evaluation gate
(:class:`Gate`) and the Kubernetes CronJob that runs it (:func:`render_cronjob`).

A pipeline runs in the cluster, because the EKS API endpoint is private: a CronJob per pipeline
(``concurrencyPolicy: Forbid``, a starting deadline, history limits) starts a pod of the platform
image that runs ``trnctl pipeline tick`` (:mod:`trnctl.pipeline_run`) as a small controller under
the ``trn-pipelines`` ServiceAccount: Pod Identity gives it S3, SNS and (where the registry is
mirrored) SageMaker, and RBAC limits it to TrainJobs, pods, pod logs and events in the training
namespace (the workloads stack makes both). The pipeline's definition travels in the CronJob, as
an annotation (read by ``pipeline list`` and ``show``) and an environment variable of the
controller (read by the run), so that a CronJob that the ``TrainingPipeline`` construct renders in
CDK code is a whole pipeline too.

Kubernetes' documentation of CronJobs ("CronJob", concepts/workloads/controllers/cron-jobs) is
the source of the limits here: a CronJob name of at most 52 characters (the controller appends
11 to make each Job's name), five schedule fields (minute 0-59, hour 0-23, day of month 1-31,
month 1-12 or JAN-DEC, day of week 0-6 or SUN-SAT; ``*`` or ``?``, lists, ranges and ``/`` steps)
or one of the macros ``@yearly`` ``@annually`` ``@monthly`` ``@weekly`` ``@daily`` ``@midnight``
``@hourly``, and ``spec.timeZone`` rather than ``TZ=`` in the schedule.

Standard library only, besides trnctl's own modules (no kubernetes client, no torch).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from trn_catalog.outputs import EnvironmentOutputs
from trnctl import datasets, jobs, registry, versioning
from trnctl.errors import TrnctlError

API_VERSION = "batch/v1"
# The name the controller's pods run under: made, with its Pod Identity role and its RBAC, by the
# workloads stack (stacks/workloads_stack.py).
SERVICE_ACCOUNT = "trn-pipelines"
PIPELINE_LABEL = "trn-platform/pipeline"
SPEC_ANNOTATION = "trn-platform/pipeline-spec"
SPEC_ENV = "TRN_PIPELINE"
# The Job a pod belongs to: the label the Job controller puts on its pods (Kubernetes' "Jobs"
# page, "Job labels"), which stays the same when the Job retries its pod.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOB_ENV = "TRN_PIPELINE_JOB"
CONTAINER = "controller"
# The controller runs on the system node group, never on a trn node it would keep from training
# (the label constructs_lib._eks.SYSTEM_LABEL puts on those nodes).
SYSTEM_NODES = {"trn-platform/node-type": "system"}
# The CronJob's name is at most 52 characters; a run's TrainJobs are named
# <pipeline>-<8 hex run id>-<step> (step at most 9 characters: eval-base), which
# jobs.MAX_NAME bounds further.
MAX_NAME = jobs.MAX_NAME - len("-12345678-eval-base")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
# (field, lowest, highest, names for lowest.. in order)
_CRON_FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 6, _DAYS),
)
# Missed runs start within this many seconds of their time or not at all (a controller that was
# down for a day does not start last week's run); Kubernetes warns that below 10 a run may
# never start.
STARTING_DEADLINE_SECONDS = 600
HISTORY_LIMIT = 5
# A pod of a run that fails (a node drained under it) is retried this often; the run's record
# makes a retry resume, never train again.
BACKOFF_LIMIT = 3
# What the controller's pod asks for: it waits and calls APIs.
CONTROLLER_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "256Mi"},
    "limits": {"memory": "512Mi"},
}
DEFAULT_CAPACITY_WAIT_MINUTES = 60
MAX_CAPACITY_WAIT_MINUTES = 24 * 60


# --- the gate -------------------------------------------------------------------------------

# Metrics a gate may name, by the key `trn-train eval` prints them under: the loss of any data,
# accuracy and macro F1 of classification data (trainer/cli.py's eval help).
METRICS = {"eval_loss": "loss", "accuracy": "accuracy", "macro_f1": "macro_f1"}
_OPERATORS = ("<=", ">=", "<", ">")
_GATE = re.compile(
    r"^\s*(?P<metric>[a-z_0-9]+)\s*(?P<op><=|>=|<|>)\s*(?:(?P<current>current)\s*"
    r"(?:(?P<sign>[-+])\s*(?P<offset>[0-9]*\.?[0-9]+))?|(?P<value>[-+]?[0-9]*\.?[0-9]+))\s*$"
)
GATE_FORM = "METRIC OP current [+|- NUMBER] or METRIC OP NUMBER, e.g. 'eval_loss <= current - 0.01'"


@dataclass(frozen=True)
class Gate:
    """``METRIC OP current - 0.01`` (``offset`` -0.01) or ``METRIC OP 1.5`` (``value`` 1.5): the
    candidate's METRIC against the model in service's, or against a fixed number."""

    metric: str
    op: str
    offset: float = 0.0
    value: float | None = None

    @classmethod
    def parse(cls, text: str) -> Gate:
        """The gate ``text`` states.

        Raises:
            TrnctlError: USAGE naming ``--gate``, the text and the form, or the metrics allowed.
        """
        found = _GATE.match(text)
        if found is None:
            raise TrnctlError(f"--gate {text!r} is not {GATE_FORM}")
        metric = found["metric"]
        if metric not in METRICS:
            raise TrnctlError(
                f"--gate {text!r}: unknown metric {metric!r}; use {', '.join(METRICS)} "
                "(accuracy and macro_f1 of classification data)"
            )
        if found["value"] is not None:
            return cls(metric, found["op"], value=float(found["value"]))
        offset = float(found["offset"] or 0.0)
        return cls(metric, found["op"], -offset if found["sign"] == "-" else offset)

    @property
    def key(self) -> str:
        """The key of the metric in `trn-train eval`'s JSON line."""
        return METRICS[self.metric]

    def bound(self, current: float | None) -> float:
        """What the candidate's metric is compared with.

        Raises:
            ValueError: a gate on ``current`` without a current value.
        """
        if self.value is not None:
            return self.value
        if current is None:
            raise ValueError("the gate compares with the model in service, which has no value")
        return current + self.offset

    def holds(self, candidate: float, current: float | None) -> bool:
        """Whether ``candidate`` passes (a NaN never does)."""
        bound = self.bound(current)
        if math.isnan(candidate) or math.isnan(bound):
            return False
        return {
            "<=": candidate <= bound,
            ">=": candidate >= bound,
            "<": candidate < bound,
            ">": candidate > bound,
        }[self.op]

    def describe(self, candidate: float, current: float | None) -> str:
        """``eval_loss 1.6200 <= 1.7000 (current 1.7100 - 0.0100): holds``."""
        bound = self.bound(current)
        how = (
            f"current {current:.4f} {'-' if self.offset < 0 else '+'} {abs(self.offset):.4f}"
            if self.value is None and current is not None
            else "fixed"
        )
        verdict = "holds" if self.holds(candidate, current) else "fails"
        return f"{self.metric} {candidate:.4f} {self.op} {bound:.4f} ({how}): {verdict}"

    def __str__(self) -> str:
        if self.value is not None:
            return f"{self.metric} {self.op} {self.value:g}"
        if self.offset == 0:
            return f"{self.metric} {self.op} current"
        sign = "-" if self.offset < 0 else "+"
        return f"{self.metric} {self.op} current {sign} {abs(self.offset):g}"


# --- the schedule ---------------------------------------------------------------------------


def check_schedule(schedule: str) -> str:
    """``schedule`` when a CronJob takes it: five cron fields or a macro (see the module).

    Raises:
        TrnctlError: USAGE naming ``--schedule``, the field and what it allows.
    """
    text = schedule.strip()
    if text.upper().startswith(("TZ=", "CRON_TZ=")):
        raise TrnctlError(
            f"--schedule {schedule!r}: a time zone goes in --time-zone, not the schedule "
            "(Kubernetes refuses TZ= and CRON_TZ= there)"
        )
    if text.startswith("@"):
        if text not in MACROS:
            raise TrnctlError(f"--schedule {schedule!r}: use one of {', '.join(MACROS)}")
        return text
    parts = text.split()
    if len(parts) != len(_CRON_FIELDS):
        raise TrnctlError(
            f"--schedule {schedule!r} has {len(parts)} fields; a cron schedule has 5: minute "
            "hour day-of-month month day-of-week, e.g. '0 3 * * 1' (Mondays at 03:00)"
        )
    for part, (name, low, high, names) in zip(parts, _CRON_FIELDS, strict=True):
        for item in part.split(","):
            if not _cron_item(item, low, high, names):
                allowed = f"{low}-{high}" + (f" or {names[0]}-{names[-1]}" if names else "")
                raise TrnctlError(
                    f"--schedule {schedule!r}: {name} {part!r} is not a cron field of {allowed} "
                    "(*, ?, lists a,b, ranges a-b and steps /n)"
                )
    return " ".join(parts)


def _cron_value(text: str, low: int, high: int, names: tuple[str, ...]) -> int | None:
    upper = text.upper()
    if upper in names:
        return low + names.index(upper)
    if text.isdigit() and low <= int(text) <= high:
        return int(text)
    return None


def _cron_item(item: str, low: int, high: int, names: tuple[str, ...]) -> bool:
    span, slash, step = item.partition("/")
    if slash and not (step.isdigit() and int(step) >= 1):
        return False
    if span in ("*", "?"):
        return True
    first, dash, last = span.partition("-")
    start = _cron_value(first, low, high, names)
    if not dash:
        return start is not None
    end = _cron_value(last, low, high, names)
    return start is not None and end is not None and start <= end


# --- the pipeline ---------------------------------------------------------------------------

# The `trn-train run` settings a pipeline passes on (jobs.TrainingArgs' fields, less the data and
# the model, which the pipeline resolves at each run).
TRAINING_FIELDS = (
    "max_steps",
    "epochs",
    "seq_len",
    "seed",
    "lora_rank",
    "lora_alpha",
    "eval_every",
    "eval_batches",
    "checkpoint_every",
    "log_every",
)


@dataclass(frozen=True)
class Pipeline:
    """One scheduled fine-tune: every ``schedule`` (in ``time_zone``, default ``Etc/UTC``),
    train ``model`` (``models/BASE[@vN]``) on the newest version of ``data``
    (``datasets/NAME``), export, evaluate the candidate and the version of ``register_as``
    (default: the pipeline's name) in service (or, before there is one, the base model) on
    ``eval_data``, and register the candidate as ``models/<register_as>@vN``: promoted when the
    ``gate`` holds, else rejected. ``training`` holds the ``trn-train run`` settings
    (:data:`TRAINING_FIELDS`); ``nodes`` trn nodes (default 1); a run that finds no capacity for
    ``capacity_wait_minutes`` (default 60) is skipped.

    Raises:
        TrnctlError: USAGE, on construction, naming the option and the bad value.
    """

    name: str
    environment: str
    schedule: str
    model: str
    data: str
    eval_data: str
    gate: str
    register_as: str = ""
    time_zone: str = "Etc/UTC"
    nodes: int = 1
    capacity_wait_minutes: int = DEFAULT_CAPACITY_WAIT_MINUTES
    image: str = ""
    training: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.name)
        object.__setattr__(self, "schedule", check_schedule(self.schedule))
        registry.model_ref(self.model, "--model", bare=False)
        data = versioning.parse(self.data, versioning.DATASETS, "--data")
        if data is None or data.version is not None:
            raise TrnctlError(
                f"--data {self.data!r}: a pipeline trains on the newest version of a versioned "
                "dataset: datasets/NAME (staged with trnctl data stage DIR datasets/NAME)"
            )
        if versioning.parse(self.eval_data, versioning.DATASETS, "--eval-data") is None:
            raise TrnctlError(
                f"--eval-data {self.eval_data!r}: name a versioned dataset, datasets/NAME or "
                "datasets/NAME@vN"
            )
        Gate.parse(self.gate)
        if not self.register_as:
            object.__setattr__(self, "register_as", self.name)
        registry.model_ref(self.register_as, "--register-as")
        _check_range("--nodes", self.nodes, 1, jobs.MAX_ARGS)
        _check_range(
            "--capacity-wait-minutes", self.capacity_wait_minutes, 1, MAX_CAPACITY_WAIT_MINUTES
        )
        unknown = sorted(set(self.training) - set(TRAINING_FIELDS))
        if unknown:
            raise TrnctlError(f"training settings {unknown} are unknown; known: {TRAINING_FIELDS}")
        self.training_args("check")

    @property
    def data_ref(self) -> versioning.Ref:
        ref = versioning.parse(self.data, versioning.DATASETS, "--data")
        assert ref is not None  # __post_init__
        return ref

    @property
    def registered(self) -> versioning.Ref:
        """``models/<register_as>``, where candidates are registered."""
        return registry.model_ref(self.register_as, "--register-as")

    def gate_of(self) -> Gate:
        return Gate.parse(self.gate)

    def training_args(self, model: str, data: str = "datasets/check") -> jobs.TrainingArgs:
        """The run's ``trn-train run`` arguments for the resolved ``model`` (its path under
        ``models/``) and ``data``.

        Raises:
            TrnctlError: USAGE for settings trn-train would refuse (see jobs.TrainingArgs).
        """
        return jobs.TrainingArgs(None, data, model=model, **self.training)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Pipeline:
        """The pipeline a CronJob carries.

        Raises:
            TrnctlError: FAILED when ``text`` is no pipeline (a CronJob edited by hand).
        """
        try:
            raw = json.loads(text)
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in raw.items() if k in known})
        except (ValueError, TypeError) as error:
            raise TrnctlError(f"not a pipeline definition: {error}") from None


def check_name(name: str) -> str:
    """``name`` when it can name a pipeline: a DNS label of at most :data:`MAX_NAME` characters.

    Raises:
        TrnctlError: USAGE naming the rule.
    """
    if not _DNS_LABEL.match(name) or len(name) > MAX_NAME:
        raise TrnctlError(
            f"pipeline name {name!r} is not allowed: use lowercase letters, digits and '-', "
            f"starting and ending with a letter or digit, at most {MAX_NAME} characters (its "
            "runs' TrainJobs are named after it)"
        )
    return name


def _check_range(option: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise TrnctlError(f"{option} {value} is not allowed; use {low} to {high}")


def check_data_exists(s3: Any, bucket: str, pipeline: Pipeline) -> None:
    """Refuses a pipeline whose model, data or eval data is not staged yet: a run would fail.

    Raises:
        TrnctlError: NOT_FOUND with the stage command (see :func:`trnctl.datasets.resolve`,
            :func:`trnctl.registry.resolve`).
    """
    registry.resolve(s3, bucket, pipeline.model, pipeline.environment, "--model")
    datasets.resolve(s3, bucket, pipeline.data, pipeline.environment, "--data")
    datasets.resolve(s3, bucket, pipeline.eval_data, pipeline.environment, "--eval-data")


# --- the CronJob ------------------------------------------------------------------------------


def labels(pipeline: Pipeline) -> dict[str, str]:
    return {jobs.MANAGED_BY_LABEL: "trnctl", PIPELINE_LABEL: pipeline.name}


def render_cronjob(
    pipeline: Pipeline, outputs: EnvironmentOutputs, *, suspend: bool = False
) -> dict[str, Any]:
    """The CronJob that runs ``pipeline`` in the environment ``outputs`` describes (its
    namespace, and its image unless the pipeline names one); ``suspend`` (default False)
    creates it paused."""
    image = pipeline.image or outputs.image_uri
    spec_json = pipeline.to_json()
    controller = {
        "name": CONTAINER,
        "image": image,
        "command": ["python3", "-m", "trnctl"],
        "args": ["pipeline", "tick", pipeline.name, "--env", pipeline.environment],
        "env": [
            {"name": SPEC_ENV, "value": spec_json},
            {
                "name": JOB_ENV,
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_NAME_LABEL}']"}},
            },
            {"name": "AWS_REGION", "value": outputs.region},
            {"name": "HOME", "value": "/tmp"},
        ],
        "resources": CONTROLLER_RESOURCES,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    pod = {
        "metadata": {"labels": labels(pipeline)},
        "spec": {
            "serviceAccountName": SERVICE_ACCOUNT,
            "restartPolicy": "Never",
            "automountServiceAccountToken": True,
            "containers": [controller],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
            "nodeSelector": dict(SYSTEM_NODES),
        },
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "CronJob",
        "metadata": {
            "name": pipeline.name,
            "namespace": outputs.namespace,
            "labels": labels(pipeline),
            "annotations": {SPEC_ANNOTATION: spec_json},
        },
        "spec": {
            "schedule": pipeline.schedule,
            "timeZone": pipeline.time_zone,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": STARTING_DEADLINE_SECONDS,
            "successfulJobsHistoryLimit": HISTORY_LIMIT,
            "failedJobsHistoryLimit": HISTORY_LIMIT,
            "suspend": suspend,
            "jobTemplate": {
                "metadata": {"labels": labels(pipeline)},
                "spec": {"backoffLimit": BACKOFF_LIMIT, "template": pod},
            },
        },
    }


def manual_job(cronjob: dict[str, Any], name: str) -> dict[str, Any]:
    """The Job ``run-now`` creates from a CronJob's template, as ``kubectl create job --from
    cronjob/...`` does (the ``cronjob.kubernetes.io/instantiate: manual`` annotation)."""
    template = cronjob["spec"]["jobTemplate"]
    meta = cronjob["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": dict(template.get("metadata", {}).get("labels", {})),
            "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
        },
        "spec": template["spec"],
    }


def pipeline_of(cronjob: dict[str, Any]) -> Pipeline:
    """The pipeline a CronJob (as the API returns it) carries.

    Raises:
        TrnctlError: FAILED for a CronJob without a pipeline definition.
    """
    notes = (cronjob.get("metadata") or {}).get("annotations") or {}
    if SPEC_ANNOTATION not in notes:
        name = (cronjob.get("metadata") or {}).get("name")
        raise TrnctlError(f"CronJob {name} carries no pipeline ({SPEC_ANNOTATION})")
    return Pipeline.from_json(notes[SPEC_ANNOTATION])
