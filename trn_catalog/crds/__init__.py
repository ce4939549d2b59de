"""Schemas of the job engine's custom resources (see README.md here), standard library only."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
KINDS = ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime")


@cache
def _document() -> dict[str, Any]:
    text = resources.files(__name__).joinpath("trainer.kubeflow.org-v1alpha1.json").read_text()
    document: dict[str, Any] = json.loads(text)
    return document


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
