"""The ops CLI's side of scheduled fine-tuning pipelines: :mod:`trn_catalog.pipelines` holds
what a pipeline is, its gate and the CronJob that runs it (shared with the ``TrainingPipeline``
construct); here they refuse with :class:`TrnctlError` naming the command's options, and a
pipeline resolves its data, model and training arguments for a run (:mod:`trnctl.pipeline_run`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trn_catalog import pipelines as shared
from trn_catalog.outputs import EnvironmentOutputs
from trn_catalog.pipelines import (
    DEFAULT_CAPACITY_WAIT_MINUTES,
    GATE_FORM,
    JOB_ENV,
    MAX_NAME,
    PIPELINE_LABEL,
    SERVICE_ACCOUNT,
    SPEC_ANNOTATION,
    SPEC_ENV,
    TRAINING_FIELDS,
    manual_job,
)
from trnctl import datasets, jobs, registry, versioning
from trnctl.errors import ExitCode, TrnctlError, settings_as_usage

__all__ = [
    "DEFAULT_CAPACITY_WAIT_MINUTES",
    "GATE_FORM",
    "JOB_ENV",
    "MAX_NAME",
    "PIPELINE_LABEL",
    "SERVICE_ACCOUNT",
    "SPEC_ANNOTATION",
    "SPEC_ENV",
    "TRAINING_FIELDS",
    "Gate",
    "Pipeline",
    "check_data_exists",
    "check_name",
    "manual_job",
    "pipeline_of",
    "render_cronjob",
]


@dataclass(frozen=True)
class Gate(shared.Gate):
    """:class:`trn_catalog.pipelines.Gate`, refusing with a USAGE :class:`TrnctlError` naming
    ``--gate``."""

    @classmethod
    def parse(cls, text: str) -> Gate:
        with settings_as_usage():
            return super().parse(text)


@dataclass(frozen=True)
class Pipeline(shared.Pipeline):
    """:class:`trn_catalog.pipelines.Pipeline` (see it for the fields and their defaults),
    with what a run resolves.

    Raises:
        TrnctlError: USAGE, on construction, naming the option and the bad value.
    """

    def __post_init__(self) -> None:
        with settings_as_usage():
            super().__post_init__()

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

    @classmethod
    def from_json(cls, text: str) -> Pipeline:
        """The pipeline a CronJob carries.

        Raises:
            TrnctlError: FAILED when ``text`` is no pipeline (a CronJob edited by hand); USAGE
                for a refused value.
        """
        try:
            return super().from_json(text)
        except ValueError as error:
            raise TrnctlError(f"not a pipeline definition: {error}", ExitCode.FAILED) from None


def check_name(name: str) -> str:
    """``name`` when it can name a pipeline (:func:`trn_catalog.pipelines.check_name`).

    Raises:
        TrnctlError: USAGE naming the rule.
    """
    with settings_as_usage():
        return shared.check_name(name)


def check_data_exists(s3: Any, bucket: str, pipeline: Pipeline) -> None:
    """Refuses a pipeline whose model, data or eval data is not staged yet: a run would fail.

    Raises:
        TrnctlError: NOT_FOUND with the stage command (see :func:`trnctl.datasets.resolve`,
            :func:`trnctl.registry.resolve`).
    """
    registry.resolve(s3, bucket, pipeline.model, pipeline.environment, "--model")
    datasets.resolve(s3, bucket, pipeline.data, pipeline.environment, "--data")
    datasets.resolve(s3, bucket, pipeline.eval_data, pipeline.environment, "--eval-data")


def render_cronjob(
    pipeline: Pipeline, outputs: EnvironmentOutputs, *, suspend: bool = False
) -> dict[str, Any]:
    """The CronJob that runs ``pipeline`` in the environment ``outputs`` describes (its
    namespace and region, and its image unless the pipeline names one); ``suspend`` (default
    False) creates it paused."""
    return shared.render_cronjob(
        pipeline,
        namespace=outputs.namespace,
        image=outputs.image_uri,
        region=outputs.region,
        suspend=suspend,
    )


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
