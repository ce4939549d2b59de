"""Alerts shared by the preview lifecycle and the environment's observability: a KMS-encrypted SNS
topic that AWS Budgets (and, where asked, CloudWatch alarms) may publish to, and a monthly cost
budget on one tag that alerts it."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

ALERT_THRESHOLDS = (50, 80, 100)
BUDGETS = "budgets.amazonaws.com"
CLOUDWATCH = "cloudwatch.amazonaws.com"


def alert_topic(
    scope: Construct,
    description: str,
    *,
    publishers: Sequence[str] = (BUDGETS,),
    email: str | None = None,
) -> tuple[sns.Topic, kms.Key]:
    """The topic ``Alerts`` and its key ``AlertKey`` under ``scope``: the service principals of
    ``publishers`` may encrypt to the key and publish to the topic (from this account only),
    and ``email`` when given is subscribed."""
    key = kms.Key(
        scope,
        "AlertKey",
        description=description,
        enable_key_rotation=True,
        removal_policy=RemovalPolicy.DESTROY,
        pending_window=Duration.days(7),
    )
    principals = [iam.ServicePrincipal(p) for p in publishers]
    key.add_to_resource_policy(
        iam.PolicyStatement(
            actions=["kms:GenerateDataKey*", "kms:Decrypt"],
            principals=principals,
            resources=["*"],
        )
    )
    topic = sns.Topic(scope, "Alerts", master_key=key, enforce_ssl=True)
    topic.add_to_resource_policy(
        iam.PolicyStatement(
            actions=["sns:Publish"],
            principals=principals,
            resources=[topic.topic_arn],
            conditions={"StringEquals": {"aws:SourceAccount": Stack.of(scope).account}},
        )
    )
    if email:
        topic.add_subscription(subscriptions.EmailSubscription(email))
    return topic, key


def monthly_budget(
    scope: Construct,
    *,
    name: str,
    usd: int,
    tag: tuple[str, str],
    topic: sns.ITopic,
    thresholds: Sequence[int] = ALERT_THRESHOLDS,
) -> budgets.CfnBudget:
    """The budget ``Budget`` under ``scope``: ``usd`` a month of the cost of resources tagged
    ``tag`` (key, value), alerting ``topic`` when actual spend passes each of ``thresholds``
    percent. The tag counts only once it is activated as a cost allocation tag in Billing."""
    key, value = tag
    return budgets.CfnBudget(
        scope,
        "Budget",
        budget={
            "budgetName": name,
            "budgetType": "COST",
            "timeUnit": "MONTHLY",
            "budgetLimit": {"amount": usd, "unit": "USD"},
            "costFilters": {"TagKeyValue": [f"user:{key}${value}"]},
        },
        notifications_with_subscribers=[
            {
                "notification": {
                    "notificationType": "ACTUAL",
                    "comparisonOperator": "GREATER_THAN",
                    "threshold": threshold,
                    "thresholdType": "PERCENTAGE",
                },
                "subscribers": [{"subscriptionType": "SNS", "address": topic.topic_arn}],
            }
            for threshold in thresholds
        ],
    )
