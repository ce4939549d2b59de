"""EKS helpers shared by the cluster, plugin and workspace constructs: tolerations, add-ons and
Pod Identity roles."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from constructs_lib._common import acknowledge_managed_policies
from trn_catalog import versions
from trn_catalog.workspace import GPU_TAINT_KEY, NEURON_TAINT_KEY

NEURON_TOLERATION = {"key": NEURON_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
SYSTEM_LABEL = {"trn-platform/node-type": "system"}
# Installed by TrainingWorkspace, after its driver's Pod Identity association: pods read their
# Pod Identity credentials only when they start, and the driver's role names the datasets
# bucket, which the cluster must not depend on.
MOUNTPOINT_ADDON = "aws-mountpoint-s3-csi-driver"


def install_addon(scope: Construct, cluster: eks.ICluster, pin: versions.AddonPin) -> eks.Addon:
    """The EKS add-on ``pin`` at its exact version and configuration, removed with the stack."""
    return eks.Addon(
        scope,
        f"Addon-{pin.name}",
        cluster=cluster,
        addon_name=pin.name,
        addon_version=pin.version,
        configuration_values=dict(pin.configuration) if pin.configuration else None,
        preserve_on_delete=False,
    )


def add_pod_identity(
    scope: Construct,
    construct_id: str,
    cluster: eks.ICluster,
    namespace: str,
    service_account: str,
    *,
    managed_policies: Sequence[str] = (),
    statements: Sequence[iam.PolicyStatement] = (),
) -> iam.Role:
    """A role for ``namespace/service_account`` and its EKS Pod Identity association.

    The association is the role's child ``PodIdentity``.
    """
    role = iam.Role(
        scope,
        construct_id,
        assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com").with_session_tags(),
        description=f"Pod Identity for {namespace}/{service_account}",
        managed_policies=[
            iam.ManagedPolicy.from_aws_managed_policy_name(name) for name in managed_policies
        ],
    )
    acknowledge_managed_policies(
        role,
        f"{', '.join(managed_policies)}: the AWS-maintained policies the EKS add-on "
        f"documentation names for {namespace}/{service_account}; AWS keeps them in step.",
    )
    for statement in statements:
        role.add_to_policy(statement)
    eks.CfnPodIdentityAssociation(
        role,
        "PodIdentity",
        cluster_name=cluster.cluster_name,
        namespace=namespace,
        service_account=service_account,
        role_arn=role.role_arn,
    )
    return role
