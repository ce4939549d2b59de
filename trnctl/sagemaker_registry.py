"""SageMaker Model Registry in step with the S3 manifests (environments deployed with
``-c model_registry=sagemaker``).

One model package group per model (:func:`group_name`), one versioned model package per model
version, whose approval status follows the manifest's status (:data:`APPROVAL`): ``candidate`` is
``PendingManualApproval``, ``promoted`` ``Approved``, ``rejected`` ``Rejected``. The package's
ARN goes back into the manifest (``sagemaker.model_package_arn``), so that a later status change
updates the same package; a package is created with a client token derived from the version, so
a retried create does not make a second one.

The calls and their parameters are those of the SageMaker API (botocore's service model):
CreateModelPackageGroup, DescribeModelPackageGroup, CreateModelPackage (ModelPackageGroupName,
ModelPackageDescription, ModelApprovalStatus, CustomerMetadataProperties, InferenceSpecification
with the version's S3 prefix as its model data source, ClientToken) and UpdateModelPackage
(ModelPackageArn, ModelApprovalStatus, ApprovalDescription).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from trnctl import registry
from trnctl.versioning import Ref

APPROVAL = {
    "candidate": "PendingManualApproval",
    "promoted": "Approved",
    "rejected": "Rejected",
}
# EntityName in the SageMaker API: 1-63 of [a-zA-Z0-9] with single or repeated '-' between.
_ENTITY_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
MAX_ENTITY_NAME = 63
# CustomerMetadataProperties: at most 50 entries; values of 1-256 characters of letters, spaces,
# digits and _.:/=+-@ (the API's CustomerMetadataMap).
_METADATA_OUT = re.compile(r"[^\w .:/=+\-@]", flags=re.UNICODE)
MAX_METADATA_VALUE = 256
MAX_DESCRIPTION = 1024
MAX_CLIENT_TOKEN = 36


def group_name(environment: str, model: str) -> str:
    """The model package group of ``model`` in ``environment``: ``<env>-<model>`` where that is an
    EntityName (dots become '-'); otherwise, or when longer than 63 characters, cut to fit with
    eight hex digits of its SHA-256, so that two models never share a group."""
    wanted = f"{environment}-{model}"
    plain = wanted.replace(".", "-")
    if plain == wanted and _ENTITY_NAME.match(plain):
        return plain
    digest = hashlib.sha256(wanted.encode()).hexdigest()[:8]
    head = plain[: MAX_ENTITY_NAME - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}"


def _metadata_value(value: Any) -> str:
    text = _METADATA_OUT.sub("-", str(value)).strip() or "-"
    return text[:MAX_METADATA_VALUE]


def metadata(ref: Ref, record: dict[str, Any], uri: str) -> dict[str, str]:
    """The package's customer metadata: where the version is, and its lineage."""
    lineage = record.get("lineage") or {}
    evaluation = record.get("evaluation") or {}
    found = {
        "trn-platform-version": str(ref),
        "trn-platform-uri": uri,
        "created-by": record.get("created_by"),
        "base-model": lineage.get("base_model"),
        "dataset": lineage.get("dataset"),
        "dataset-manifest-sha256": lineage.get("dataset_manifest_sha256"),
        "job": lineage.get("job"),
        "eval-data": evaluation.get("eval_data"),
        "eval-loss": (evaluation.get("candidate") or {}).get("loss"),
    }
    return {k: _metadata_value(v) for k, v in found.items() if v not in (None, "")}


def _approval_description(record: dict[str, Any]) -> str:
    history = record.get("history") or [{}]
    last = history[-1]
    text = f"{last.get('status', '')} by {last.get('by', '?')}: {last.get('reason', '')}"
    return text[:MAX_DESCRIPTION]


def ensure_group(sm: Any, environment: str, name: str) -> str:
    """The model package group of ``name``, created when missing; returns its name.

    Raises:
        botocore.exceptions.ClientError: SageMaker refused a call.
    """
    group = group_name(environment, name)
    try:
        sm.describe_model_package_group(ModelPackageGroupName=group)
    except sm.exceptions.ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ValidationException":
            raise
        sm.create_model_package_group(
            ModelPackageGroupName=group,
            ModelPackageGroupDescription=f"models/{name} of the trn-platform environment "
            f"{environment}",
            Tags=[
                {"Key": "trn-platform:environment", "Value": environment},
                {"Key": "trn-platform:model", "Value": name},
            ],
        )
    return group


def client_token(environment: str, ref: Ref) -> str:
    """A create's idempotency token for the version ``ref`` in ``environment``."""
    return hashlib.sha256(f"{environment}/{ref.path}".encode()).hexdigest()[:MAX_CLIENT_TOKEN]


def sync(
    sm: Any, environment: str, ref: Ref, record: dict[str, Any], bucket: str
) -> dict[str, str]:
    """Makes the model package of the version ``ref`` (its manifest ``record``) match: created
    with the manifest's approval status when the manifest names no package yet, else updated to
    it. Returns the manifest's ``sagemaker`` entry (group and package ARN).

    Raises:
        botocore.exceptions.ClientError: SageMaker refused a call.
    """
    approval = APPROVAL[str(record.get("status"))]
    known = record.get("sagemaker") or {}
    if known.get("model_package_arn"):
        sm.update_model_package(
            ModelPackageArn=known["model_package_arn"],
            ModelApprovalStatus=approval,
            ApprovalDescription=_approval_description(record),
        )
        return {k: str(v) for k, v in known.items()}
    group = ensure_group(sm, environment, ref.name)
    uri = f"s3://{bucket}/{ref.path}/"
    created = sm.create_model_package(
        ModelPackageGroupName=group,
        ModelPackageDescription=f"{ref}: {registry.describe_source(record)}"[:MAX_DESCRIPTION],
        ModelApprovalStatus=approval,
        CustomerMetadataProperties=metadata(ref, record, uri),
        InferenceSpecification={
            "Containers": [
                {
                    "ModelDataSource": {
                        "S3DataSource": {
                            "S3Uri": uri,
                            "S3DataType": "S3Prefix",
                            "CompressionType": "None",
                        }
                    }
                }
            ]
        },
        ClientToken=client_token(environment, ref),
    )
    return {"model_package_group": group, "model_package_arn": str(created["ModelPackageArn"])}


def mirror(
    sm: Any | None, s3: Any, environment: str, bucket: str, ref: Ref, record: dict[str, Any]
) -> dict[str, Any]:
    """With a SageMaker client (an environment whose ``model_registry`` is ``sagemaker``),
    :func:`sync` the version's package and record its ARN in the manifest once; without one
    (``s3``), nothing. Returns the manifest.

    Raises:
        botocore.exceptions.ClientError: SageMaker or S3 refused a call.
    """
    if sm is None:
        return record
    entry = sync(sm, environment, ref, record, bucket)
    if (record.get("sagemaker") or {}).get("model_package_arn") == entry["model_package_arn"]:
        return record
    return registry.update(s3, bucket, ref, lambda found: {**found, "sagemaker": entry})
