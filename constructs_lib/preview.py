"""PreviewLifecycle: a preview environment that tags itself, watches its cost and expires."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import jsii
from aws_cdk import (
    ArnFormat,
    CfnDeletionPolicy,
    CfnResource,
    Duration,
    RemovalPolicy,
    Stack,
    Tags,
    TimeZone,
    Token,
)
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_logs as logs
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as targets
from aws_cdk import aws_sns as sns
from constructs import Construct, IConstruct, IValidation

from constructs_lib._alerts import ALERT_THRESHOLDS, alert_topic, monthly_budget
from constructs_lib._common import (
    acknowledge_managed_policies,
    acknowledge_wildcards,
    log_group_key,
)
from constructs_lib._props import props_of
from trn_catalog import formats
from trn_catalog.outputs import PREVIEW_REGIONS, TAG_EXPIRES_AT, TAG_PREVIEW

# The resource type CDK gives a stack's own tags (those CloudFormation puts on the stack).
STACK_TAGS = "aws:cdk:stack"
REAPER_CODE = Path(__file__).resolve().parent / "preview_reaper"


@dataclass(frozen=True)
class PreviewLifecycleProps:
    """What a :class:`PreviewLifecycle` was built with (its ``props``): the keyword arguments of
    its constructor, where each is documented with its default."""

    project: str
    expires_at: datetime
    stacks: Sequence[Stack]
    budget_usd: int
    alert_email: str | None
    thresholds: Sequence[int]


class PreviewLifecycle(Construct):
    """Makes a set of stacks a self-expiring preview environment.

    Default settings: every stack and its resources are tagged
    ``trn-platform:preview=<project>``, every stack (not its resources: the value moves at each
    redeploy) ``trn-platform:expires-at=<ISO-8601 UTC>``; every stack refuses, at synth, any
    resource that asks to be retained; a one-time EventBridge Scheduler schedule at expiry
    invokes a small function that deletes the stacks newest first, each only if its tags
    match, and moves the schedule to a later expiry tag when it finds one; an AWS Budgets budget
    on the preview tag alerts at 50, 80 and 100 percent to a KMS-encrypted SNS topic, which also
    hears of a deletion that keeps failing and forwards both to ``alert_email`` when given.

    The function may only describe and delete the preview's own stacks: CloudFormation deletes
    their resources with the service role each stack was deployed with (``cdk deploy`` uses the
    bootstrap's CloudFormation execution role), so the function holds no resource permissions.

    Attributes:
        reaper (the function), schedule, topic, alert_key, budget.

    Raises:
        ValueError: a project name that is not DNS-safe, a naive or past-the-epoch expiry, no
            stacks, a budget below 1 USD, a malformed email, or a stack region whose
            CloudFormation has no AWS::Budgets::Budget (:data:`PREVIEW_REGIONS` lists the others).
    """

    DEFAULT_BUDGET_USD = 500

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        project: str,
        expires_at: datetime,
        stacks: Sequence[Stack],
        budget_usd: int = DEFAULT_BUDGET_USD,
        alert_email: str | None = None,
        thresholds: Sequence[int] = ALERT_THRESHOLDS,
    ) -> None:
        """The props, each with its default (a missing required one: TypeError).

        Args:
            project: the preview's DNS-safe project name, at most 20 characters (required).
            expires_at: when the preview is deleted; timezone-aware (required).
            stacks: the preview's stacks in deployment order (required); they are tagged, checked
                for RETAIN and deleted in reverse order at expiry. Put the lifecycle's own stack
                first so that it goes last.
            budget_usd: monthly cost budget of the preview's tagged resources. Default 500.
            alert_email: an address that also gets the budget alerts. Default none.
            thresholds: the percentages of ``budget_usd`` at which the budget alerts (actual cost).
                Default 50, 80 and 100.
        """
        super().__init__(scope, construct_id)
        props = props_of(PreviewLifecycleProps, locals())
        _validate(props)
        region = Stack.of(self).region
        if not Token.is_unresolved(region) and region not in PREVIEW_REGIONS:
            raise ValueError(
                f"region {region!r} is not allowed: the preview's budget needs CloudFormation's "
                f"AWS::Budgets::Budget, offered in {', '.join(sorted(PREVIEW_REGIONS))}"
            )
        self.props = props
        expires = props.expires_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for stack in props.stacks:
            Tags.of(stack).add(TAG_PREVIEW, props.project)
            # On the stack only: the expiry moves at every redeploy, and a resource carrying it
            # would change with it (a launch template would make EKS replace its nodes).
            Tags.of(stack).add(TAG_EXPIRES_AT, expires, include_resource_types=[STACK_TAGS])
            stack.node.add_validation(_RefuseRetain(stack))
        self.topic = self._topic()
        self.reaper = self._reaper()
        self.schedule = self._schedule(expires)
        self.budget = self._budget()

    def _reaper(self) -> lambda_.Function:
        stack = Stack.of(self)
        name = f"trn-pv-{self.props.project}-reaper"
        function = lambda_.Function(
            self,
            "Reaper",
            function_name=name,
            description=f"Deletes preview {self.props.project}'s stacks at expiry",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="handler.handler",
            code=lambda_.Code.from_asset(str(REAPER_CODE), exclude=["__pycache__", "*.pyc"]),
            timeout=Duration.minutes(15),
            memory_size=256,
            # A failed deletion raises; after Lambda's two retries the topic (and the alert
            # email) hears of it. No reserved concurrency: new accounts may not have the quota
            # for it, and deleting a stack twice is harmless.
            on_failure=destinations.SnsDestination(self.topic),
            log_group=logs.LogGroup(
                self,
                "ReaperLogs",
                retention=logs.RetentionDays.ONE_MONTH,
                encryption_key=log_group_key(self, "ReaperLogKey", RemovalPolicy.DESTROY),
                removal_policy=RemovalPolicy.DESTROY,
            ),
        )
        role = function.role
        assert isinstance(role, iam.Role)
        self.alert_key.grant(role, "kms:GenerateDataKey*", "kms:Decrypt")
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["cloudformation:DescribeStacks", "cloudformation:DeleteStack"],
                resources=[
                    stack.format_arn(
                        service="cloudformation",
                        resource="stack",
                        resource_name=f"{s.stack_name}/*",
                    )
                    for s in self.props.stacks
                ],
            )
        )
        # Continuation: the function invokes itself by name (no token, so no dependency cycle).
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["lambda:InvokeFunction"],
                resources=[
                    stack.format_arn(
                        service="lambda",
                        resource="function",
                        resource_name=name,
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                ],
            )
        )
        acknowledge_managed_policies(
            role,
            "AWSLambdaBasicExecutionRole: the AWS-maintained policy for writing the "
            "function's own logs.",
        )
        acknowledge_wildcards(
            role,
            "Stack ARNs end in a generated id (stack/NAME/*); the names are this preview's own.",
        )
        return function

    def _schedule(self, expires: str) -> scheduler.Schedule:
        stack = Stack.of(self)
        name = f"trn-pv-{self.props.project}-expiry"
        stacks = [s.stack_name for s in self.props.stacks]
        event = {
            "project": self.props.project,
            "stacks": stacks,
            "self_stack": stack.stack_name,
            "tags": {"preview": TAG_PREVIEW, "expires_at": TAG_EXPIRES_AT},
            "schedule": {"name": name, "group": "default"},
        }
        role = iam.Role(
            self,
            "ExpiryRole",
            assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com"),
            description=f"EventBridge Scheduler invokes preview {self.props.project}'s reaper",
        )
        self._let_reaper_reschedule(name, role)
        schedule = scheduler.Schedule(
            self,
            "Expiry",
            schedule_name=name,
            description=f"Delete preview {self.props.project} at {expires}",
            schedule=scheduler.ScheduleExpression.at(
                self.props.expires_at.astimezone(UTC), TimeZone.ETC_UTC
            ),
            target=targets.LambdaInvoke(
                self.reaper, input=scheduler.ScheduleTargetInput.from_object(event), role=role
            ),
        )
        acknowledge_wildcards(role, "CDK grants invoke on the reaper and its versions (ARN:*).")
        return schedule

    def _let_reaper_reschedule(self, schedule_name: str, schedule_role: iam.Role) -> None:
        """The reaper moves its schedule to a later expiry (``trnctl preview extend``, or a
        redeployed stack) instead of never firing again."""
        stack = Stack.of(self)
        reaper_role = self.reaper.role
        assert isinstance(reaper_role, iam.Role)
        reaper_role.add_to_policy(
            iam.PolicyStatement(
                actions=["scheduler:GetSchedule", "scheduler:UpdateSchedule"],
                resources=[
                    stack.format_arn(
                        service="scheduler",
                        resource="schedule",
                        resource_name=f"default/{schedule_name}",
                    )
                ],
            )
        )
        reaper_role.add_to_policy(
            iam.PolicyStatement(
                actions=["iam:PassRole"],
                resources=[schedule_role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "scheduler.amazonaws.com"}},
            )
        )

    def _topic(self) -> sns.Topic:
        topic, self.alert_key = alert_topic(
            self,
            f"Encrypts preview {self.props.project}'s budget alerts",
            email=self.props.alert_email,
        )
        return topic

    def _budget(self) -> budgets.CfnBudget:
        # One path to the alert email, through the topic, which also carries reaper failures.
        # The budget needs the preview tag activated as a cost allocation tag in Billing.
        return monthly_budget(
            self,
            name=f"trn-pv-{self.props.project}",
            usd=self.props.budget_usd,
            tag=(TAG_PREVIEW, self.props.project),
            topic=self.topic,
            thresholds=self.props.thresholds,
        )


@jsii.implements(IValidation)
class _RefuseRetain:
    """Preview stacks are deleted at expiry: nothing in them may ask to be retained."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    def validate(self) -> list[str]:
        errors = []
        for child in self.stack.node.find_all():
            if isinstance(child, CfnResource) and _retains(child):
                errors.append(
                    f"{child.node.path}: preview stacks are destroyed at expiry, so RETAIN is "
                    "refused; use RemovalPolicy.DESTROY (or deploy it as dev or prod)"
                )
        return errors


def _retains(resource: IConstruct) -> bool:
    options = resource.cfn_options  # type: ignore[attr-defined]
    return options.deletion_policy in (
        CfnDeletionPolicy.RETAIN,
        CfnDeletionPolicy.RETAIN_EXCEPT_ON_CREATE,
    )


def _validate(props: PreviewLifecycleProps) -> None:
    if not formats.PREVIEW_NAME.fullmatch(props.project):
        raise ValueError(
            f"project {props.project!r} is not allowed; use {formats.PREVIEW_NAME_RULE}"
        )
    if props.expires_at.tzinfo is None:
        raise ValueError(f"expires_at {props.expires_at!r} must carry a timezone (use UTC)")
    if not props.stacks:
        raise ValueError("stacks is empty; pass the preview's stacks in deployment order")
    if props.budget_usd < 1:
        raise ValueError(f"budget_usd {props.budget_usd} is not allowed; use 1 or more")
    if props.alert_email is not None and not formats.EMAIL.fullmatch(props.alert_email):
        raise ValueError(f"alert_email {props.alert_email!r} is not an email address")
    for threshold in props.thresholds:
        if not 1 <= threshold <= 1000:
            raise ValueError(f"thresholds: {threshold} is not a percentage from 1 to 1000")
