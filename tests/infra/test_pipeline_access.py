"""What pipelines' controllers run as: the trn-pipelines ServiceAccount with a Role limited to
TrainJobs, pods, pod logs and events, its Pod Identity role (datasets read-write, checkpoints
read) and a policy for the alert topic, the outputs parameter and, where the registry is
mirrored, SageMaker Model Registry."""

from __future__ import annotations

import json
from typing import Any

from constructs_lib import pipeline as access
from tests.conformance import kube_objects
from tests.conformance.kube_objects import Applied, problems
from tests.conformance.kube_objects import manifests as applied_manifests
from tests.conformance.kube_objects import resolve as _resolve
from tests.conftest import Synth
from trnctl import pipelines


def _objects(synth: Synth) -> dict[str, dict[str, Any]]:
    found: list[Applied] = list(applied_manifests(synth.templates))
    return {
        f"{a.obj['kind']}/{a.obj['metadata']['name']}": dict(a.obj)
        for a in found
        if a.obj["metadata"].get("name") == access.SERVICE_ACCOUNT
    }


def test_the_service_account_is_the_one_pipelines_run_as_and_its_role_is_narrow(
    dev: Synth,
) -> None:
    objects = _objects(dev)

    assert set(objects) == {
        "ServiceAccount/trn-pipelines",
        "Role/trn-pipelines",
        "RoleBinding/trn-pipelines",
    }
    assert access.SERVICE_ACCOUNT == pipelines.SERVICE_ACCOUNT
    assert objects["Role/trn-pipelines"]["rules"] == [
        {
            "apiGroups": ["trainer.kubeflow.org"],
            "resources": ["trainjobs"],
            "verbs": ["get", "list", "watch", "create", "delete"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    binding = objects["RoleBinding/trn-pipelines"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "trn-pipelines", "namespace": "training"}
    ]
    for obj in objects.values():
        assert problems(obj) == []


def _association(synth: Synth) -> dict[str, Any]:
    (found,) = [
        r["Properties"]
        for r in synth.resources("workloads", "AWS::EKS::PodIdentityAssociation").values()
        if r["Properties"]["ServiceAccount"] == "trn-pipelines"
    ]
    return found


def _policy(synth: Synth) -> list[dict[str, Any]]:
    (found,) = [
        r["Properties"]["PolicyDocument"]["Statement"]
        for logical_id, r in synth.resources("workloads", "AWS::IAM::Policy").items()
        if logical_id.startswith("Pipelines")
    ]
    return list(found)


def _actions(statements: list[dict[str, Any]]) -> set[str]:
    found: set[str] = set()
    for statement in statements:
        action = statement["Action"]
        found |= {action} if isinstance(action, str) else set(action)
    return found


def test_the_controller_role_publishes_alerts_reads_outputs_and_nothing_of_sagemaker(
    dev: Synth,
) -> None:
    association = _association(dev)
    statements = _policy(dev)

    assert association["Namespace"] == "training"
    assert _actions(statements) == {
        "sns:Publish",
        "kms:Decrypt",
        "kms:GenerateDataKey",
        "ssm:GetParameter",
    }
    ssm = next(s for s in statements if s["Action"] == "ssm:GetParameter")
    assert ":parameter/trn-platform/trn-dev/outputs" in _resolve(ssm["Resource"])


def test_with_the_sagemaker_registry_the_role_keeps_the_environments_packages(
    prod: Synth,
) -> None:
    statements = _policy(prod)

    sagemaker = next(s for s in statements if "sagemaker:CreateModelPackage" in s["Action"])
    assert set(sagemaker["Action"]) == set(access.SAGEMAKER_ACTIONS)
    resources = [_resolve(r) for r in sagemaker["Resource"]]
    assert [r.rsplit(":", 1)[1] for r in resources] == [
        "model-package-group/trn-prod-*",
        "model-package/trn-prod-*",
    ]


def test_the_data_stack_gives_the_pipeline_role_datasets_and_exports(dev: Synth) -> None:
    (role_id,) = [
        logical_id
        for logical_id, r in dev.resources("data", "AWS::IAM::Role").items()
        if logical_id.startswith("DataPipelineRole") or "PipelineRole" in logical_id
    ]
    policies = [
        r["Properties"]["PolicyDocument"]["Statement"]
        for r in dev.resources("data", "AWS::IAM::Policy").values()
        if {"Ref": role_id} in r["Properties"]["Roles"]
    ]
    (statements,) = policies
    text = json.dumps(statements)
    assert "s3:PutObject" in text and "s3:GetObject*" in text
    deny = [s for s in statements if s["Effect"] == "Deny"]
    assert [s["Action"] for s in deny] == ["s3:DeleteObjectVersion"]
    assert kube_objects.PLACEHOLDER  # the shared conformance helpers stay importable
