"""The `model_registry` context key: the S3 manifests alone (default) or mirrored into SageMaker
Model Registry; validated like the other keys, and carried into the environment's outputs, where
trnctl reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from platform_config import ConfigError, parse_config
from tests.conftest import Synth
from trn_catalog.outputs import EnvironmentOutputs


def test_the_default_is_the_s3_manifests_alone() -> None:
    assert parse_config({}).model_registry == "s3"
    assert parse_config({"model_registry": "sagemaker"}).model_registry == "sagemaker"


def test_an_unknown_registry_is_refused_naming_the_key() -> None:
    with pytest.raises(
        ConfigError,
        match=r"model_registry: 'mlflow' is not allowed; expected one of: s3, sagemaker",
    ):
        parse_config({"model_registry": "mlflow"})


def test_outputs_written_before_the_key_existed_read_as_s3() -> None:
    assert EnvironmentOutputs.from_json(json.dumps(_minimal())).model_registry == "s3"


def _minimal() -> dict[str, Any]:
    from tests.conftest import sample_outputs

    written = json.loads(sample_outputs().to_json())
    written.pop("model_registry")
    return dict(written)


def _outputs(synth: Synth) -> dict[str, Any]:
    (parameter,) = synth.resources("workloads", "AWS::SSM::Parameter").values()
    value = parameter["Properties"]["Value"]
    text = value if isinstance(value, str) else _joined(value)
    found: dict[str, Any] = json.loads(text)
    return found


def _joined(node: Any) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, dict) and "Fn::Join" in node:
        separator, parts = node["Fn::Join"]
        return str(separator).join(_joined(p) for p in parts)
    return "TOKEN"


def test_the_environments_outputs_name_its_registry(dev: Synth, prod: Synth) -> None:
    assert _outputs(dev)["model_registry"] == "s3"
    assert _outputs(prod)["model_registry"] == "sagemaker"
