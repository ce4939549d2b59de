"""Schemas of the job engine's custom resources (see README.md here), standard library only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
KINDS = ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime")


@dataclass(frozen=True)
class TrainerJob:
    """What the pinned Trainer release's torch runtime requires of a runtime's trainer job: the
    replicated job and container names (the ``Node`` constant, which also names the rank-0 host
    ``<trainjob>-node-0-0.<trainjob>``) and the ancestor label that marks the job whose pods get
    the TrainJob's image, node count and ``PET_*`` rendezvous variables."""

    replicated_job: str
    container: str
    ancestor_label: str
    ancestor: str
    source: str


@cache
def _document() -> dict[str, Any]:
    text = resources.files(__name__).joinpath("trainer.kubeflow.org-v1alpha1.json").read_text()
    document: dict[str, Any] = json.loads(text)
    return document


def release_tag() -> str:
    """The kubeflow/trainer tag the schema data was read from, e.g. ``v2.3.0``."""
    tag: str = _document()["release"]["tag"]
    return tag


def jobset_tag() -> str:
    """The JobSet release whose JobSet spec the TrainingRuntime embeds (Trainer's go.mod)."""
    tag: str = _document()["release"]["jobset"]
    return tag


def trainer_job() -> TrainerJob:
    """The torch runtime's requirements on the trainer job, as of :func:`release_tag`."""
    facts = _document()["trainerJob"]
    return TrainerJob(
        replicated_job=facts["replicatedJob"],
        container=facts["container"],
        ancestor_label=facts["ancestorLabel"],
        ancestor=facts["ancestor"],
        source=facts["source"],
    )


def schema(kind: str) -> dict[str, Any]:
    """A self-contained JSON Schema for ``kind`` (one of :data:`KINDS`).

    Raises:
        KeyError: ``kind`` is not a job-engine kind this platform writes.
    """
    if kind not in KINDS:
        raise KeyError(f"no schema for kind {kind!r}; known: {', '.join(KINDS)}")
    definition = "TrainJob" if kind == "TrainJob" else "TrainingRuntime"
    document = _document()
    return {
        "$schema": document["$schema"],
        "$defs": document["$defs"],
        "$ref": f"#/$defs/{definition}",
    }
