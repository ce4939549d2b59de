"""PipelineAccess: what scheduled pipelines' controllers run as in a training namespace."""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from constructs import Construct

from constructs_lib._common import acknowledge, nag_reference
from trn_catalog import workspace as ws
from trn_catalog.outputs import parameter_name

# The ServiceAccount pipelines' CronJobs run their controller pods as (trnctl.pipelines).
SERVICE_ACCOUNT = "trn-pipelines"
# What a controller does in the namespace: create, watch and delete its run's TrainJobs, read
# their pods and the eval pods' logs, and record events on its CronJob. Nothing else: it cannot
# create pods or CronJobs, read secrets, or act outside the namespace.
RULES: tuple[dict[str, Any], ...] = (
    {
        "apiGroups": [ws.TRAINER_API_GROUP],
        "resources": ["trainjobs"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)
# SageMaker Model Registry calls trnctl makes (trnctl/sagemaker_registry.py), on the
# environment's groups and packages only; AddTags because CreateModelPackageGroup tags the group.
SAGEMAKER_ACTIONS = (
    "sagemaker:AddTags",
    "sagemaker:CreateModelPackage",
    "sagemaker:CreateModelPackageGroup",
    "sagemaker:DescribeModelPackage",
    "sagemaker:DescribeModelPackageGroup",
    "sagemaker:UpdateModelPackage",
)


class PipelineAccess(Construct):
    """The ``trn-pipelines`` ServiceAccount in ``namespace``, a Role limited to :data:`RULES`
    bound to it, and the EKS Pod Identity association that gives its pods ``role`` (S3 access
    comes with the role: ``TrainingDataPaths.pipeline_role``) plus a policy to publish to
    ``alert_topic`` (encrypted with ``alert_key``), read the environment's outputs parameter
    and, with ``sagemaker`` (default False), keep the environment's model package groups
    (``<environment>-*``) and packages.

    Attributes:
        manifest (the KubernetesManifest), association, policy.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        namespace: str,
        environment: str,
        role: iam.IRole,
        alert_topic: sns.ITopic,
        alert_key: kms.IKey,
        sagemaker: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.association = eks.CfnPodIdentityAssociation(
            self,
            "PodIdentity",
            cluster_name=cluster.cluster_name,
            namespace=namespace,
            service_account=SERVICE_ACCOUNT,
            role_arn=role.role_arn,
        )
        statements = [
            iam.PolicyStatement(actions=["sns:Publish"], resources=[alert_topic.topic_arn]),
            iam.PolicyStatement(
                actions=["kms:Decrypt", "kms:GenerateDataKey"], resources=[alert_key.key_arn]
            ),
            iam.PolicyStatement(
                actions=["ssm:GetParameter"],
                resources=[
                    stack.format_arn(
                        service="ssm",
                        resource="parameter",
                        resource_name=parameter_name(environment).lstrip("/"),
                    )
                ],
            ),
        ]
        sagemaker_arns = self._sagemaker_arns(stack, environment) if sagemaker else []
        if sagemaker_arns:
            statements.append(
                iam.PolicyStatement(actions=list(SAGEMAKER_ACTIONS), resources=sagemaker_arns)
            )
        self.policy = iam.Policy(self, "Policy", roles=[role], statements=statements)
        for arn in sagemaker_arns:
            acknowledge(
                self.policy,
                f"AwsSolutions-IAM5[Resource::{nag_reference(stack.resolve(arn))}]",
                "Model package groups and packages are named per model as pipelines and trnctl "
                "register them; the environment's prefix bounds them.",
            )
        self.manifest = eks.KubernetesManifest(
            self, "Manifest", cluster=cluster, manifest=manifests(namespace), prune=True
        )

    @staticmethod
    def _sagemaker_arns(stack: Stack, environment: str) -> list[str]:
        return [
            stack.format_arn(service="sagemaker", resource=kind, resource_name=f"{environment}-*")
            for kind in ("model-package-group", "model-package")
        ]


def manifests(namespace: str) -> list[dict[str, Any]]:
    """The ServiceAccount, Role and RoleBinding of pipelines' controllers in ``namespace``."""
    meta = {"name": SERVICE_ACCOUNT, "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [dict(rule) for rule in RULES],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": SERVICE_ACCOUNT,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}
            ],
        },
    ]
