"""What Service Quotas answers for the Trn vCPU quota that preflight reads (moto has no Service
Quotas): the request's parameters and the answer."""

from __future__ import annotations

from typing import Any

QUOTA = {"ServiceCode": "ec2", "QuotaCode": "L-2C3B7624"}


def quota_response(value: float) -> dict[str, Any]:
    return {"Quota": {**QUOTA, "QuotaName": "Running On-Demand Trn instances", "Value": value}}


def image_response(registry_id: str, repository: str, tag: str) -> dict[str, Any]:
    """ECR's BatchGetImage answer for an image the registry holds."""
    return {
        "images": [
            {
                "registryId": registry_id,
                "repositoryName": repository,
                "imageId": {"imageTag": tag, "imageDigest": "sha256:" + "0" * 64},
                "imageManifest": "{}",
            }
        ],
        "failures": [],
    }
