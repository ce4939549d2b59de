"""Scheduled fine-tuning pipelines: what one is (:class:`Pipeline`), its evaluation gate
(:class:`Gate`) and the Kubernetes CronJob that runs it (:func:`render_cronjob`), shared by
``trnctl pipeline create`` and the ``TrainingPipeline`` construct so that both make the same
objects from the same checks.

A pipeline runs in the cluster, because the EKS API endpoint is private: a CronJob per pipeline
(``concurrencyPolicy: Forbid``, a starting deadline, history limits) starts a pod of the platform
image that runs ``trnctl pipeline tick`` (``trnctl.pipeline_run``) as a small controller under
the ``trn-pipelines`` ServiceAccount: Pod Identity gives it S3, SNS and (where the registry is
mirrored) SageMaker, and RBAC limits it to TrainJobs, pods, pod logs and events in the training
namespace (``constructs_lib.pipeline.PipelineAccess`` makes both). The pipeline's definition
travels in the CronJob, as an annotation (read by ``pipeline list`` and ``show``) and an
environment variable of the controller (read by the run), so that a CronJob made in CDK code is a
whole pipeline too.

Kubernetes' documentation of CronJobs ("CronJob", concepts/workloads/controllers/cron-jobs) is
the source of the limits here: a CronJob name of at most 52 characters (the controller appends
11 to make each Job's name), five schedule fields (minute 0-59, hour 0-23, day of month 1-31,
month 1-12 or JAN-DEC, day of week 0-6 or SUN-SAT; ``*`` or ``?``, lists, ranges and ``/`` steps)
or one of the macros ``@yearly`` ``@annually`` ``@monthly`` ``@weekly`` ``@daily`` ``@midnight``
``@hourly``, and ``spec.timeZone`` rather than ``TZ=`` in the schedule.

Every refusal is a :class:`trn_catalog.settings.SettingError` naming the setting by its field
(``eval_data``), which the CLI shows as its option (``--eval-data``). Standard library only.
"""

from __future__ import annotations

import functools
import json
import math
import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Self

from trn_catalog import refs
from trn_catalog import workspace as ws
from trn_catalog.settings import Name, SettingError

API_VERSION = "batch/v1"
# The name the controller's pods run under (constructs_lib.pipeline.PipelineAccess makes it).
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
SYSTEM_NODES = {ws.NODE_TYPE_LABEL: "system"}
# The CronJob's name is at most 52 characters; a run's TrainJobs are named
# <pipeline>-<8 hex run id>-<step> (step at most 9 characters: eval-base), which
# ws.TRAINJOB_MAX_NAME bounds further.
MAX_NAME = ws.TRAINJOB_MAX_NAME - len("-12345678-eval-base")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_TZ_PART = re.compile(r"[A-Za-z.\-_0-9+]{1,14}")
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
# A bound against typing mistakes rather than a limit of the platform: two full Capacity Blocks
# (64 instances each, platform facts).
MAX_NODES = 128
DEFAULT_TIME_ZONE = "Etc/UTC"


# --- the gate -------------------------------------------------------------------------------

# Metrics a gate may name, by the key `trn-train eval` prints them under: the loss of any data,
# accuracy and macro F1 of classification data (trainer/cli.py's eval help).
METRICS = {"eval_loss": "loss", "accuracy": "accuracy", "macro_f1": "macro_f1"}
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
    def parse(cls, text: str) -> Self:
        """The gate ``text`` states.

        Raises:
            SettingError: naming ``gate``, the text and the form, or the metrics allowed.
        """
        found = _GATE.match(text) if isinstance(text, str) else None
        if found is None:
            raise SettingError(Name("gate"), f" {text!r} is not {GATE_FORM}")
        metric = found["metric"]
        if metric not in METRICS:
            raise SettingError(
                Name("gate"),
                f" {text!r}: unknown metric {metric!r}; use {', '.join(METRICS)} "
                "(accuracy and macro_f1 of classification data)",
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


# --- the schedule and the time zone ---------------------------------------------------------


def check_schedule(schedule: str) -> str:
    """``schedule`` when a CronJob takes it (five cron fields or a macro, see the module), its
    fields joined by single spaces.

    Raises:
        SettingError: naming ``schedule``, the field and what it allows.
    """
    if not isinstance(schedule, str):
        raise SettingError(Name("schedule"), f" {schedule!r} is not text, e.g. '0 3 * * 1'")
    text = schedule.strip()
    if text.upper().startswith(("TZ=", "CRON_TZ=")):
        raise SettingError(
            Name("schedule"),
            f" {schedule!r}: a time zone goes in ",
            Name("time_zone"),
            ", not the schedule (Kubernetes refuses TZ= and CRON_TZ= there)",
        )
    if text.startswith("@"):
        if text not in MACROS:
            raise SettingError(Name("schedule"), f" {schedule!r}: use one of {', '.join(MACROS)}")
        return text
    parts = text.split()
    if len(parts) != len(_CRON_FIELDS):
        raise SettingError(
            Name("schedule"),
            f" {schedule!r} has {len(parts)} fields; a cron schedule has 5: minute "
            "hour day-of-month month day-of-week, e.g. '0 3 * * 1' (Mondays at 03:00)",
        )
    for part, (name, low, high, names) in zip(parts, _CRON_FIELDS, strict=True):
        if not all(_cron_item(item, low, high, names) for item in part.split(",")):
            allowed = f"{low}-{high}" + (f" or {names[0]}-{names[-1]}" if names else "")
            raise SettingError(
                Name("schedule"),
                f" {schedule!r}: {name} {part!r} is not a cron field of {allowed} "
                "(*, ?, lists a,b, ranges a-b and steps /n)",
            )
    return " ".join(parts)


def _whole(text: str) -> bool:
    """Whether ``text`` is a number as the API server's cron parser reads one (robfig/cron v3's
    strconv.Atoi): ASCII digits only, where str.isdigit also takes other scripts' digits and
    superscripts, which int() then reads or refuses."""
    return text.isascii() and text.isdigit()


def _cron_value(text: str, low: int, high: int, names: tuple[str, ...]) -> int | None:
    upper = text.upper()
    if upper in names:
        return low + names.index(upper)
    if _whole(text) and low <= int(text) <= high:
        return int(text)
    return None


def _cron_item(item: str, low: int, high: int, names: tuple[str, ...]) -> bool:
    span, slash, step = item.partition("/")
    if slash and not (_whole(step) and int(step) >= 1):
        return False
    if span in ("*", "?"):
        return True
    first, dash, last = span.partition("-")
    start = _cron_value(first, low, high, names)
    if not dash:
        return start is not None
    end = _cron_value(last, low, high, names)
    return start is not None and end is not None and start <= end


def check_time_zone(time_zone: str) -> str:
    """``time_zone`` when the Kubernetes API server takes it as ``spec.timeZone``
    (kubernetes/kubernetes ``pkg/apis/batch/validation``: each ``/``-separated part of 1 to 14
    letters, digits, ``.``, ``-``, ``_`` or ``+``, none ``.`` or ``..`` or starting with ``-``;
    not ``Local``; a zone of the time zone database) and the IANA database Python reads has it.
    Where Python finds no time zone data (an image without tzdata) only the form is checked, so
    that the controller can still read its pipeline.

    Raises:
        SettingError: naming ``time_zone`` and the form.
    """
    parts = time_zone.split("/") if isinstance(time_zone, str) else [""]
    known = _known_time_zones()
    if (
        not all(_TZ_PART.fullmatch(p) and p not in (".", "..") and p[0] != "-" for p in parts)
        or time_zone.lower() == "local"
        or (known and time_zone not in known)
    ):
        raise SettingError(
            Name("time_zone"),
            f" {time_zone!r} is not an IANA time zone name, e.g. Etc/UTC or Europe/Berlin",
        )
    return time_zone


@functools.cache
def _known_time_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


# --- the training settings ------------------------------------------------------------------

# The `trn-train run` settings a pipeline passes on (trnctl's TrainingArgs fields, less the data
# and the model, which the pipeline resolves at each run), each with the lowest value trn-train
# takes (training_image/trainer/config.py: 0 means "the default" for seq_len, "count steps" for
# epochs, "never" for the intervals); seed takes any whole number, lora_alpha any number above 0.
TRAINING_LOWEST: Mapping[str, int | None] = {
    "max_steps": 1,
    "epochs": 0,
    "seq_len": 0,
    "seed": None,
    "lora_rank": 1,
    "lora_alpha": None,
    "eval_every": 0,
    "eval_batches": 1,
    "checkpoint_every": 0,
    "log_every": 1,
}
TRAINING_FIELDS = tuple(TRAINING_LOWEST)


def check_training(settings: Mapping[str, Any]) -> None:
    """Refuses ``trn-train run`` settings (:data:`TRAINING_FIELDS`, None for unset) that
    trn-train would refuse: an unknown one, a value of the wrong kind or below its lowest
    (:data:`TRAINING_LOWEST`), ``max_steps`` with ``epochs``, ``lora_alpha`` without
    ``lora_rank``.

    Raises:
        SettingError: naming the setting, its value and what is allowed.
    """
    unknown = sorted(set(settings) - set(TRAINING_FIELDS))
    if unknown:
        raise SettingError(Name("training"), f" {unknown} are unknown; known: {TRAINING_FIELDS}")
    given = {k: v for k, v in settings.items() if v is not None}
    for key, value in given.items():
        _check_training_value(key, value)
    if "max_steps" in given and "epochs" in given:
        raise SettingError(
            Name("max_steps"),
            " and ",
            Name("epochs"),
            " exclude each other: ",
            Name("epochs"),
            " derives the steps from the data; give one",
        )
    if "lora_alpha" in given and "lora_rank" not in given:
        raise SettingError(Name("lora_alpha"), " needs ", Name("lora_rank"))


def _check_training_value(key: str, value: Any) -> None:
    if key == "lora_alpha":
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and 0 < value < math.inf):
            shown = f"{value:g}" if number else repr(value)
            raise SettingError(Name(key), f" {shown} is not allowed; use a number above 0")
        return
    lowest = TRAINING_LOWEST[key]
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not whole:
        bound = f" of {lowest} or more" if lowest is not None else ""
        raise SettingError(Name(key), f" {value!r} is not allowed; use a whole number{bound}")
    if lowest is not None and value < lowest:
        raise SettingError(Name(key), f" {value!r} is not allowed; use {lowest} or more")


# --- the pipeline ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pipeline:
    """One scheduled fine-tune: every ``schedule`` (in ``time_zone``, default ``Etc/UTC``),
    train ``model`` (``models/BASE[@vN]``) on the newest version of ``data``
    (``datasets/NAME``), export, evaluate the candidate and the version of ``register_as``
    (default: the pipeline's name) in service (or, before there is one, the base model) on
    ``eval_data``, and register the candidate as ``models/<register_as>@vN``: promoted when the
    ``gate`` holds, else rejected. ``training`` holds the ``trn-train run`` settings
    (:data:`TRAINING_FIELDS`, default none); ``nodes`` trn nodes (default 1); a run that finds no
    capacity for ``capacity_wait_minutes`` (default 60) is skipped; ``image`` (default: the
    environment's) runs the controller and the run's jobs.

    Raises:
        SettingError: on construction, naming the field, the bad value and what is allowed.
    """

    name: str
    environment: str
    schedule: str
    model: str
    data: str
    eval_data: str
    gate: str
    register_as: str = ""
    time_zone: str = DEFAULT_TIME_ZONE
    nodes: int = 1
    capacity_wait_minutes: int = DEFAULT_CAPACITY_WAIT_MINUTES
    image: str = ""
    training: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.name)
        check_environment(self.environment)
        object.__setattr__(self, "schedule", check_schedule(self.schedule))
        refs.split_model(_text("model", self.model), "model", bare=False)
        self._check_data()
        Gate.parse(self.gate)
        if not self.register_as:
            object.__setattr__(self, "register_as", self.name)
        refs.split_model(_text("register_as", self.register_as), "register_as")
        check_time_zone(self.time_zone)
        _check_range("nodes", self.nodes, 1, MAX_NODES)
        _check_range(
            "capacity_wait_minutes", self.capacity_wait_minutes, 1, MAX_CAPACITY_WAIT_MINUTES
        )
        if not isinstance(self.image, str) or any(c.isspace() for c in self.image):
            raise SettingError(Name("image"), f" {self.image!r} is not an image reference")
        if not isinstance(self.training, dict):
            raise SettingError(Name("training"), f" {self.training!r} is not a mapping")
        check_training(self.training)

    def _check_data(self) -> None:
        data = refs.split(_text("data", self.data), refs.DATASETS, "data")
        if data is None or data[1] is not None:
            raise SettingError(
                Name("data"),
                f" {self.data!r}: a pipeline trains on the newest version of a versioned "
                "dataset: datasets/NAME (staged with trnctl data stage DIR datasets/NAME)",
            )
        if refs.split(_text("eval_data", self.eval_data), refs.DATASETS, "eval_data") is None:
            raise SettingError(
                Name("eval_data"),
                f" {self.eval_data!r}: name a versioned dataset, datasets/NAME or datasets/NAME@vN",
            )

    def gate_of(self) -> Gate:
        return Gate.parse(self.gate)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Self:
        """The pipeline of the JSON ``text`` (:meth:`to_json`; unknown keys left out).

        Raises:
            ValueError: ``text`` is not a JSON object, or lacks a field.
            SettingError: a field's value is refused.
        """
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in raw.items() if k in known})
        except TypeError as error:
            raise ValueError(str(error)) from None


def _text(setting: str, value: Any) -> str:
    if not isinstance(value, str):
        raise SettingError(Name(setting), f" {value!r} is not text")
    return value


def check_name(name: str) -> str:
    """``name`` when it can name a pipeline: a DNS label of at most :data:`MAX_NAME` characters.

    Raises:
        SettingError: naming ``name`` and the rule.
    """
    if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name) or len(name) > MAX_NAME:
        raise SettingError(
            Name("name"),
            f" {name!r} is not allowed: use lowercase letters, digits and '-', "
            f"starting and ending with a letter or digit, at most {MAX_NAME} characters (its "
            "runs' TrainJobs are named after it)",
        )
    return name


def check_environment(environment: str) -> str:
    """``environment`` when it can name an environment (``trn-dev``, ``trn-pv-<project>``): a
    DNS label.

    Raises:
        SettingError: naming ``environment`` and the rule.
    """
    if not isinstance(environment, str) or not _DNS_LABEL.fullmatch(environment):
        raise SettingError(
            Name("environment"),
            f" {environment!r} is not allowed: use lowercase letters, digits and '-', starting and "
            "ending with a letter or digit, at most 63 characters",
        )
    return environment


def _check_range(setting: str, value: Any, low: int, high: int) -> None:
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not whole or not low <= value <= high:
        raise SettingError(Name(setting), f" {value!r} is not allowed; use {low} to {high}")


# --- the CronJob ------------------------------------------------------------------------------


def labels(pipeline: Pipeline) -> dict[str, str]:
    """The labels of a pipeline's CronJob, its Jobs and their pods."""
    return {ws.MANAGED_BY_LABEL: "trnctl", PIPELINE_LABEL: pipeline.name}


def render_cronjob(
    pipeline: Pipeline, *, namespace: str, image: str, region: str, suspend: bool = False
) -> dict[str, Any]:
    """The CronJob that runs ``pipeline`` in ``namespace`` of the environment in ``region``,
    its controller from ``image`` unless the pipeline names one; ``suspend`` (default False)
    creates it paused."""
    spec_json = pipeline.to_json()
    pod = {
        "metadata": {"labels": labels(pipeline)},
        "spec": {
            "serviceAccountName": SERVICE_ACCOUNT,
            "restartPolicy": "Never",
            "automountServiceAccountToken": True,
            "containers": [_controller(pipeline, pipeline.image or image, region)],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
            "nodeSelector": dict(SYSTEM_NODES),
        },
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "CronJob",
        "metadata": {
            "name": pipeline.name,
            "namespace": namespace,
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


def _controller(pipeline: Pipeline, image: str, region: str) -> dict[str, Any]:
    return {
        "name": CONTAINER,
        "image": image,
        "command": ["python3", "-m", "trnctl"],
        "args": ["pipeline", "tick", pipeline.name, "--env", pipeline.environment],
        "env": [
            {"name": SPEC_ENV, "value": pipeline.to_json()},
            {
                "name": JOB_ENV,
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_NAME_LABEL}']"}},
            },
            {"name": "AWS_REGION", "value": region},
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


def manual_job(cronjob: dict[str, Any], name: str) -> dict[str, Any]:
    """The Job ``run-now`` creates from ``cronjob`` as the API server returns it, as ``kubectl
    create job --from cronjob/...`` makes one (kubernetes/kubectl pkg/cmd/create/create_job.go):
    the template's labels and annotations plus ``cronjob.kubernetes.io/instantiate: manual``,
    and the CronJob as its controller (an owner reference without ``blockOwnerDeletion``, which
    would need the ``cronjobs/finalizers`` permission), so that the CronJob controller counts it
    in the history limits and deleting the pipeline deletes it.

    Raises:
        ValueError: ``cronjob`` has no ``metadata.uid`` (not read from the API server).
    """
    template = cronjob["spec"]["jobTemplate"]
    meta = cronjob["metadata"]
    if not meta.get("uid"):
        raise ValueError(f"CronJob {meta.get('name')!r} has no metadata.uid: read it from the API")
    template_meta = template.get("metadata") or {}
    owner = {
        "apiVersion": API_VERSION,
        "kind": "CronJob",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": dict(template_meta.get("labels") or {}),
            "annotations": {
                "cronjob.kubernetes.io/instantiate": "manual",
                **(template_meta.get("annotations") or {}),
            },
            "ownerReferences": [owner],
        },
        "spec": template["spec"],
    }
