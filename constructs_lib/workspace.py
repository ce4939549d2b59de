"""TrainingWorkspace: the namespace where jobs run, with identity and storage wired in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

FSX_CLAIM = "fsx"
DATASETS_CLAIM = "datasets-s3"
# The Mountpoint S3 CSI driver's controller service account (EKS add-on docs).
MOUNTPOINT_SERVICE_ACCOUNT = ("kube-system", "s3-csi-driver-sa")


@dataclass(frozen=True)
class TrainingWorkspaceProps:
    """Props of :class:`TrainingWorkspace`.

    Attributes:
        cluster: the EKS cluster (required).
        file_system: the FSx for Lustre file system mounted at the claim ``fsx`` (required).
        datasets: bucket mounted read-only at the claim ``datasets-s3`` (required).
        job_role: the role jobs get through Pod Identity (required), e.g.
            ``TrainingDataPaths.job_role``.
        mountpoint_role: the Mountpoint S3 driver's role (required), e.g.
            ``TrainingDataPaths.mountpoint_role``.
        fsx_storage_gib: the file system's size, stated on its PersistentVolume. Default 1200.
        namespace: default ``training``.
        service_account: the jobs' service account. Default ``trainer``.
    """

    cluster: eks.ICluster
    file_system: fsx.LustreFileSystem
    datasets: s3.IBucket
    job_role: iam.IRole
    mountpoint_role: iam.IRole
    fsx_storage_gib: int = 1200
    namespace: str = "training"
    service_account: str = "trainer"


class TrainingWorkspace(Construct):
    """A namespace for training jobs: service account, Pod Identity and volumes.

    Default settings: the namespace and service account, bound to ``job_role`` by Pod Identity;
    a static FSx for Lustre PersistentVolume and claim (ReadWriteMany, reclaim Retain); a
    read-only Mountpoint S3 volume and claim on the datasets bucket, with the Mountpoint driver's
    service account bound to ``mountpoint_role``.

    Attributes:
        manifest (the KubernetesManifest), fsx_claim, datasets_claim.

    Raises:
        ValueError: a namespace or service account name that is not a DNS label.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, props: TrainingWorkspaceProps
    ) -> None:
        super().__init__(scope, construct_id)
        for name in ("namespace", "service_account"):
            value = getattr(props, name)
            if not (value.replace("-", "").isalnum() and value.islower() and len(value) <= 63):
                raise ValueError(f"{name} {value!r} is not a lowercase DNS label")
        self.props = props
        self.fsx_claim = FSX_CLAIM
        self.datasets_claim = DATASETS_CLAIM
        for construct_id, role, (namespace, account) in (
            ("JobIdentity", props.job_role, (props.namespace, props.service_account)),
            ("MountpointIdentity", props.mountpoint_role, MOUNTPOINT_SERVICE_ACCOUNT),
        ):
            eks.CfnPodIdentityAssociation(
                self,
                construct_id,
                cluster_name=props.cluster.cluster_name,
                namespace=namespace,
                service_account=account,
                role_arn=role.role_arn,
            )
        self.manifest = eks.KubernetesManifest(
            self,
            "Manifest",
            cluster=props.cluster,
            manifest=self.manifests(),
            prune=True,
        )

    def manifests(self) -> list[dict[str, Any]]:
        """The Kubernetes objects this workspace applies (tokens resolve at deploy)."""
        props = self.props
        namespace = props.namespace
        region = Stack.of(self).region
        capacity = f"{props.fsx_storage_gib}Gi"
        return [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace, "labels": {"trn-platform/workspace": "true"}},
            },
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": props.service_account, "namespace": namespace},
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"{namespace}-fsx"},
                "spec": {
                    "capacity": {"storage": capacity},
                    "volumeMode": "Filesystem",
                    "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "claimRef": {"namespace": namespace, "name": FSX_CLAIM},
                    "mountOptions": ["flock"],
                    "csi": {
                        "driver": "fsx.csi.aws.com",
                        "volumeHandle": props.file_system.file_system_id,
                        "volumeAttributes": {
                            "dnsname": props.file_system.dns_name,
                            "mountname": props.file_system.mount_name,
                        },
                    },
                },
            },
            _claim(FSX_CLAIM, namespace, f"{namespace}-fsx", "ReadWriteMany", capacity),
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"{namespace}-datasets-s3"},
                "spec": {
                    # Mountpoint ignores capacity; Kubernetes requires one.
                    "capacity": {"storage": "1200Gi"},
                    "accessModes": ["ReadOnlyMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "claimRef": {"namespace": namespace, "name": DATASETS_CLAIM},
                    "mountOptions": ["read-only", "allow-other", f"region {region}"],
                    "csi": {
                        "driver": "s3.csi.aws.com",
                        "volumeHandle": f"{namespace}-datasets-s3",
                        "volumeAttributes": {"bucketName": props.datasets.bucket_name},
                    },
                },
            },
            _claim(DATASETS_CLAIM, namespace, f"{namespace}-datasets-s3", "ReadOnlyMany", "1200Gi"),
        ]


def _claim(name: str, namespace: str, volume: str, mode: str, size: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accessModes": [mode],
            "storageClassName": "",
            "volumeName": volume,
            "resources": {"requests": {"storage": size}},
        },
    }
