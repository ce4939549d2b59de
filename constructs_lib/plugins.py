"""NeuronPlugins: the Neuron and EFA device plugins and the job engine on any EKS cluster."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

from aws_cdk import Aws, CfnMapping, Duration, Stack, Token
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

import trn_catalog
from constructs_lib._common import acknowledge_wildcards
from constructs_lib._eks import SYSTEM_LABEL, add_pod_identity
from constructs_lib._props import EMPTY_LABELS, props_of
from trn_catalog import devices as device_modes
from trn_catalog import registries, versions
from trn_catalog.workspace import GPU_NODE_TYPE, NODE_TYPE_LABEL

if TYPE_CHECKING:
    from constructs_lib.workspace import TrainingWorkspace, WorkspaceOptions

# No key and no effect: tolerates every taint. The node problem detector must keep running on
# the degraded nodes it reports, whatever taints them; the device agents (Neuron device plugin or
# DRA driver, EFA device plugin or aws-dranet, NVIDIA device plugin) run only where their node
# affinity puts them, and a taint added to a node group (TrainiumNodeGroup's `taints`) that they
# did not tolerate would leave its nodes without devices.
TOLERATE_ALL = {"operator": "Exists"}
# The image of the Neuron chart's second scheduler (`my-scheduler`), a kube-scheduler of EKS
# Distro; its tag must be of the control plane's Kubernetes minor version.
KUBE_SCHEDULER_IMAGE = "public.ecr.aws/eks-distro/kubernetes/kube-scheduler"
NPD_NAMESPACE = "neuron-healthcheck-system"
NPD_SERVICE_ACCOUNT = "node-problem-detector"
# Requests for the pods whose pinned chart states none, so that the scheduler counts them
# (each chart's values.yaml at its pin: `resources: {}`). Device plugins: 10m and 64Mi, between
# the EFA device plugin chart's 10m and 20Mi (v0.5.30) and the Neuron DRA driver's 10m and 128Mi
# (neuron-helm-chart 1.9.0). Kubeflow Trainer's manager: the 100m and 300Mi its values.yaml
# (2.3.0) suggests in a comment. The Neuron chart's second scheduler keeps its chart's 0.1 CPU
# and gets memory for a kube-scheduler's informers. The charts' other pods come with requests:
# the node problem detector and node recovery (10m/80Mi, 10m/150Mi), the DRA driver, the EFA
# device plugin, aws-dranet (100m/50Mi) and JobSet's controller (500m/128Mi, chart 0.12.0).
DEVICE_PLUGIN_REQUESTS = {"requests": {"cpu": "10m", "memory": "64Mi"}}
TRAINER_MANAGER_REQUESTS = {"requests": {"cpu": "100m", "memory": "300Mi"}}
SECOND_SCHEDULER_REQUESTS = {"requests": {"cpu": "0.1", "memory": "128Mi"}}


@dataclass(frozen=True)
class NeuronPluginsProps:
    """What a :class:`NeuronPlugins` was built with (its ``props``): the keyword arguments of its
    constructor, where each is documented with its default."""

    cluster: eks.ICluster
    job_engine: bool
    neuron_scheduler_tag: str | None
    system_node_labels: Mapping[str, str]
    devices: device_modes.DeviceMode


class NeuronPlugins(Construct):
    """What Trainium (and EFA GPU) nodes need from the cluster, installed on an existing one.

    Default settings: the Neuron Helm chart (device plugin on the catalog's types; node problem
    detector with node recovery, with a Pod Identity role allowed to mark this cluster's broken
    nodes unhealthy; the scheduler extension only with ``neuron_scheduler_tag``); the EFA device
    plugin chart on the catalogs' trn and GPU types, its image (and aws-dranet's) pulled from
    the EKS registry of the stack's region (the charts default to us-west-2's); every one of
    these node agents tolerating every taint, so that a taint added to a node group keeps them
    on its nodes; and, with ``job_engine``, Kubeflow Trainer with its CRDs and no built-in
    runtimes, its manager on the nodes of ``system_node_labels``. Charts are the pins of
    :mod:`trn_catalog.versions`, installed atomically with a 12-minute Helm timeout.

    Your cluster must run the EKS Pod Identity Agent add-on (the node problem detector's role
    reaches it through Pod Identity), CoreDNS and nodes that can run the charts' controllers;
    make the charts depend on them with ``plugins.node.add_dependency(...)`` when they are in
    the same app. Add the NVIDIA device plugin for a :class:`GpuNodeGroup` with
    :meth:`add_nvidia_device_plugin`, and a namespace for jobs with :meth:`add_workspace`.

    Attributes:
        cluster, charts (release -> eks.HelmChart), npd_role, npd_namespace (the manifest),
        image_registry (the region's EKS registry host, or a deploy-time lookup in a stack
        without a region).

    Raises:
        ValueError: a stack region whose EKS registry :mod:`trn_catalog.registries` does not
            list, ``cluster`` has no kubectl provider (neither made by CDK nor imported with
            ``kubectl_provider``), ``devices`` is neither ``plugin`` nor ``dra``, or ``dra``
            with ``neuron_scheduler_tag`` (the chart refuses the DRA driver beside the
            scheduler extension).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        job_engine: bool = True,
        neuron_scheduler_tag: str | None = None,
        system_node_labels: Mapping[str, str] = EMPTY_LABELS,
        devices: device_modes.DeviceMode = "plugin",
    ) -> None:
        """The props, each with its default (a missing required one: TypeError).

        Args:
            cluster: the EKS cluster (required): one made in this app, or imported with
                ``eks.Cluster.from_cluster_attributes(..., kubectl_provider=...)`` naming your
                kubectl provider (``eks.KubectlProvider.from_kubectl_provider_attributes``; an
                imported cluster ignores ``kubectl_provider_options``); Helm installs the charts
                through it.
            job_engine: install Kubeflow Trainer (the TrainJob engine
                :class:`TrainingWorkspace`'s runtimes need). Default True.
            neuron_scheduler_tag: turns on the Neuron chart's scheduler extension and its second
                scheduler ``my-scheduler`` from :data:`KUBE_SCHEDULER_IMAGE` at this tag, which
                must be of the control plane's Kubernetes minor (``NeuronCluster`` checks it;
                here it is yours to match). Default None: off.
            system_node_labels: node labels that pick where the job engine's manager and the
                Neuron scheduler run, e.g. your system node group's. Default none: any node.
            devices: ``plugin`` (default) installs the Neuron and EFA device plugins; ``dra``
                installs the Neuron DRA driver (device plugin and scheduler extension off; the
                chart creates the ``neuron.aws.com`` DeviceClass) and the ``aws-dranet`` EFA DRA
                driver on the catalog's trn2/trn3 types (it creates ``efa.networking.k8s.aws``),
                and keeps the EFA device plugin to the GPU catalog's types. The cluster must run
                Kubernetes 1.34 or later with managed or self-managed node groups (the ones this
                was built and tested for; the EKS guide also lists Karpenter 1.15+ and, from
                Kubernetes 1.36, EKS Auto Mode): yours to ensure on an imported cluster.
        """
        super().__init__(scope, construct_id)
        props = props_of(NeuronPluginsProps, locals())
        if cluster.kubectl_provider is None:
            raise ValueError(
                f"cluster {cluster.node.path!r} has no kubectl provider, which installs the "
                "charts; import it with kubectl_provider=eks.KubectlProvider."
                "from_kubectl_provider_attributes(...) or pass a cluster made in this app"
            )
        _check_devices(props)
        self.props = props
        self.cluster = cluster
        self.image_registry = eks_image_registry(self)
        self.npd_role = add_pod_identity(
            self,
            "NodeProblemDetector",
            cluster,
            NPD_NAMESPACE,
            NPD_SERVICE_ACCOUNT,
            statements=node_recovery_statements(cluster.cluster_name),
        )
        acknowledge_wildcards(
            self.npd_role,
            "Neuron node recovery: Describe calls take no resource ARNs; SetInstanceHealth is "
            "conditioned on this cluster's tag and PutMetricData on its namespace.",
        )
        self.charts: dict[str, eks.HelmChart] = {
            versions.NEURON_CHART.release: self._chart(
                versions.NEURON_CHART,
                neuron_values(props.neuron_scheduler_tag, props.system_node_labels, props.devices),
            ),
            versions.EFA_CHART.release: self._chart(
                versions.EFA_CHART, efa_values(self.image_registry, props.devices)
            ),
        }
        if props.devices == "dra":
            self.charts[versions.DRANET_CHART.release] = self._chart(
                versions.DRANET_CHART, dranet_values(self.image_registry)
            )
        if props.job_engine:
            self.charts[versions.TRAINER_CHART.release] = self._chart(
                versions.TRAINER_CHART, trainer_values(props.system_node_labels)
            )
        # The Neuron chart puts the node problem detector in its own namespace but, since its
        # 1.x layout, no longer creates it; the atomic install would fail and roll back.
        self.npd_namespace = cluster.add_manifest(
            "NpdNamespace",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NPD_NAMESPACE}},
        )
        # The node problem detector's pods read their Pod Identity credentials when they start.
        self.charts[versions.NEURON_CHART.release].node.add_dependency(
            self.npd_namespace, self.npd_role.node.find_child("PodIdentity")
        )

    @property
    def pod_identity(self) -> eks.CfnPodIdentityAssociation:
        """The node problem detector's Pod Identity association."""
        association = self.npd_role.node.find_child("PodIdentity")
        assert isinstance(association, eks.CfnPodIdentityAssociation)
        return association

    def add_nvidia_device_plugin(self) -> eks.HelmChart:
        """The NVIDIA device plugin chart of :data:`trn_catalog.versions.NVIDIA_DEVICE_PLUGIN_CHART`
        on the GPU node group's nodes (once; later calls return the same chart), in ``charts``."""
        pin = versions.NVIDIA_DEVICE_PLUGIN_CHART
        if pin.release not in self.charts:
            self.charts[pin.release] = self._chart(pin, nvidia_device_plugin_values())
        return self.charts[pin.release]

    def add_workspace(
        self, construct_id: str, **kwargs: Unpack[WorkspaceOptions]
    ) -> TrainingWorkspace:
        """A :class:`TrainingWorkspace` on this cluster (``kwargs``: its keyword arguments but
        ``cluster``, each documented there with its default), applied after the charts: its
        runtimes are Kubeflow Trainer objects.

        Raises:
            ValueError: ``job_engine`` is off (nothing would run the workspace's runtimes), and
                every error of :class:`TrainingWorkspace`.
        """
        from constructs_lib.workspace import TrainingWorkspace

        if not self.props.job_engine:
            raise ValueError(
                "job_engine is False: a workspace's TrainingRuntimes need Kubeflow Trainer; "
                "construct NeuronPlugins with job_engine=True"
            )
        workspace = TrainingWorkspace(self, construct_id, cluster=self.cluster, **kwargs)
        for chart in self.charts.values():
            workspace.manifest.node.add_dependency(chart)
        return workspace

    def _chart(self, pin: versions.ChartPin, values: dict[str, Any]) -> eks.HelmChart:
        return self.cluster.add_helm_chart(
            f"Chart-{pin.release}",
            chart=pin.chart,
            repository=pin.repository,
            version=pin.version,
            release=pin.release,
            namespace=pin.namespace,
            create_namespace=True,
            values=values,
            wait=True,
            atomic=True,
            # Under the kubectl handler's 15-minute Lambda limit, so that a chart that never
            # gets ready is rolled back by Helm rather than left pending (aws-cdk#22257).
            timeout=Duration.minutes(12),
        )


def _check_devices(props: NeuronPluginsProps) -> None:
    if props.devices not in device_modes.DEVICE_MODES:
        raise ValueError(
            f"devices {props.devices!r} is not allowed; use "
            f"{' or '.join(device_modes.DEVICE_MODES)}"
        )
    if props.devices == "dra" and props.neuron_scheduler_tag is not None:
        raise ValueError(
            "devices 'dra' with neuron_scheduler_tag: the Neuron chart refuses its DRA driver "
            "beside the scheduler extension; DRA places connected devices itself"
        )


def neuron_values(
    scheduler_tag: str | None = None,
    node_selector: Mapping[str, str] = SYSTEM_LABEL,
    devices: device_modes.DeviceMode = "plugin",
) -> dict[str, Any]:
    """Values of the Neuron chart: the device plugin on the catalog's types (or, with
    ``devices='dra'``, the DRA driver instead), the node problem detector with node recovery,
    and the scheduler extension only with ``scheduler_tag`` (the kube-scheduler tag of
    ``my-scheduler``; off otherwise, where the chart would run its 1.31), on the nodes of
    ``node_selector``."""
    if devices == "dra":
        return _neuron_dra_values()
    scheduler: dict[str, Any] = {"enabled": False}
    if scheduler_tag is not None:
        selector = {"nodeSelector": dict(node_selector)} if node_selector else {}
        scheduler = {
            "enabled": True,
            **selector,
            "resources": _copy(DEVICE_PLUGIN_REQUESTS),
            "customScheduler": {
                "enabled": True,
                "image": {"repository": KUBE_SCHEDULER_IMAGE, "tag": scheduler_tag},
                "resources": _copy(SECOND_SCHEDULER_REQUESTS),
                **selector,
            },
        }
    return {
        "neuronInstances": sorted(trn_catalog.CATALOG),
        "devicePlugin": {
            "enabled": True,
            "tolerations": [TOLERATE_ALL],
            "resources": _copy(DEVICE_PLUGIN_REQUESTS),
        },
        "scheduler": scheduler,
        "npd": _npd_values(),
        "draDriver": {"enabled": False},
    }


def _npd_values() -> dict[str, Any]:
    return {
        "enabled": True,
        # Helm replaces lists: any list here is the detector's only tolerations.
        "tolerations": [TOLERATE_ALL],
        "nodeRecovery": {"enabled": True},
    }


def _dra_types() -> list[str]:
    """The catalog's types the Neuron DRA driver serves (trn2/trn3), sorted."""
    return sorted(
        name for name, spec in trn_catalog.CATALOG.items() if device_modes.supports_dra(spec)
    )


def _neuron_dra_values() -> dict[str, Any]:
    """The Neuron chart with its DRA driver: device plugin and scheduler extension off (the
    chart's validateConfig fails the render otherwise), the driver on the catalog's types (its
    affinity comes from ``neuronInstances``), tolerating every taint."""
    # The node problem detector and node recovery stay on under DRA. The chart's documented DRA
    # install turns `npd` off but gives no reason, and nothing in chart 1.9.0 ties them to the
    # device plugin: the detector only reads the kernel log (/dev/kmsg) for Neuron hardware
    # errors and node recovery marks the instance unhealthy through Auto Scaling, so that the
    # managed node group replaces it. DRA's own per-device health (device taints) is beta and
    # not in chart 1.9.0; without the detector a broken DRA node would keep taking jobs.
    return {
        "neuronInstances": _dra_types(),
        "devicePlugin": {"enabled": False},
        "scheduler": {"enabled": False},
        "npd": _npd_values(),
        "draDriver": {"enabled": True, "tolerations": [TOLERATE_ALL]},
    }


def eks_image_registry(scope: Construct) -> str:
    """The EKS registry of ``scope``'s region (:func:`trn_catalog.registries.eks_registry`); in a
    stack without a region, a lookup of the catalog's registries at deploy time.

    Raises:
        ValueError: a region whose registry the catalog does not list.
    """
    stack = Stack.of(scope)
    if not Token.is_unresolved(stack.region):
        try:
            return registries.eks_registry(stack.region)
        except registries.UnknownRegistryRegionError as error:
            raise ValueError(str(error)) from None
    mapping_id = "EksImageRegistries"
    mapping = stack.node.try_find_child(mapping_id)
    if not isinstance(mapping, CfnMapping):
        mapping = CfnMapping(
            stack,
            mapping_id,
            mapping={
                region: {"Registry": registries.eks_registry(region)}
                for region in registries.EKS_REGISTRY_ACCOUNTS
            },
        )
    return mapping.find_in_map(Aws.REGION, "Registry")


def efa_values(registry: str, devices: device_modes.DeviceMode = "plugin") -> dict[str, Any]:
    """Values of the EFA device plugin chart: the image from ``registry`` (the region's EKS
    registry, :func:`eks_image_registry`; the chart's default is us-west-2's), the two catalogs'
    types, every taint tolerated. With ``devices='dra'`` the GPU catalog's types only: the trn
    nodes get their EFA interfaces from aws-dranet, and the two must not share a node (EKS
    device-management-efa)."""
    # The chart's allowlist (v0.5.30) has no trn3 entry. Helm replaces
    # lists, so this allowlist is the two catalogs' types alone: the only EFA nodes the platform
    # runs, the trn nodes and the optional GPU group's. The chart adds CriticalAddonsOnly itself.
    trn_types = trn_catalog.CATALOG if devices == "plugin" else {}
    return {
        "image": {"repository": f"{registry}/{registries.EFA_DEVICE_PLUGIN_IMAGE.repository}"},
        "supportedInstanceLabels": {
            "keys": ["node.kubernetes.io/instance-type"],
            "values": sorted({*trn_types, *trn_catalog.GPU_CATALOG}),
        },
        "tolerations": [TOLERATE_ALL],
    }


def dranet_values(registry: str) -> dict[str, Any]:
    """Values of the aws-dranet chart: the image from ``registry`` (as :func:`efa_values`), the
    EFA DRA driver on the catalog's trn2/trn3 types, tolerating every taint, with the chart's
    DeviceClass ``efa.networking.k8s.aws``."""
    # The chart's own list already names trn2, trn2u and trn3.48xlarge; Helm replaces lists,
    # so this one is the DRA-capable catalog types alone (trn3.48xlarge among them), keeping the
    # driver off every other node, including the GPU group's, whose EFA the device plugin serves.
    return {
        "image": {"repository": f"{registry}/{registries.DRANET_IMAGE.repository}"},
        "supportedInstanceLabels": {
            "keys": ["node.kubernetes.io/instance-type"],
            "values": _dra_types(),
        },
        "tolerations": [TOLERATE_ALL],
        "deviceClass": {"create": True, "name": device_modes.EFA_DEVICE_CLASS},
    }


def nvidia_device_plugin_values() -> dict[str, Any]:
    """Values of the NVIDIA device plugin chart: the plugin on the GPU node group only.

    The chart's default affinity asks for node-feature-discovery labels, and NFD is not
    installed (it comes with gpu-feature-discovery, off); Helm replaces the term list, so this
    affinity is the GPU group's node label alone. It tolerates every taint (the chart's default
    list names the GPU taint and the deprecated CriticalAddonsOnly)."""
    gpu_nodes = {"key": NODE_TYPE_LABEL, "operator": "In", "values": [GPU_NODE_TYPE]}
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [gpu_nodes]}]
                }
            }
        },
        "nodeSelector": {NODE_TYPE_LABEL: GPU_NODE_TYPE},
        "tolerations": [TOLERATE_ALL],
        "resources": _copy(DEVICE_PLUGIN_REQUESTS),
    }


def trainer_values(node_selector: Mapping[str, str] = SYSTEM_LABEL) -> dict[str, Any]:
    """Values of the Kubeflow Trainer chart: CRDs, no built-in runtimes, no data cache, the
    manager on the nodes of ``node_selector`` (any node when empty)."""
    # Jobs run on the workspace's own `neuron-torch` TrainingRuntime. The chart's built-in
    # ClusterTrainingRuntimes (CUDA images) come with a post-install hook Job that pulls alpine
    # from Docker Hub and installs kubectl at run time, a failure point of the atomic install
    # for runtimes nothing here uses; LeaderWorkerSet serves only the data cache, which is off.
    selector = {"nodeSelector": dict(node_selector)} if node_selector else {}
    return {
        "crds": {"enabled": True},
        "runtimes": {"defaultEnabled": False, "torchDistributed": {"enabled": False}},
        "dataCache": {"enabled": False, "lws": {"install": False}},
        "manager": {**selector, "resources": _copy(TRAINER_MANAGER_REQUESTS)},
    }


def _copy(requests: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """A fresh copy of ``requests``: each chart's values are their own objects."""
    return {key: dict(value) for key, value in requests.items()}


def node_recovery_statements(cluster_name: str) -> list[iam.PolicyStatement]:
    """Neuron node recovery: mark a broken trn node unhealthy so its group replaces it."""
    # Describe calls cannot be scoped to resources; SetInstanceHealth is limited to this
    # cluster's node groups by tag and PutMetricData to the NeuronHealthCheck namespace.
    return [
        iam.PolicyStatement(
            actions=["autoscaling:SetInstanceHealth"],
            resources=["*"],
            conditions={"StringEquals": {"autoscaling:ResourceTag/eks:cluster-name": cluster_name}},
        ),
        iam.PolicyStatement(
            actions=["autoscaling:DescribeAutoScalingInstances", "ec2:DescribeInstances"],
            resources=["*"],
        ),
        iam.PolicyStatement(
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": "NeuronHealthCheck"}},
        ),
    ]
