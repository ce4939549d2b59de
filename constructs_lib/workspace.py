"""TrainingWorkspace: the namespace where jobs run, with identity and storage wired in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Required, TypedDict

from aws_cdk import Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

import trn_catalog
from constructs_lib._eks import (
    GPU_TOLERATION,
    MOUNTPOINT_ADDON,
    NEURON_TOLERATION,
    install_addon,
)
from constructs_lib._props import props_of
from trn_catalog import allocatable, neuron_stacks, versions
from trn_catalog import devices as device_modes
from trn_catalog import observability as obs
from trn_catalog.workspace import (
    DATASETS_MOUNT,
    FSX_MOUNT,
    GPU_INSTANCE_TYPE_ENV,
    GPU_NODE_TYPE,
    GPU_RESOURCE,
    GPU_RUNTIME_NAME,
    NODE_TYPE_LABEL,
    RUNTIME_NAME,
    TRAINER_ANCESTOR,
    TRAINER_ANCESTOR_LABEL,
    TRAINER_API_GROUP,
    TRAINER_API_VERSION,
    TRAINER_CONTAINER,
    TRAINIUM_NODE_TYPE,
)

# The EFA driver pre-allocates 5128 x 2 MiB huge pages; each EFA pod asks for them (EFA docs).
EFA_HUGEPAGES = "5120Mi"
# The one capability the training container keeps. EFA registers (pins) the memory it sends from
# and receives into, and the kernel caps a process's pinned memory at RLIMIT_MEMLOCK unless it
# has CAP_IPC_LOCK (Linux drivers/infiniband/core/umem.c, ib_umem_get); libfabric's EFA provider
# asks for an unlimited locked-memory limit (ofiwg/libfabric prov/efa/docs/overview.md), Neuron's
# containers run with --cap-add IPC_LOCK (aws-neuron-sdk deploy/environments/
# quickstart-deploy-dlc.rst, setup/pytorch/update-dlc.rst) and its multi-node AWS Batch training
# job with memlock unlimited (aws-neuron-samples torch-neuronx/training/aws-batch/llama2/
# templates/job_def.json). A pod cannot set an rlimit; the capability lifts the cap. The same
# Docker runs add SYS_ADMIN, left out here: Neuron's own Kubernetes pods (deploy/eks/training.rst,
# deploy/files/specs/all-devices.yaml) add no capability, and the device plugins' and DRA
# drivers' device nodes reach the container without one. NCCL over EFA on the GPU group pins its
# buffers the same way.
TRAINING_CAPABILITIES = ("IPC_LOCK",)
# Seconds between SIGTERM and SIGKILL: time for the trainer to write its last checkpoint.
GRACE_SECONDS = 300
# The part of the grace period torchrun gives its workers (TRN_SHUTDOWN_TIMEOUT_S) leaves this
# much for torchrun and the entrypoint to exit before the kubelet's SIGKILL.
SHUTDOWN_MARGIN_SECONDS = 30
# TorchNeuron's NEFF cache reads a file-system path only (TORCH_NEURONX_NEFF_CACHE_DIR, no
# s3://), so the native stack shares its compiled graphs on FSx; the XLA stack's
# NEURON_COMPILE_CACHE_URL keeps the S3 cache.
NEFF_CACHE_DIR = f"{FSX_MOUNT}/neuron-cache/neff"
FSX_CLAIM = "fsx"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
DATASETS_CLAIM = "datasets-s3"


@dataclass(frozen=True)
class TrainingWorkspaceProps:
    """What a :class:`TrainingWorkspace` was built with (its ``props``): the keyword arguments of
    its constructor, where each is documented with its default."""

    cluster: eks.ICluster
    file_system: fsx.LustreFileSystem
    datasets: s3.IBucket
    job_role: iam.IRole
    mountpoint_role: iam.IRole
    image_uri: str
    instance_type: str
    compile_cache_url: str
    nodes: int
    fsx_storage_gib: int
    namespace: str
    service_account: str
    neuron_stack: str | None
    gpu_instance_type: str | None
    gpu_image_uri: str | None
    gpu_nodes: int
    devices: device_modes.DeviceMode
    lnc: int | None
    environment: str | None
    capacity: str | None
    capacity_reservation_id: str | None
    gpu_capacity: str | None
    gpu_capacity_reservation_id: str | None


class WorkspaceOptions(TypedDict, total=False):
    """The keyword arguments of :class:`TrainingWorkspace` but ``cluster``, for
    :meth:`NeuronPlugins.add_workspace`; each is documented with its default on the constructor."""

    file_system: Required[fsx.LustreFileSystem]
    datasets: Required[s3.IBucket]
    job_role: Required[iam.IRole]
    mountpoint_role: Required[iam.IRole]
    image_uri: Required[str]
    instance_type: Required[str]
    compile_cache_url: Required[str]
    nodes: int
    fsx_storage_gib: int
    namespace: str
    service_account: str
    neuron_stack: str | None
    gpu_instance_type: str | None
    gpu_image_uri: str | None
    gpu_nodes: int
    devices: device_modes.DeviceMode
    lnc: int | None
    environment: str | None
    capacity: str | None
    capacity_reservation_id: str | None
    gpu_capacity: str | None
    gpu_capacity_reservation_id: str | None


class TrainingWorkspace(Construct):
    """A namespace for training jobs: service account, Pod Identity and volumes.

    Default settings: the namespace and service account, bound to ``job_role`` by Pod Identity;
    a static FSx for Lustre PersistentVolume and claim (ReadWriteMany, reclaim Retain); a
    read-only Mountpoint S3 volume and claim on the datasets bucket; the Mountpoint S3 CSI
    driver (EKS add-on, pinned in the catalog), installed after its service account is bound to
    ``mountpoint_role`` so that its node pods start with credentials.

    It also writes the Kubeflow Trainer ``TrainingRuntime`` ``neuron-torch`` that TrainJobs
    reference: one pod per trn node asking for all of its Neuron devices and EFA interfaces (from
    the instance catalog), the EFA huge pages and CPU and memory that fit the node's allocatable
    (:mod:`trn_catalog.allocatable`), running under the container runtime's default seccomp
    profile without privilege escalation and with every capability dropped but ``IPC_LOCK``
    (:data:`TRAINING_CAPABILITIES`: EFA pins its buffers), tolerating the Neuron taint, with FSx at
    ``/fsx``, the datasets bucket at ``/datasets`` and the compile cache, with the torch policy
    (Kubeflow hands torchrun its rendezvous; the ranks per node, one per logical NeuronCore,
    come from each TrainJob and the image's launcher). The container's environment carries the
    compile cache of each stack (``NEURON_COMPILE_CACHE_URL`` for xla,
    ``TORCH_NEURONX_NEFF_CACHE_DIR`` on FSx for native) and ``TRN_SHUTDOWN_TIMEOUT_S``, the pod's
    grace period less a margin, which the entrypoint hands torchrun as the time its workers get
    to write a last checkpoint after SIGTERM.

    With ``gpu_instance_type`` it also writes the ``cuda-torch`` TrainingRuntime: the same
    trainer, volumes, identity, grace period and torch policy, run from ``gpu_image_uri`` with
    one pod per GPU node asking for all of its GPUs (``nvidia.com/gpu``) and EFA interfaces
    (from the GPU catalog) and the EFA huge pages, selecting and tolerating the GPU node group,
    with libfabric's EFA provider (``FI_PROVIDER=efa``, and ``FI_EFA_USE_DEVICE_RDMA=1`` on
    types with EFA RDMA) for NCCL's aws-ofi-nccl plugin.

    With ``devices='dra'`` the trn pods ask for no extended resources: for each LNC (1 and 2)
    the workspace writes ResourceClaimTemplates (``resource.k8s.io/v1``) for the whole node
    (``neuron-node-lnc<n>``: all Neuron devices and all EFA interfaces, paired by one
    ``matchAttribute`` constraint on ``resource.aws.com/devicegroup<chips>_id``) and for 4 and 8
    connected devices with their EFA interfaces (``neuron-4-lnc<n>``, ``neuron-8-lnc<n>``),
    each with the ``NeuronConfig`` opaque parameters that set the LNC; and one TrainingRuntime
    per LNC whose pod template claims the whole node (``neuron-torch`` at the type's default
    LNC, ``neuron-torch-lnc1``), with ``NEURON_LOGICAL_NC_CONFIG`` to match. Kubeflow Trainer
    2.3.0 cannot patch claims per job, so a job picks its LNC by picking the runtime.

    Attributes:
        manifest (the KubernetesManifest), mountpoint_addon, fsx_claim, datasets_claim,
        runtime_name, gpu_spec (None without a GPU type).

    Raises:
        ValueError: a namespace or service account name that is not a DNS label, an instance
            type outside the catalog, nodes below 1, a ``neuron_stack`` that is unknown or
            cannot run on the instance type (native on trn1), a ``gpu_instance_type`` outside
            the GPU catalog, one without ``gpu_image_uri``, gpu_nodes below 1, ``devices``
            neither ``plugin`` nor ``dra``, ``dra`` on a type the Neuron DRA driver does not
            serve (trn1), an ``lnc`` with ``dra`` or on a type without the setting, or a type
            whose training pod would not fit its node's allocatable CPU and memory.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        file_system: fsx.LustreFileSystem,
        datasets: s3.IBucket,
        job_role: iam.IRole,
        mountpoint_role: iam.IRole,
        image_uri: str,
        instance_type: str,
        compile_cache_url: str,
        nodes: int = 1,
        fsx_storage_gib: int = 1200,
        namespace: str = "training",
        service_account: str = "trainer",
        neuron_stack: str | None = None,
        gpu_instance_type: str | None = None,
        gpu_image_uri: str | None = None,
        gpu_nodes: int = 1,
        devices: device_modes.DeviceMode = "plugin",
        lnc: int | None = None,
        environment: str | None = None,
        capacity: str | None = None,
        capacity_reservation_id: str | None = None,
        gpu_capacity: str | None = None,
        gpu_capacity_reservation_id: str | None = None,
    ) -> None:
        """The props, each with its default (a missing required one: TypeError).

        Args:
            cluster: the EKS cluster (required).
            file_system: the FSx for Lustre file system mounted at the claim ``fsx``
                (required).
            datasets: bucket mounted read-only at the claim ``datasets-s3`` (required).
            job_role: the role jobs get through Pod Identity (required), e.g.
                ``TrainingDataPaths.job_role``.
            mountpoint_role: the Mountpoint S3 driver's role (required), e.g.
                ``TrainingDataPaths.mountpoint_role``.
            image_uri: the training image the runtime runs (required).
            instance_type: the trn type the runtime targets, from the instance catalog
                (required).
            compile_cache_url: ``s3://`` or path base of the XLA stack's compile cache
                (``NEURON_COMPILE_CACHE_URL``, required). The native stack caches on FSx
                instead.
            nodes: default node count of a job. Default 1.
            fsx_storage_gib: the file system's size, stated on its PersistentVolume. Default
                1200.
            namespace: the jobs' namespace. Default ``training``.
            service_account: the jobs' service account. Default ``trainer``.
            neuron_stack: the image's Neuron stack (:class:`TrainingImage`'s ``neuron_stack``),
                ``native`` or ``xla``, checked against ``instance_type`` when given: native
                (TorchNeuron) does not run on trn1. Default None: not checked here; the image's
                entrypoint refuses the mismatch when a job starts.
            gpu_instance_type: a type of the GPU catalog: adds the ``cuda-torch`` runtime for
                the GPU node group. Default None (no GPU runtime).
            gpu_image_uri: the CUDA training image that runtime runs; required with
                ``gpu_instance_type``. Default None.
            gpu_nodes: default node count of a ``cuda-torch`` job. Default 1.
            devices: how the trn pods get their devices: ``plugin`` (default: the device
                plugins' ``aws.amazon.com/neuron`` and ``vpc.amazonaws.com/efa`` resources) or
                ``dra`` (ResourceClaimTemplates, see the class docstring). Match the cluster's.
            lnc: the trn nodes' logical NeuronCore setting on the ``plugin`` path, passed to
                the trainer as ``NEURON_LOGICAL_NC_CONFIG``; give the node group's ``lnc`` (the
                two must agree). Default None: the type's default (2 on trn2/trn3, set; trn1
                has no setting). Not used with ``dra``.
            environment: the environment's name. With it, every training pod carries the label
                ``trn-platform/environment`` (for EKS split cost allocation data) and the
                trainer sends its figures to the CloudWatch agent's EMF listener
                (``TRN_ENVIRONMENT``, ``AWS_EMF_AGENT_ENDPOINT``; the agent must have
                ``logs.metrics_collected.emf``, as :class:`NeuronCluster` configures it).
                Default None: neither.
            capacity: how the trn nodes are paid for (``on-demand``, ``capacity-block`` or
                ``odcr``), passed to the trainer (``TRN_CAPACITY``), which records it in its
                metrics header for ``trnctl compare``. Default None: not passed.
            capacity_reservation_id: their reservation, passed the same way
                (``TRN_CAPACITY_RESERVATION_ID``). Default None: not passed.
            gpu_capacity: ``capacity`` for the GPU node group. Default None: not passed.
            gpu_capacity_reservation_id: ``capacity_reservation_id`` for the GPU node group.
                Default None: not passed.
        """
        super().__init__(scope, construct_id)
        props = props_of(TrainingWorkspaceProps, locals())
        for name in ("namespace", "service_account"):
            value = getattr(props, name)
            if not (value.replace("-", "").isalnum() and value.islower() and len(value) <= 63):
                raise ValueError(f"{name} {value!r} is not a lowercase DNS label")
        if props.nodes < 1:
            raise ValueError(f"nodes {props.nodes} is not allowed; use 1 or more")
        try:
            self.spec = trn_catalog.get(props.instance_type)
        except trn_catalog.UnknownInstanceTypeError as error:
            raise ValueError(f"instance_type: {error}") from None
        _check_stack(props.neuron_stack, props.instance_type)
        _check_devices(props, self.spec)
        self.gpu_spec = _gpu_spec(props)
        self.props = props
        self.runtime_name = RUNTIME_NAME
        self.fsx_claim = FSX_CLAIM
        self.datasets_claim = DATASETS_CLAIM
        self._pod_identity("JobIdentity", props.job_role, props.namespace, props.service_account)
        mountpoint = versions.addon(MOUNTPOINT_ADDON)
        mountpoint_identity = self._pod_identity(
            "MountpointIdentity", props.mountpoint_role, *versions.service_account(mountpoint.name)
        )
        # After the association, so the driver's node pods start with its credentials.
        self.mountpoint_addon = install_addon(self, props.cluster, mountpoint)
        self.mountpoint_addon.node.add_dependency(mountpoint_identity)
        self.manifest = eks.KubernetesManifest(
            self,
            "Manifest",
            cluster=props.cluster,
            manifest=self.manifests(),
            prune=True,
        )

    def _pod_identity(
        self, construct_id: str, role: iam.IRole, namespace: str, service_account: str
    ) -> eks.CfnPodIdentityAssociation:
        return eks.CfnPodIdentityAssociation(
            self,
            construct_id,
            cluster_name=self.props.cluster.cluster_name,
            namespace=namespace,
            service_account=service_account,
            role_arn=role.role_arn,
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
                    "mountOptions": [
                        "read-only",
                        "allow-other",
                        f"region {region}",
                        # Mountpoint pods cannot reach IMDS (hop limit 1), so without this it
                        # assumes 10 Gbps; S3 traffic uses the primary interface's network card.
                        f"maximum-throughput-gbps {self.spec.efa_gbps // self.spec.network_cards}",
                    ],
                    "csi": {
                        "driver": "s3.csi.aws.com",
                        "volumeHandle": f"{namespace}-datasets-s3",
                        "volumeAttributes": {"bucketName": props.datasets.bucket_name},
                    },
                },
            },
            _claim(DATASETS_CLAIM, namespace, f"{namespace}-datasets-s3", "ReadOnlyMany", "1200Gi"),
            *self.claim_templates(),
            *self.training_runtimes(),
            *([self.gpu_training_runtime()] if self.gpu_spec is not None else []),
        ]

    def claim_templates(self) -> list[dict[str, Any]]:
        """The ResourceClaimTemplates of ``devices='dra'`` (none with ``plugin``)."""
        if self.props.devices != "dra":
            return []
        return [
            device_modes.claim_template(self.spec, size, lnc, self.props.namespace)
            for lnc in device_modes.LNC_VALUES
            for size in device_modes.claim_sizes(self.spec)
        ]

    def training_runtimes(self) -> list[dict[str, Any]]:
        """The trn TrainingRuntimes: ``neuron-torch``, and with ``dra`` one more per other LNC."""
        if self.props.devices != "dra":
            return [self.training_runtime()]
        return [
            self._runtime(
                device_modes.runtime_name(self.spec, lnc), self.props.nodes, self.pod_spec(lnc)
            )
            for lnc in device_modes.LNC_VALUES
        ]

    def training_runtime(self) -> dict[str, Any]:
        """The ``neuron-torch`` TrainingRuntime (Kubeflow Trainer v2, one pod per node).

        Ranks per node are not set here: Trainer 2.2.0 removed the runtime's
        ``mlPolicy.torch.numProcPerNode``; each TrainJob carries ``spec.trainer.numProcPerNode``
        (``trnctl``), and the image's launcher takes the count from the catalog either way."""
        return self._runtime(RUNTIME_NAME, self.props.nodes, self.pod_spec())

    def gpu_training_runtime(self) -> dict[str, Any]:
        """The ``cuda-torch`` TrainingRuntime: the trainer on the GPU node group.

        Raises:
            ValueError: the workspace has no ``gpu_instance_type``."""
        if self.gpu_spec is None:
            raise ValueError("gpu_instance_type is not set: this workspace has no GPU runtime")
        return self._runtime(GPU_RUNTIME_NAME, self.props.gpu_nodes, self.gpu_pod_spec())

    def _runtime(self, name: str, nodes: int, pod_spec: dict[str, Any]) -> dict[str, Any]:
        props = self.props
        ancestor = {TRAINER_ANCESTOR_LABEL: TRAINER_ANCESTOR}
        return {
            "apiVersion": f"{TRAINER_API_GROUP}/{TRAINER_API_VERSION}",
            "kind": "TrainingRuntime",
            "metadata": {
                "name": name,
                "namespace": props.namespace,
                "labels": {"trainer.kubeflow.org/framework": "torch"},
            },
            "spec": {
                "mlPolicy": {"numNodes": nodes, "torch": {}},
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {
                                "name": TRAINER_CONTAINER,
                                "template": {
                                    "metadata": {"labels": ancestor},
                                    "spec": {"template": self._pod_template(pod_spec)},
                                },
                            }
                        ]
                    }
                },
            },
        }

    def _pod_template(self, pod_spec: dict[str, Any]) -> dict[str, Any]:
        """The pod template: with an ``environment``, the pods carry its label, which EKS split
        cost allocation data can import as a cost allocation tag."""
        if self.props.environment is None:
            return {"spec": pod_spec}
        labels = {obs.ENVIRONMENT_LABEL: self.props.environment}
        return {"metadata": {"labels": labels}, "spec": pod_spec}

    def _platform_env(self, capacity: str | None, reservation: str | None) -> list[dict[str, Any]]:
        """What the trainer names its metrics by: the job (the JobSet's name, which Kubeflow
        Trainer gives the TrainJob's), and with an ``environment`` the environment, the
        CloudWatch agent and the capacity."""
        job_label = f"metadata.labels['{obs.JOB_NAME_LABEL}']"
        env: list[dict[str, Any]] = [
            {"name": obs.JOB_ENV, "valueFrom": {"fieldRef": {"fieldPath": job_label}}}
        ]
        if self.props.environment is not None:
            env += [
                {"name": obs.ENVIRONMENT_ENV, "value": self.props.environment},
                {"name": obs.EMF_AGENT_ENDPOINT_ENV, "value": obs.EMF_AGENT_ENDPOINT},
            ]
        for name, value in (
            (obs.CAPACITY_ENV, capacity),
            (obs.CAPACITY_RESERVATION_ENV, reservation),
        ):
            if value:
                env.append({"name": name, "value": value})
        return env

    def pod_spec(self, lnc: int | None = None) -> dict[str, Any]:
        """The pod of one trn node in a job: all its devices, EFA, storage and identity. With
        ``devices='dra'`` the devices come from the whole-node claim template of ``lnc``
        (default: the type's default LNC)."""
        props, spec = self.props, self.spec
        dra = props.devices == "dra"
        node = training_pod_resources(spec)
        if dra:
            node.pop("vpc.amazonaws.com/efa")
            resources = node
            lnc = spec.default_lnc if lnc is None else lnc
        else:
            resources = {"aws.amazon.com/neuron": spec.chips, **node}
            # Stated even at the type's default: the compiler's and the runtime's LNC then come
            # from the workspace, never from a default that another node setting contradicts.
            default = spec.default_lnc if device_modes.supports_lnc(spec) else None
            lnc = default if props.lnc is None else props.lnc
        env = [
            {"name": "TRN_INSTANCE_TYPE", "value": props.instance_type},
            {"name": "NEURON_COMPILE_CACHE_URL", "value": props.compile_cache_url},
            {"name": "TORCH_NEURONX_NEFF_CACHE_DIR", "value": NEFF_CACHE_DIR},
            *([{"name": device_modes.LNC_ENV, "value": str(lnc)}] if lnc is not None else []),
            *self._platform_env(props.capacity, props.capacity_reservation_id),
        ]
        pod = self._pod(
            props.image_uri,
            {NODE_TYPE_LABEL: TRAINIUM_NODE_TYPE, INSTANCE_TYPE_LABEL: props.instance_type},
            NEURON_TOLERATION,
            env,
            resources,
        )
        if dra and lnc is not None:
            template = device_modes.claim_template_name(spec, spec.chips, lnc)
            pod["resourceClaims"] = [
                {"name": device_modes.POD_CLAIM, "resourceClaimTemplateName": template}
            ]
            pod["containers"][0]["resources"]["claims"] = [{"name": device_modes.POD_CLAIM}]
        return pod

    def gpu_pod_spec(self) -> dict[str, Any]:
        """The pod of one GPU node in a ``cuda-torch`` job: all its GPUs, EFA, the same storage
        and identity as the trn pods.

        Raises:
            ValueError: the workspace has no ``gpu_instance_type``."""
        props, spec = self.props, self.gpu_spec
        if spec is None or props.gpu_image_uri is None:
            raise ValueError("gpu_instance_type is not set: this workspace has no GPU runtime")
        resources = {
            GPU_RESOURCE: spec.gpus,
            **training_pod_resources(spec),
        }
        # aws-ofi-nccl runs NCCL over libfabric's EFA provider. Its docs (doc/efa-env-var.md,
        # v1.21.1): FI_PROVIDER=efa "use for aws-ofi-nccl<=1.5.0"; FI_EFA_USE_DEVICE_RDMA=1 not
        # needed with libfabric >= 1.18 and the plugin >= 1.7, "not harmful" on p4/p5; set here
        # for older plugins, RDMA only where the type's EFA has it (EC2's EFA table). What keeps
        # NCCL on EFA across nodes is the launcher's NCCL_NET.
        env = [
            {"name": GPU_INSTANCE_TYPE_ENV, "value": spec.name},
            {"name": "FI_PROVIDER", "value": "efa"},
            *([{"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"}] if spec.efa_rdma else []),
            *self._platform_env(props.gpu_capacity, props.gpu_capacity_reservation_id),
        ]
        return self._pod(
            props.gpu_image_uri,
            {NODE_TYPE_LABEL: GPU_NODE_TYPE, INSTANCE_TYPE_LABEL: spec.name},
            GPU_TOLERATION,
            env,
            resources,
        )

    def _pod(
        self,
        image: str,
        node_selector: dict[str, str],
        toleration: dict[str, str],
        env: list[dict[str, Any]],
        resources: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "serviceAccountName": self.props.service_account,
            "terminationGracePeriodSeconds": GRACE_SECONDS,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "nodeSelector": node_selector,
            "tolerations": [toleration],
            "containers": [
                {
                    "name": TRAINER_CONTAINER,
                    "image": image,
                    "securityContext": container_security_context(),
                    "env": [
                        *env,
                        {
                            "name": "TRN_SHUTDOWN_TIMEOUT_S",
                            "value": str(GRACE_SECONDS - SHUTDOWN_MARGIN_SECONDS),
                        },
                    ],
                    "resources": {"limits": resources, "requests": resources},
                    "volumeMounts": [
                        {"name": "fsx", "mountPath": FSX_MOUNT},
                        {"name": "datasets", "mountPath": DATASETS_MOUNT, "readOnly": True},
                        {"name": "dshm", "mountPath": "/dev/shm"},
                    ],
                }
            ],
            "volumes": [
                {"name": "fsx", "persistentVolumeClaim": {"claimName": FSX_CLAIM}},
                {
                    "name": "datasets",
                    "persistentVolumeClaim": {"claimName": DATASETS_CLAIM, "readOnly": True},
                },
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
            ],
        }


def container_security_context() -> dict[str, Any]:
    """The training container's: no privilege escalation, every capability dropped but
    :data:`TRAINING_CAPABILITIES`; the pod adds the container runtime's seccomp profile."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": list(TRAINING_CAPABILITIES)},
    }


def training_pod_resources(
    spec: trn_catalog.InstanceSpec | trn_catalog.GpuInstanceSpec,
) -> dict[str, Any]:
    """The training pod's requests (and limits) on a node of ``spec``: its EFA interfaces and
    their huge pages, three quarters of its memory and all but 8 of its CPUs (half of them on a
    small type), leaving room for the kubelet, the node's agents and the host's page cache.

    Raises:
        ValueError: the requests do not fit what a node of the type leaves the training pod
            (:func:`trn_catalog.allocatable.for_the_training_pod`): the pod would stay Pending.
    """
    memory_gib = spec.memory_gib * 3 // 4
    cpus = spec.vcpus - 8 if spec.vcpus > 16 else spec.vcpus // 2
    room = allocatable.for_the_training_pod(spec)
    if cpus * 1000 > room.millicpu or memory_gib * allocatable.MIB_PER_GIB > room.memory_mib:
        raise ValueError(
            f"instance type {spec.name}: the training pod's requests ({cpus} CPUs, "
            f"{memory_gib}Gi) exceed what a node leaves it ({room.millicpu}m CPU, "
            f"{room.memory_mib}Mi): it would never be scheduled"
        )
    return {
        "vpc.amazonaws.com/efa": spec.efa_interfaces,
        "hugepages-2Mi": EFA_HUGEPAGES,
        "memory": f"{memory_gib}Gi",
        "cpu": str(cpus),
    }


def _gpu_spec(props: TrainingWorkspaceProps) -> trn_catalog.GpuInstanceSpec | None:
    if props.gpu_instance_type is None:
        return None
    try:
        spec = trn_catalog.get_gpu(props.gpu_instance_type)
    except trn_catalog.UnknownGpuInstanceTypeError as error:
        raise ValueError(f"gpu_instance_type: {error}") from None
    if not props.gpu_image_uri:
        raise ValueError(
            f"gpu_image_uri is missing; gpu_instance_type {props.gpu_instance_type!r} needs "
            "the CUDA training image to run"
        )
    if props.gpu_nodes < 1:
        raise ValueError(f"gpu_nodes {props.gpu_nodes} is not allowed; use 1 or more")
    return spec


def _check_devices(props: TrainingWorkspaceProps, spec: trn_catalog.InstanceSpec) -> None:
    if props.devices not in device_modes.DEVICE_MODES:
        raise ValueError(
            f"devices {props.devices!r} is not allowed; use "
            f"{' or '.join(device_modes.DEVICE_MODES)}"
        )
    if props.devices == "dra" and not device_modes.supports_dra(spec):
        raise ValueError(
            f"devices 'dra': the Neuron DRA driver serves trn2 and trn3 types, not "
            f"{props.instance_type}"
        )
    if props.lnc is None:
        return
    if props.devices == "dra":
        raise ValueError(
            "lnc is a node setting of devices 'plugin'; with 'dra' each job picks its LNC by "
            "its runtime"
        )
    problem = device_modes.lnc_problem(spec, props.lnc)
    if problem:
        raise ValueError(f"lnc {props.lnc!r} is not allowed: {problem}")


def _check_stack(stack: str | None, instance_type: str) -> None:
    if stack is None:
        return
    problem = neuron_stacks.stack_problem(stack, instance_type)
    if problem:
        raise ValueError(f"neuron_stack: {problem}")


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
