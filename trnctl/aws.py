"""boto3 clients as every trnctl command makes them.

The standard AWS environment decides everything that is not a command option: credentials and
profile (``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``, SSO), region (``AWS_REGION``,
``AWS_DEFAULT_REGION``, the profile's region) and endpoints (``AWS_ENDPOINT_URL``,
``AWS_ENDPOINT_URL_<SERVICE>``); botocore reads the credentials and endpoints itself, so nothing
here overrides them.
"""

from __future__ import annotations

import os
from typing import Any

import boto3
from botocore.config import Config

# Adaptive mode adds client-side rate limiting to the standard retries, so a burst of calls
# (describe_stacks pages, multipart parts) slows down under throttling instead of failing.
MAX_ATTEMPTS = 8
CLIENT_CONFIG = Config(
    retries={"mode": "adaptive", "total_max_attempts": MAX_ATTEMPTS},
    user_agent_appid="trnctl",
)


def client(service: str, region: str | None = None) -> Any:
    """A boto3 client for ``service`` with adaptive retries.

    Args:
        service: the boto3 service name, e.g. ``"ec2"``.
        region: the region; None (the default) takes :func:`session_region`.

    Raises:
        botocore.exceptions.NoRegionError: on the first call, when no region is configured
            anywhere and the service is regional.
    """
    return boto3.session.Session().client(
        service, region_name=region or session_region(), config=CLIENT_CONFIG
    )


def session_region() -> str | None:
    """The region the AWS environment configures, or None.

    ``AWS_REGION`` wins over ``AWS_DEFAULT_REGION`` and the profile, as in the AWS CLI v2 and the
    other SDKs; botocore itself reads only the latter two.
    """
    region: str | None = os.environ.get("AWS_REGION") or boto3.session.Session().region_name
    return region


def caller_arn(region: str | None = None) -> str:
    """The ARN of the credentials in use (``sts:GetCallerIdentity``, which needs no permission),
    recorded as who staged, registered or promoted something.

    Raises:
        botocore.exceptions.ClientError: STS refused the call (expired credentials).
    """
    arn: str = client("sts", region).get_caller_identity()["Arn"]
    return arn
