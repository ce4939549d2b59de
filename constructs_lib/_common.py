"""Small helpers shared by the constructs: log retention and log-group encryption keys."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

RETENTION_DAYS: dict[int, logs.RetentionDays] = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
    731: logs.RetentionDays.TWO_YEARS,
    1827: logs.RetentionDays.FIVE_YEARS,
    3653: logs.RetentionDays.TEN_YEARS,
}


def retention(field_name: str, days: int) -> logs.RetentionDays:
    """The CloudWatch retention for ``days``.

    Raises:
        ValueError: ``days`` is not one of :data:`RETENTION_DAYS` (the message names the field).
    """
    if days not in RETENTION_DAYS:
        known = ", ".join(map(str, RETENTION_DAYS))
        raise ValueError(
            f"{field_name} {days} is not a supported log retention; use one of {known}"
        )
    return RETENTION_DAYS[days]


def log_group_key(scope: Construct, construct_id: str, removal_policy: RemovalPolicy) -> kms.Key:
    """A rotating KMS key that CloudWatch Logs may use, for this account's log groups only."""
    key = kms.Key(
        scope,
        construct_id,
        description=f"Encrypts CloudWatch log groups of {scope.node.path}",
        enable_key_rotation=True,
        removal_policy=removal_policy,
        pending_window=Duration.days(7),
    )
    stack = Stack.of(scope)
    key.add_to_resource_policy(
        iam.PolicyStatement(
            actions=[
                "kms:Encrypt*",
                "kms:Decrypt*",
                "kms:ReEncrypt*",
                "kms:GenerateDataKey*",
                "kms:Describe*",
            ],
            principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
            resources=["*"],
            conditions={
                "ArnLike": {
                    "kms:EncryptionContext:aws:logs:arn": (
                        f"arn:{stack.partition}:logs:{stack.region}:{stack.account}:log-group:*"
                    )
                }
            },
        )
    )
    return key
