"""NeuronCluster: an EKS cluster ready for Trainium: add-ons, Neuron and EFA plugins, job engine."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack, cast

import jsii
from aws_cdk import IStableStringProducer, Lazy, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from constructs_lib._common import (
    acknowledge,
    acknowledge_managed_policies,
    acknowledge_wildcards,
    launch_template,
    launch_template_data,
    worker_node_role,
)
from constructs_lib._eks import (
    GPU_TOLERATION as GPU_TOLERATION,
)
from constructs_lib._eks import (
    MOUNTPOINT_ADDON,
    SYSTEM_LABEL,
    add_pod_identity,
    install_addon,
)
from constructs_lib._eks import (
    NEURON_TOLERATION as NEURON_TOLERATION,
)
from constructs_lib._props import props_of
from constructs_lib.gpu_nodegroup import GpuNodeGroup
from constructs_lib.plugins import KUBE_SCHEDULER_IMAGE, NeuronPlugins
from constructs_lib.plugins import neuron_values as neuron_values
from constructs_lib.plugins import nvidia_device_plugin_values as nvidia_device_plugin_values
from constructs_lib.trainium_nodegroup import (
    NAME_PREFIX,
    NodeGroupOptions,
    TrainiumNodeGroup,
    efa_security_group,
    nodegroup_digest,
)
from trn_catalog import devices as device_modes
from trn_catalog import formats, ultraservers, versions

NODE_BOOTSTRAP_ADDONS = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent")
WORKSPACE_ADDONS = (MOUNTPOINT_ADDON,)
# The system node group's launch template data (with IMDSv2 and the stack's tags added).
SYSTEM_LAUNCH_DATA: dict[str, Any] = {
    "BlockDeviceMappings": [
        {
            "DeviceName": "/dev/xvda",
            "Ebs": {"VolumeSize": 100, "VolumeType": "gp3", "Encrypted": True},
        }
    ],
}
# Add-ons that call AWS: their Pod Identity role (construct id) and AWS-managed policies.
ADDON_ROLES = {
    "vpc-cni": ("VpcCni", ("AmazonEKS_CNI_Policy",)),
    "amazon-cloudwatch-observability": (
        "CloudWatch",
        ("CloudWatchAgentServerPolicy", "AWSXrayWriteOnlyAccess"),
    ),
}


@dataclass(frozen=True)
class NeuronClusterProps:
    """What a :class:`NeuronCluster` was built with (its ``props``): the keyword arguments of its
    constructor, where each is documented with its default."""

    vpc: ec2.IVpc
    kubectl_layer: lambda_.ILayerVersion
    subnets: ec2.SubnetSelection | None
    cluster_name: str | None
    version: eks.KubernetesVersion | None
    admin_role_arn: str | None
    public_endpoint_cidrs: Sequence[str]
    system_instance_type: str
    system_nodes: int
    system_name_prefix: str | None
    secrets_key: kms.IKey | None
    removal_policy: RemovalPolicy
    neuron_scheduler_tag: str | None
    devices: device_modes.DeviceMode


class NeuronCluster(Construct):
    """An EKS cluster for Trainium training, with nothing left to install by hand.

    Default settings: private API endpoint; Secrets encrypted with a rotating KMS key;
    control-plane logs api, audit and authenticator; a system managed node group (on-demand,
    AL2023 standard, IMDSv2 hop limit 1, encrypted gp3) in the private subnets; the EKS add-ons of
    :data:`trn_catalog.versions.ADDONS` (vpc-cni with prefix delegation) with Pod Identity roles
    where they call AWS, each association made before its add-on (the Mountpoint S3 driver is
    installed by :class:`TrainingWorkspace`, with its bucket-scoped role); the Neuron Helm chart
    (device plugin tolerating the Neuron taint; node problem detector with node recovery,
    tolerating every taint; the scheduler extension only with ``neuron_scheduler_tag``), the EFA
    device plugin chart, tolerating the Neuron taint, and Kubeflow Trainer as the distributed
    job engine. Add Trainium capacity with :meth:`add_trainium_nodegroup` or
    :class:`TrainiumNodeGroup`.

    Attributes:
        cluster, secrets_key, system_nodegroup, addons (name -> eks.Addon), charts (release ->
        eks.HelmChart), ultraserver_efa_security_group (None until
        :meth:`add_ultraserver_nodegroups` first runs) and ultraserver_node_role (None until it
        first runs without ``node_role``).

    Raises:
        ValueError: a malformed or open public CIDR, a malformed admin role ARN, system_nodes
            outside 2..10, a malformed ``system_name_prefix``, a ``neuron_scheduler_tag`` of
            another Kubernetes minor version, or ``devices='dra'`` with a Kubernetes
            ``version`` before 1.34 (and every error of :class:`NeuronPlugins`).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        kubectl_layer: lambda_.ILayerVersion,
        subnets: ec2.SubnetSelection | None = None,
        cluster_name: str | None = None,
        version: eks.KubernetesVersion | None = None,
        admin_role_arn: str | None = None,
        public_endpoint_cidrs: Sequence[str] = (),
        system_instance_type: str = "m7i.xlarge",
        system_nodes: int = 2,
        system_name_prefix: str | None = None,
        secrets_key: kms.IKey | None = None,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        neuron_scheduler_tag: str | None = None,
        devices: device_modes.DeviceMode = "plugin",
    ) -> None:
        """The props, each with its default (a missing required one: TypeError).

        Args:
            vpc: the VPC (required).
            kubectl_layer: kubectl/helm layer matching ``version`` (required), e.g.
                KubectlV35Layer.
            subnets: where the control plane ENIs, system nodes and kubectl handler go.
                Default: the VPC's private subnets.
            cluster_name: the cluster's name. Default: generated by CloudFormation.
            version: the Kubernetes version. Default None: 1.35 (``KubernetesVersion.V1_35``,
                read at construction, not at import).
            admin_role_arn: an IAM role given the cluster-admin access policy. Default none.
            public_endpoint_cidrs: CIDRs allowed to the public endpoint; empty (default) keeps
                the endpoint private only. 0.0.0.0/0 is refused.
            system_instance_type: system node group type (on-demand, AL2023 standard). Default
                m7i.xlarge.
            system_nodes: system node count, 2 to 10. Default 2.
            system_name_prefix: the system node group is named ``<system_name_prefix>-<8 hex
                digits>``, a digest of its create-only properties and its launch template, so
                that a launch template change (a new stack tag, which its instance tags carry)
                makes a new group under a new name: CloudFormation refuses a node group update
                that changes the launch template version together with anything else, the
                group's and the stack's tags included. At most 54 letters, digits, '-' or '_'.
                Default None: CloudFormation names the group, and such a change must be deployed
                alone.
            secrets_key: KMS key for envelope encryption of Secrets. Default: a new rotating
                key.
            removal_policy: for the cluster's Secrets key. Default RETAIN, as aws-cdk-lib keeps
                keys.
            neuron_scheduler_tag: turns on the Neuron chart's scheduler extension and its second
                scheduler ``my-scheduler``, run from :data:`KUBE_SCHEDULER_IMAGE` at this tag,
                which must be of ``version``'s minor (e.g. ``v1.35.2-eks-1-35-7``; the chart's
                own is 1.31). Pods opt in with ``schedulerName: my-scheduler``. Default None:
                off, as no platform pod uses it (each training pod takes every Neuron device of
                its node).
            devices: ``plugin`` (default: the Neuron and EFA device plugins) or ``dra`` (the
                Neuron and EFA DRA drivers; see :class:`NeuronPlugins`), which needs ``version``
                1.34 or later. Node groups made here are managed node groups, which DRA
                supports.
        """
        super().__init__(scope, construct_id)
        props = props_of(NeuronClusterProps, locals())
        _validate(props)
        self.props = props
        subnets = props.subnets or ec2.SubnetSelection(
            subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS
        )
        self.secrets_key = props.secrets_key or kms.Key(
            self,
            "SecretsKey",
            description="Envelope encryption of EKS Secrets",
            enable_key_rotation=True,
            removal_policy=props.removal_policy,
        )
        self.cluster: eks.Cluster = eks.Cluster(
            self,
            "Cluster",
            version=_version(props),
            cluster_name=props.cluster_name,
            vpc=props.vpc,
            vpc_subnets=[subnets],
            endpoint_access=_endpoint_access(props.public_endpoint_cidrs),
            secrets_encryption_key=self.secrets_key,
            cluster_logging=[
                eks.ClusterLoggingTypes.API,
                eks.ClusterLoggingTypes.AUDIT,
                eks.ClusterLoggingTypes.AUTHENTICATOR,
            ],
            default_capacity=0,
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            bootstrap_self_managed_addons=False,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=props.kubectl_layer,
                private_subnets=props.vpc.select_subnets(
                    subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS
                ).subnets,
            ),
        )
        if props.admin_role_arn:
            self.cluster.grant_cluster_admin("Admin", props.admin_role_arn)
        self._acknowledge_cdk_internals()
        self.system_nodegroup = self._system_nodegroup(subnets)
        self.addons = self._addons()
        self._addon_roles()
        self.plugins = self._plugins()
        self.charts = self.plugins.charts
        self.ultraserver_efa_security_group: ec2.SecurityGroup | None = None
        self.ultraserver_node_role: iam.Role | None = None

    @property
    def icluster(self) -> eks.ICluster:
        """The cluster as the interface other constructs take (jsii's stubs need the cast)."""
        return cast(eks.ICluster, self.cluster)

    @property
    def cluster_name(self) -> str:
        return self.cluster.cluster_name

    def _acknowledge_cdk_internals(self) -> None:
        acknowledge_managed_policies(
            self.cluster.role,
            "AmazonEKSClusterPolicy is the AWS-maintained policy EKS requires on a cluster role.",
        )
        provider = self.cluster.node.find_child("KubectlProvider")
        for child in provider.node.find_all():
            if isinstance(child, iam.Role):
                acknowledge_managed_policies(
                    child,
                    "CDK's kubectl provider (a deploy-time Lambda in the private subnets) logs, "
                    "attaches to the VPC and pulls chart images with AWS-maintained policies.",
                )
                acknowledge_wildcards(
                    child,
                    "CDK's provider framework invokes the versions of its own handler (ARN:*).",
                )
        acknowledge(
            provider,
            "AwsSolutions-L1",
            "CDK pins the kubectl provider's runtime to the one its kubectl layer supports.",
        )

    def add_trainium_nodegroup(
        self, construct_id: str, *, subnet: ec2.ISubnet, **props: Unpack[NodeGroupOptions]
    ) -> TrainiumNodeGroup:
        """Add a :class:`TrainiumNodeGroup` in ``subnet``; ``props`` are its other keyword
        arguments but ``cluster``, each documented there with its default.

        Node groups join after the networking add-ons and the Pod Identity agent; the Neuron
        and EFA daemon sets tolerate the Neuron taint and start on the nodes as they join.
        """
        group = TrainiumNodeGroup(self, construct_id, cluster=self.icluster, subnet=subnet, **props)
        for name in NODE_BOOTSTRAP_ADDONS:
            group.nodegroup.node.add_dependency(self.addons[name])
        return group

    def add_ultraserver_nodegroups(
        self,
        ultraserver_type: str,
        reservation_ids: Sequence[str],
        *,
        subnet: ec2.ISubnet,
        **props: Unpack[NodeGroupOptions],
    ) -> list[TrainiumNodeGroup]:
        """One :class:`TrainiumNodeGroup` per UltraServer Capacity Block (construct id
        ``UltraServer-<reservation id>``): the UltraServer type's member instance type, desired
        and max size its servers, capacity ``capacity-block`` into that block, and the labels
        ``trn-platform/ultraserver-id=<reservation id>`` and
        ``trn-platform/ultraserver-type=<type>`` added to ``props['labels']``. Every UltraServer
        group of the cluster shares one node role (``ultraserver_node_role``, made unless
        ``node_role`` is given) and uses one EFA security group
        (``ultraserver_efa_security_group``) instead of a group of its own, both owned by the
        cluster, so EFA traffic flows between UltraServers and dropping one block from the list
        leaves the other blocks' groups and nodes as they are.
        ``subnet`` and ``props`` are the other keyword arguments of :class:`TrainiumNodeGroup`.

        One group per block, not one over all blocks: EKS documents Capacity Block node groups
        with a launch template that targets one reservation id (capacity-blocks-mng); a
        resource-group target is documented for neither Capacity Blocks nor UltraServers in a
        managed node group, and it would leave which node is in which UltraServer to EC2 at
        launch instead of to the synth.

        Raises:
            ValueError: an UltraServer type no source confirms (trn_catalog.ultraservers), no
                reservation ids, a malformed or repeated one, or ``props`` that set what the
                block decides (instance_type, desired_size, min_size, max_size, capacity,
                capacity_reservation_id, efa_security_group).
        """
        spec = _ultraserver_spec(ultraserver_type, reservation_ids, props)
        efa_group = self._ultraserver_efa_group()
        role = props.get("node_role") or self._ultraserver_role()
        groups = []
        for reservation_id in reservation_ids:
            block: NodeGroupOptions = {
                **props,
                "instance_type": spec.instance_type,
                "desired_size": spec.servers,
                "capacity": "capacity-block",
                "capacity_reservation_id": reservation_id,
                "node_role": role,
                "efa_security_group": efa_group,
                "labels": {
                    **props.get("labels", {}),
                    ultraservers.ULTRASERVER_ID_LABEL: reservation_id,
                    ultraservers.ULTRASERVER_TYPE_LABEL: spec.name,
                },
            }
            groups.append(
                self.add_trainium_nodegroup(f"UltraServer-{reservation_id}", subnet=subnet, **block)
            )
        return groups

    def _ultraserver_efa_group(self) -> ec2.SecurityGroup:
        """The EFA security group of every UltraServer group, made once. It belongs to the
        cluster, not to a block's group, so that no block's group depends on another's."""
        if self.ultraserver_efa_security_group is None:
            self.ultraserver_efa_security_group = efa_security_group(
                self, "UltraServerEfaSecurityGroup", self.cluster.vpc
            )
        return self.ultraserver_efa_security_group

    def _ultraserver_role(self) -> iam.Role:
        """The node role of every UltraServer group that is given none, made once."""
        if self.ultraserver_node_role is None:
            self.ultraserver_node_role = worker_node_role(
                self, "UltraServerNodeRole", TrainiumNodeGroup.ROLE_DESCRIPTION
            )
        return self.ultraserver_node_role

    def add_gpu_nodegroup(
        self, construct_id: str, *, subnet: ec2.ISubnet, **props: Unpack[NodeGroupOptions]
    ) -> GpuNodeGroup:
        """Add a :class:`GpuNodeGroup` in ``subnet`` (``props``: its other keyword arguments but
        ``cluster``) and, with the first one, the NVIDIA device plugin chart of
        :data:`trn_catalog.versions.NVIDIA_DEVICE_PLUGIN_CHART`, which then joins ``charts``.

        The EFA device plugin already admits every GPU catalog type and tolerates the GPU taint.
        """
        group = GpuNodeGroup(self, construct_id, cluster=self.icluster, subnet=subnet, **props)
        for name in NODE_BOOTSTRAP_ADDONS:
            group.nodegroup.node.add_dependency(self.addons[name])
        self._after_system_nodes(self.plugins.add_nvidia_device_plugin())
        return group

    def pod_identity_role(
        self,
        construct_id: str,
        namespace: str,
        service_account: str,
        *,
        managed_policies: Sequence[str] = (),
        statements: Sequence[iam.PolicyStatement] = (),
    ) -> iam.Role:
        """A role that pods of ``namespace/service_account`` assume through EKS Pod Identity."""
        role = add_pod_identity(
            self,
            construct_id,
            self.icluster,
            namespace,
            service_account,
            managed_policies=managed_policies,
            statements=statements,
        )
        role.node.find_child("PodIdentity").node.add_dependency(
            self.addons["eks-pod-identity-agent"]
        )
        return role

    def system_replacement_digest(self) -> str:
        """A digest of what replaces the system node group: its create-only properties and its
        launch template; call it at synth."""
        cfn = self.system_nodegroup.node.default_child
        assert isinstance(cfn, eks.CfnNodegroup)
        data = launch_template_data(self, SYSTEM_LAUNCH_DATA)
        return nodegroup_digest(cfn, {"LaunchTemplateData": Stack.of(self).resolve(data)})

    def _system_nodegroup(self, subnets: ec2.SubnetSelection) -> eks.Nodegroup:
        template = launch_template(self, "SystemLaunchTemplate", SYSTEM_LAUNCH_DATA)
        prefix = self.props.system_name_prefix
        return self.cluster.add_nodegroup_capacity(
            "System",
            nodegroup_name=(
                None if prefix is None else Lazy.string(_SystemNodegroupName(self, prefix))
            ),
            node_role=worker_node_role(self, "SystemNodeRole", "EKS system nodes"),
            instance_types=[ec2.InstanceType(self.props.system_instance_type)],
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            capacity_type=eks.CapacityType.ON_DEMAND,
            launch_template_spec=eks.LaunchTemplateSpec(
                id=template.ref, version=template.attr_latest_version_number
            ),
            subnets=subnets,
            min_size=self.props.system_nodes,
            desired_size=self.props.system_nodes,
            max_size=self.props.system_nodes * 2,
            enable_node_auto_repair=True,
            max_unavailable=1,
            labels=SYSTEM_LABEL,
        )

    def _addons(self) -> dict[str, eks.Addon]:
        addons = {
            pin.name: install_addon(self, self.icluster, pin)
            for pin in versions.ADDONS
            if pin.name not in WORKSPACE_ADDONS
        }
        # Networking and credentials must be there before nodes join; the rest need nodes to run.
        for name, addon in addons.items():
            if name in NODE_BOOTSTRAP_ADDONS:
                self.system_nodegroup.node.add_dependency(addon)
            else:
                addon.node.add_dependency(self.system_nodegroup)
        return addons

    def _addon_roles(self) -> None:
        # The FSx CSI driver needs no role for statically provisioned volumes; the Mountpoint S3
        # driver's role is bound where its bucket is known (TrainingWorkspace).
        for addon, (construct_id, policies) in ADDON_ROLES.items():
            role = self.pod_identity_role(
                construct_id, *versions.service_account(addon), managed_policies=policies
            )
            # The association first: the add-on's pods would otherwise start without credentials.
            self.addons[addon].node.add_dependency(role.node.find_child("PodIdentity"))

    def _plugins(self) -> NeuronPlugins:
        # Constructed as "Default", which CDK leaves out of logical ids: the node problem
        # detector's role and association keep the ids they had before the plugins became a
        # construct of their own (a new id would replace the association, and EKS refuses a
        # second association for the same service account while the first exists).
        plugins = NeuronPlugins(
            self,
            "Default",
            cluster=self.icluster,
            neuron_scheduler_tag=self.props.neuron_scheduler_tag,
            system_node_labels=SYSTEM_LABEL,
            devices=self.props.devices,
        )
        plugins.pod_identity.node.add_dependency(self.addons["eks-pod-identity-agent"])
        plugins.npd_namespace.node.add_dependency(self.system_nodegroup)
        for chart in plugins.charts.values():
            self._after_system_nodes(chart)
        return plugins

    def _after_system_nodes(self, chart: eks.HelmChart) -> None:
        chart.node.add_dependency(self.system_nodegroup)
        chart.node.add_dependency(self.addons["coredns"])


def _version(props: NeuronClusterProps) -> eks.KubernetesVersion:
    return props.version or eks.KubernetesVersion.V1_35


def _endpoint_access(cidrs: Sequence[str]) -> eks.EndpointAccess:
    if not cidrs:
        return eks.EndpointAccess.PRIVATE
    return eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*cidrs)


def _validate(props: NeuronClusterProps) -> None:
    for cidr in props.public_endpoint_cidrs:
        try:
            network = ipaddress.ip_network(cidr)
        except ValueError:
            raise ValueError(
                f"public_endpoint_cidrs: {cidr!r} is not an IPv4 CIDR such as 203.0.113.0/24"
            ) from None
        if network.prefixlen == 0:
            raise ValueError(
                f"public_endpoint_cidrs: {cidr!r} opens the API to the internet; list your "
                "networks instead"
            )
    if props.admin_role_arn is not None and ":role/" not in props.admin_role_arn:
        raise ValueError(
            f"admin_role_arn {props.admin_role_arn!r} is not an IAM role ARN "
            "(arn:aws:iam::ACCOUNT:role/NAME)"
        )
    if not 2 <= props.system_nodes <= 10:
        raise ValueError(f"system_nodes {props.system_nodes} is not allowed; use 2 to 10")
    prefix = props.system_name_prefix
    if prefix is not None and not NAME_PREFIX.fullmatch(prefix):
        raise ValueError(
            f"system_name_prefix {prefix!r} is not allowed; use 1 to 54 letters, digits, '-' "
            "or '_', starting with a letter or digit (EKS node group names)"
        )
    minor = _version(props).version
    if props.devices == "dra":
        problem = device_modes.kubernetes_problem(minor)
        if problem:
            raise ValueError(f"devices 'dra': {problem}")
    tag = props.neuron_scheduler_tag
    if tag is not None and not tag.startswith(f"v{minor}."):
        raise ValueError(
            f"neuron_scheduler_tag {tag!r} is not a kube-scheduler of Kubernetes {minor}, the "
            f"control plane's version; use a v{minor}.x tag of {KUBE_SCHEDULER_IMAGE}"
        )


# What an UltraServer block decides for its node group.
_BLOCK_PROPS = (
    "instance_type",
    "desired_size",
    "min_size",
    "max_size",
    "capacity",
    "capacity_reservation_id",
    "efa_security_group",
)


def _ultraserver_spec(
    ultraserver_type: str, reservation_ids: Sequence[str], props: Mapping[str, object]
) -> ultraservers.UltraServerSpec:
    try:
        spec = ultraservers.get(ultraserver_type)
    except ultraservers.UnconfirmedUltraServerError as error:
        raise ValueError(f"ultraserver_type: {error}") from None
    if not reservation_ids:
        raise ValueError("reservation_ids: at least one UltraServer block is needed")
    bad = [i for i in reservation_ids if not formats.RESERVATION_ID.fullmatch(i)]
    if bad:
        raise ValueError(
            f"reservation_ids: {bad} are not capacity reservation ids ('cr-' and 17 "
            "hexadecimal digits)"
        )
    twice = sorted({i for i in reservation_ids if list(reservation_ids).count(i) > 1})
    if twice:
        raise ValueError(f"reservation_ids: {twice} are listed twice; one node group per block")
    decided = sorted(set(props) & set(_BLOCK_PROPS))
    if decided:
        raise ValueError(
            f"{', '.join(decided)}: not allowed; each UltraServer block's node group takes the "
            f"type's instance type and servers ({spec.instance_type}, {spec.servers}), "
            "launches into its block and uses the cluster's shared EFA security group"
        )
    return spec


@jsii.implements(IStableStringProducer)
class _SystemNodegroupName:
    def __init__(self, cluster: NeuronCluster, prefix: str) -> None:
        self.cluster = cluster
        self.prefix = prefix

    def produce(self) -> str:
        return f"{self.prefix}-{self.cluster.system_replacement_digest()}"
