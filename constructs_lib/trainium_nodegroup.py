"""TrainiumNodeGroup: an EKS managed node group of Trainium instances with every EFA attached."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import jsii
from aws_cdk import Fn, IStableStringProducer, Lazy, Stack, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import custom_resources as cr
from constructs import Construct

import trn_catalog
from constructs_lib._common import (
    acknowledge_sdk_call_provider,
    check_subnet_zone,
    deny_other_egress,
    launch_template,
    launch_template_data,
    worker_node_role,
)
from constructs_lib._props import EMPTY_LABELS, props_of
from trn_catalog import devices as device_modes
from trn_catalog import formats
from trn_catalog.devices import LNC_CONFIG_FILE, LNC_ENV
from trn_catalog.workspace import NEURON_TAINT_KEY, NODE_TYPE_LABEL, TRAINIUM_NODE_TYPE

CapacityMode = Literal["on-demand", "capacity-block", "odcr"]
# (network card, device index, interface type) of one launch-template network interface.
Interface = tuple[int, int, str]
INSTANCE_TAGS = {NODE_TYPE_LABEL: TRAINIUM_NODE_TYPE}
# AWS::EKS::Nodegroup's create-only properties but its name (CloudFormation resource schema): a
# change to any of them replaces the node group, so the generated name must change with them.
REPLACING_PROPERTIES = (
    "AmiType",
    "CapacityType",
    "ClusterName",
    "DiskSize",
    "InstanceTypes",
    "NodeRole",
    "RemoteAccess",
    "Subnets",
)
# The node group's scaling in its CloudFormation resource, the same for every group and fixed for
# good: each group is created empty and sized by its `Size` call (TrainiumNodeGroup._size). A
# change here would make CloudFormation update every deployed group to these sizes, emptying it.
CREATED_SCALING = {"MinSize": 0, "MaxSize": formats.MAX_BLOCK_INSTANCES, "DesiredSize": 0}
# EKS: a node group name has 1 to 63 letters, digits, '-' and '_', starting with a letter or
# digit; the construct appends '-' and 8 hexadecimal digits to the prefix.
NAME_PREFIX = re.compile(r"^[0-9A-Za-z][0-9A-Za-z_-]{0,53}$")
# AL2023 nodeadm: put containerd and kubelet on a RAID0 of the instance-store NVMe disks, so
# image layers and the Neuron compile cache use the fast local disks, not the root volume.
_LOCAL_STORAGE_NODECONFIG = """Content-Type: application/node.eks.aws

apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  instance:
    localStorage:
      strategy: RAID0
"""
# The node's logical NeuronCore setting on the device-plugin path: the Neuron runtime reads the
# line NEURON_LOGICAL_NC_CONFIG=<n> from this file (Neuron docs, EKS prerequisites).
_LNC_SCRIPT = """Content-Type: text/x-shellscript; charset="us-ascii"

#!/bin/bash
set -euo pipefail
mkdir -p {directory}
printf '{variable}=%s\\n' {lnc} > {path}
"""


def user_data(local_storage: bool, lnc: int | None) -> str | None:
    """The launch template's MIME user data: the nodeadm NodeConfig for instance-store RAID0
    and the script that writes the node's LNC; None when neither applies."""
    parts = []
    if local_storage:
        parts.append(_LOCAL_STORAGE_NODECONFIG)
    if lnc is not None:
        parts.append(
            _LNC_SCRIPT.format(
                directory=LNC_CONFIG_FILE.rsplit("/", 1)[0],
                variable=LNC_ENV,
                lnc=lnc,
                path=LNC_CONFIG_FILE,
            )
        )
    if not parts:
        return None
    body = "".join(f"--//\n{part}\n" for part in parts)
    return f'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="//"\n\n{body}--//--\n'


@dataclass(frozen=True)
class TrainiumNodeGroupProps:
    """What a :class:`TrainiumNodeGroup` or :class:`GpuNodeGroup` was built with (its ``props``):
    the keyword arguments of its constructor, where each is documented with its default."""

    cluster: eks.ICluster
    subnet: ec2.ISubnet
    trn_availability_zone: str | None
    instance_type: str
    desired_size: int
    min_size: int
    max_size: int | None
    capacity: CapacityMode
    capacity_reservation_id: str | None
    root_volume_gib: int
    node_role: iam.IRole | None
    labels: Mapping[str, str]
    taints: Sequence[eks.TaintSpec] | None
    security_groups: Sequence[ec2.ISecurityGroup]
    efa_security_group: ec2.ISecurityGroup | None
    name_prefix: str | None
    lnc: int | None


class NodeGroupOptions(TypedDict, total=False):
    """The keyword arguments of :class:`TrainiumNodeGroup` but ``cluster`` and ``subnet``, for the
    methods that add a node group to a cluster (:meth:`NeuronCluster.add_trainium_nodegroup`);
    each is documented with its default on the constructor."""

    trn_availability_zone: str | None
    instance_type: str
    desired_size: int
    min_size: int
    max_size: int | None
    capacity: CapacityMode
    capacity_reservation_id: str | None
    root_volume_gib: int
    node_role: iam.IRole | None
    labels: Mapping[str, str]
    taints: Sequence[eks.TaintSpec] | None
    security_groups: Sequence[ec2.ISecurityGroup]
    efa_security_group: ec2.ISecurityGroup | None
    name_prefix: str | None
    lnc: int | None


def efa_security_group(scope: Construct, construct_id: str, vpc: ec2.IVpc) -> ec2.SecurityGroup:
    """A security group that lets all traffic flow between its members and nowhere else: EFA
    needs every protocol between the nodes of one job."""
    group = ec2.SecurityGroup(
        scope,
        construct_id,
        vpc=vpc,
        description="EFA: all traffic to and from members of this group only",
        allow_all_outbound=False,
    )
    group.add_ingress_rule(group, ec2.Port.all_traffic(), "EFA from the group")
    group.add_egress_rule(group, ec2.Port.all_traffic(), "EFA to the group")
    deny_other_egress(group)
    return group


class TrainiumNodeGroup(Construct):
    """A managed node group of trn instances, with the EFA layout from the instance catalog.

    Default settings: a launch template that carries the instance type (CDK's AMI check rejects
    trn types with the Neuron AMI otherwise) and one network interface per network card: card 0
    device 0 is the primary ``efa`` interface, every other card gets an ``efa-only`` interface;
    AMI type AL2023_x86_64_NEURON; IMDSv2 required with hop limit 1; an encrypted gp3 root
    volume; instance-store NVMe as RAID0 for containerd and kubelet when the type has it; the
    taint ``aws.amazon.com/neuron=true:NoSchedule``; node auto repair on; one node updated at a
    time, under EKS's MINIMAL update strategy; an EFA security group open to itself only; the
    group created empty and then sized.
    ``on-demand`` adds a cluster placement group; ``capacity-block`` launches into the block
    (market type capacity-block, node group capacity type CAPACITY_BLOCK, no placement group);
    ``odcr`` launches into the reservation only.

    Its launch template version is never updated in place. CloudFormation refuses an
    AWS::EKS::Nodegroup update that changes the version together with any other property ("Version
    and ReleaseVersion updates cannot be combined with other updates", aws/containers-roadmap#1258),
    the stack's tags included (aws/aws-cdk#16644; eksctl updates a node group stack's tags
    before its version, eksctl-io/eksctl#2708), and EKS updates a Capacity Block group only at
    desired size 0 (EKS user guide, Capacity Blocks for managed node groups). So with
    ``name_prefix`` any change to the launch template (type, LNC, volume, reservation, capacity
    mode, instance tags) gives the group a new name: CloudFormation creates the new group and
    deletes the old one once the stack's update is done, whatever else changed with it.

    The group is created empty and sized once active by its ``Size`` resource, an EKS
    UpdateNodegroupConfig call (CloudFormation's scaling of the group is
    :data:`CREATED_SCALING`, the same for every group and never changed). A new group so needs
    no room beside the old one's nodes: where a reservation, a block or the placement group is
    full, its nodes launch as the old group's are removed. And a change of size alone never
    updates the node group resource. Labels and taints are updated in place. Without
    ``name_prefix`` CloudFormation names the group and a launch template change rolls its nodes
    in place, one at a time, old before new (the MINIMAL strategy; EKS's default launches new
    nodes first, which a full reservation or placement group has no room for); such an update
    must come alone, without a label, taint or stack-tag change.

    Attributes:
        spec: the catalog entry; launch_template; nodegroup; nodegroup_name (a plain string
        at synth with ``name_prefix``, else CloudFormation's); size (the UpdateNodegroupConfig
        call); efa_security_group; placement_group (on-demand only, else None); node_role.

    Raises:
        ValueError: a cluster imported without ``vpc`` or ``cluster_security_group_id``, a
            public ``subnet``, a ``subnet`` outside ``trn_availability_zone``, unknown instance
            type, sizes outside ``0 <= min_size <= desired_size <= max_size`` or ``max_size``
            outside 1..64, a taint without a key or with a key or value over 63 characters, two
            taints of one key and effect, a label key or value empty or over 63 characters,
            a ``trn-platform/node-type`` label of another value, a reservation mode without a
            valid reservation id, a reservation id with on-demand, a root volume under
            100 GiB, a name prefix EKS would refuse, or an ``lnc`` the type does not take.
    """

    # What a subclass for other accelerators changes (GpuNodeGroup); the launch template, EFA
    # interfaces, capacity modes and the replacement-safe name stay the same.
    AMI_TYPE = eks.NodegroupAmiType.AL2023_X86_64_NEURON
    TAINT_KEY = NEURON_TAINT_KEY
    NODE_TYPE = TRAINIUM_NODE_TYPE
    ROLE_DESCRIPTION = "Trainium worker nodes"

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        subnet: ec2.ISubnet,
        trn_availability_zone: str | None = None,
        instance_type: str = trn_catalog.DEFAULT_INSTANCE_TYPE,
        desired_size: int = 2,
        min_size: int = 0,
        max_size: int | None = None,
        capacity: CapacityMode = "on-demand",
        capacity_reservation_id: str | None = None,
        root_volume_gib: int = 512,
        node_role: iam.IRole | None = None,
        labels: Mapping[str, str] = EMPTY_LABELS,
        taints: Sequence[eks.TaintSpec] | None = None,
        security_groups: Sequence[ec2.ISecurityGroup] = (),
        efa_security_group: ec2.ISecurityGroup | None = None,
        name_prefix: str | None = None,
        lnc: int | None = None,
    ) -> None:
        """The props, each with its default (a missing required one: TypeError).

        Args:
            cluster: the EKS cluster (required).
            subnet: the one subnet of the trn AZ (required; EFA and placement need a single AZ).
            trn_availability_zone: the AZ of the Trainium capacity (a Capacity Block's or
                reservation's). When given, ``subnet`` must be in it wherever its AZ is known at
                synth (a subnet made in the app, or imported with ``availability_zone``).
                Default none: unchecked.
            instance_type: a type from the instance catalog. Default
                ``trn_catalog.DEFAULT_INSTANCE_TYPE`` (trn3.48xlarge).
            desired_size: the node count to run, set once the group is active (see the class
                docstring). Default 2.
            min_size: the fewest nodes the group scales in to. Default 0 (a group can be
                emptied, e.g. before its Capacity Block starts or after it ends;
                eks.Nodegroup's default is 1).
            max_size: the most nodes the group scales out to, 1 to 64. Default:
                ``desired_size`` (at least 1). Always
                ``0 <= min_size <= desired_size <= max_size``.
            capacity: ``on-demand``, ``capacity-block`` or ``odcr``. Default ``on-demand``.
            capacity_reservation_id: the reservation for ``capacity-block`` and ``odcr``.
                Default none (required by those two).
            root_volume_gib: gp3 root volume, encrypted. Default 512 (Neuron images run to tens
                of GB).
            node_role: the nodes' role. Default: a new role with the EKS worker, ECR read and
                SSM managed-instance policies.
            labels: Kubernetes labels added to the defaults (``trn-platform/node-type``,
                ``trn-platform/efa-interfaces``, ``trn-platform/capacity``); a key of the
                defaults takes the given value, except ``trn-platform/node-type``, which the
                device plugins and the workspace's runtimes select nodes by. Default none.
            taints: the nodes' taints. Default: :meth:`default_taints` (for Trainium
                ``aws.amazon.com/neuron=true:NoSchedule``). A list replaces the default (``[]``:
                no taint); to extend it pass
                ``[*TrainiumNodeGroup.default_taints(), eks.TaintSpec(...)]``. Pods need a
                toleration for each: the workspace's runtimes tolerate the default only, so an
                added taint keeps the platform's jobs off these nodes unless your own runtime
                tolerates it; the device agents of :class:`NeuronPlugins` tolerate every taint
                and stay.
            security_groups: extra groups on every network interface, e.g. the Lustre clients
                group. Default none (the EFA group and the cluster security group are always
                on).
            efa_security_group: the group that lets EFA traffic flow between its members, for
                node groups whose nodes talk EFA to each other (every interface carries it; EC2
                allows 5 groups per interface by default). It must admit all traffic from and
                to itself, as :func:`efa_security_group` makes one; no rule is added to it.
                Default: a new group of this node group's own.
            name_prefix: the node group is named ``<name_prefix>-<8 hex digits>``, the digits a
                digest of what replaces it (its create-only properties and its launch
                template), so a replacement gets a new name instead of failing on a custom
                name; known at synth, so other stacks take it as a plain string. At most 54
                letters, digits, '-' or '_'. Default: the name is generated by CloudFormation,
                and a launch template change updates the group in place (see the class
                docstring).
            lnc: the nodes' logical NeuronCore setting, 1 or 2 (trn2/trn3 types only), written
                by the user data to the file the Neuron runtime reads; for the device-plugin
                path (under DRA each job's claim sets it). Default None: the type's default (2).
        """
        super().__init__(scope, construct_id)
        self._build(props_of(TrainiumNodeGroupProps, locals()))

    def _build(self, props: TrainiumNodeGroupProps) -> None:
        self.spec: Any = _validate(props, self._lookup)
        _check_labels(props.labels, self.NODE_TYPE)
        self.props = props
        self.efa_security_group = props.efa_security_group or self._efa_security_group()
        # The groups of ours on every interface; the cluster's own group is left to its owner.
        self.connections = ec2.Connections(
            security_groups=[self.efa_security_group, *props.security_groups]
        )
        self.placement_group = (
            ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")
            if props.capacity == "on-demand"
            else None
        )
        self.node_role = props.node_role or worker_node_role(
            self, "NodeRole", self.ROLE_DESCRIPTION
        )
        self.launch_template = self._launch_template()
        self._name = (
            None
            if props.name_prefix is None
            else Lazy.string(_ReplacementName(self, props.name_prefix))
        )
        self.nodegroup = self._nodegroup()
        self.nodegroup_name: str = self._name or self.nodegroup.nodegroup_name
        self.size = self._size()

    @classmethod
    def default_taints(cls) -> list[eks.TaintSpec]:
        """The taints a group gets without ``taints``: ``<TAINT_KEY>=true:NoSchedule``, so that
        only pods asking for the accelerator (and tolerating it) land on these nodes."""
        return [eks.TaintSpec(key=cls.TAINT_KEY, value="true", effect=eks.TaintEffect.NO_SCHEDULE)]

    def _efa_security_group(self) -> ec2.ISecurityGroup:
        return efa_security_group(self, "EfaSecurityGroup", self.props.cluster.vpc)

    def _network_interfaces(self) -> list[dict[str, Any]]:
        groups = [
            self.efa_security_group.security_group_id,
            self.props.cluster.cluster_security_group_id,
            *(group.security_group_id for group in self.props.security_groups),
        ]
        return [
            {
                "NetworkCardIndex": card,
                "DeviceIndex": device,
                "InterfaceType": kind,
                "Groups": groups,
                "DeleteOnTermination": True,
            }
            for card, device, kind in self._interface_layout()
        ]

    def _lookup(self, instance_type: str) -> Any:
        """The catalog entry of ``instance_type``; raises the catalog's unknown-type error."""
        return trn_catalog.get(instance_type)

    def _interface_layout(self) -> list[Interface]:
        """One interface per network card: card 0 device 0 the primary ``efa`` interface, the
        other cards' device 0 ``efa-only`` (the EC2 layout for EFA-only interfaces on the
        cards after the primary's)."""
        return [
            (card, 0, "efa" if card == 0 else "efa-only")
            for card in range(self.spec.efa_interfaces)
        ]

    @property
    def instance_tags(self) -> dict[str, str]:
        return {NODE_TYPE_LABEL: self.NODE_TYPE}

    def _launch_template(self) -> ec2.CfnLaunchTemplate:
        props = self.props
        data: dict[str, Any] = {
            "InstanceType": props.instance_type,
            "NetworkInterfaces": self._network_interfaces(),
            "BlockDeviceMappings": [
                {
                    "DeviceName": "/dev/xvda",
                    "Ebs": {
                        "VolumeSize": props.root_volume_gib,
                        "VolumeType": "gp3",
                        "Iops": 6000,
                        "Throughput": 500,
                        "Encrypted": True,
                        "DeleteOnTermination": True,
                    },
                }
            ],
        }
        text = user_data(self.spec.instance_store_gb > 0, props.lnc)
        if text is not None:
            data["UserData"] = Fn.base64(text)
        if self.placement_group is not None:
            data["Placement"] = {"GroupName": self.placement_group.ref}
        if props.capacity == "capacity-block":
            data["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
            data["CapacityReservationSpecification"] = {
                "CapacityReservationTarget": {
                    "CapacityReservationId": props.capacity_reservation_id
                }
            }
        elif props.capacity == "odcr":
            data["CapacityReservationSpecification"] = {
                "CapacityReservationPreference": "capacity-reservations-only",
                "CapacityReservationTarget": {
                    "CapacityReservationId": props.capacity_reservation_id
                },
            }
        self._launch_data = data
        return launch_template(self, "LaunchTemplate", data, instance_tags=self.instance_tags)

    def replacement_digest(self) -> str:
        """A digest of what replaces the node group: its create-only properties and its launch
        template (whose version is never updated in place); call it at synth."""
        cfn = self.nodegroup.node.default_child
        assert isinstance(cfn, eks.CfnNodegroup)
        launch_data = launch_template_data(self, self._launch_data, self.instance_tags)
        return nodegroup_digest(
            cfn,
            {
                "SubnetPlacement": _placement(self.props.subnet),
                "LaunchTemplateData": Stack.of(self).resolve(launch_data),
            },
        )

    def _nodegroup(self) -> eks.Nodegroup:
        group = self._new_nodegroup()
        # eks_v2.Nodegroup (CDK 2.275) has no property for it; CloudFormation's UpdateConfig has.
        cfn = group.node.default_child
        assert isinstance(cfn, eks.CfnNodegroup)
        cfn.add_property_override("UpdateConfig.UpdateStrategy", "MINIMAL")
        cfn.add_property_override("ScalingConfig", CREATED_SCALING)
        return group

    def _size(self) -> cr.AwsCustomResource:
        """Sizes the node group once it is active, with EKS's UpdateNodegroupConfig: the group
        is created empty (:data:`CREATED_SCALING`), and a change of size never touches the node
        group resource (see the class docstring)."""
        props = self.props
        cfn = self.nodegroup.node.default_child
        assert isinstance(cfn, eks.CfnNodegroup)
        call = cr.AwsSdkCall(
            service="EKS",
            action="UpdateNodegroupConfig",
            parameters={
                "clusterName": props.cluster.cluster_name,
                "nodegroupName": cfn.attr_nodegroup_name,
                "scalingConfig": {
                    "minSize": props.min_size,
                    "maxSize": _max_size(props),
                    "desiredSize": props.desired_size,
                },
            },
            # A new group (replaced under a new name) is a new resource; the old one's deletion
            # calls nothing (its group goes with it).
            physical_resource_id=cr.PhysicalResourceId.of(cfn.attr_nodegroup_name),
            output_paths=["update.id"],
        )
        size = cr.AwsCustomResource(
            self,
            "Size",
            on_create=call,
            on_update=call,
            policy=cr.AwsCustomResourcePolicy.from_statements(
                [
                    iam.PolicyStatement(
                        actions=["eks:UpdateNodegroupConfig"], resources=[cfn.attr_arn]
                    )
                ]
            ),
            # The SDK in Lambda's Node.js runtime has EKS; installing another needs the internet.
            install_latest_aws_sdk=False,
        )
        acknowledge_sdk_call_provider(self)
        return size

    def _new_nodegroup(self) -> eks.Nodegroup:
        props = self.props
        capacity_type = (
            eks.CapacityType.CAPACITY_BLOCK
            if props.capacity == "capacity-block"
            else eks.CapacityType.ON_DEMAND
        )
        return eks.Nodegroup(
            self,
            "Nodegroup",
            cluster=props.cluster,
            nodegroup_name=self._name,
            ami_type=self.AMI_TYPE,
            capacity_type=capacity_type,
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.ref,
                version=self.launch_template.attr_latest_version_number,
            ),
            subnets=ec2.SubnetSelection(subnets=[props.subnet]),
            node_role=self.node_role,
            min_size=props.min_size,
            max_size=_max_size(props),
            desired_size=props.desired_size,
            max_unavailable=1,
            enable_node_auto_repair=True,
            taints=list(self.default_taints() if props.taints is None else props.taints),
            labels={
                NODE_TYPE_LABEL: self.NODE_TYPE,
                "trn-platform/efa-interfaces": str(self.spec.efa_interfaces),
                "trn-platform/capacity": props.capacity,
                **props.labels,
            },
        )


def nodegroup_digest(cfn: eks.CfnNodegroup, facts: Mapping[str, Any]) -> str:
    """8 hexadecimal digits of a digest of what replaces node group ``cfn``: its create-only
    properties but its name (:data:`REPLACING_PROPERTIES`) and ``facts`` (resolved values, such
    as its launch template's data, whose version CloudFormation will not update together with
    anything else); call it at synth, from a Lazy value."""
    stack = Stack.of(cfn)
    resolved = {
        name: stack.resolve(getattr(cfn, _attribute(name))) for name in REPLACING_PROPERTIES
    }
    text = json.dumps({**resolved, **facts}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


@jsii.implements(IStableStringProducer)
class _ReplacementName:
    def __init__(self, group: TrainiumNodeGroup, prefix: str) -> None:
        self.group = group
        self.prefix = prefix

    def produce(self) -> str:
        return f"{self.prefix}-{self.group.replacement_digest()}"


def _placement(subnet: ec2.ISubnet) -> list[str]:
    """A subnet made in this app keeps its logical id when a new zone or block replaces it, and
    its id is known only at deploy: its zone and block tell the replacement apart."""
    if not Token.is_unresolved(subnet.subnet_id):
        return [subnet.subnet_id]
    return [subnet.availability_zone, subnet.ipv4_cidr_block]


def _attribute(cfn_property: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cfn_property).lower()


def _imported(cluster: eks.ICluster, attribute: str) -> Any:
    """``cluster.<attribute>``, or our error where an imported cluster lacks it (CDK's own comes
    from deep inside jsii and names no prop)."""
    try:
        return getattr(cluster, attribute)
    except RuntimeError:
        raise ValueError(
            f"cluster {cluster.node.path!r} was imported without {attribute}; a node group needs "
            f"it: eks.Cluster.from_cluster_attributes(..., {attribute}=...)"
        ) from None


def _check_cluster_and_subnet(props: TrainiumNodeGroupProps) -> None:
    vpc: ec2.IVpc = _imported(props.cluster, "vpc")
    _imported(props.cluster, "cluster_security_group_id")
    check_subnet_zone("subnet", props.subnet, props.trn_availability_zone)
    public = {subnet.node.path for subnet in vpc.public_subnets}
    if props.subnet.node.path in public:
        raise ValueError(
            f"subnet {props.subnet.node.path!r} is a public subnet of the cluster's VPC; trn "
            "nodes take no public addresses: use a private subnet of the trn AZ"
        )


def _validate(props: TrainiumNodeGroupProps, lookup: Callable[[str], Any]) -> Any:
    _check_cluster_and_subnet(props)
    try:
        spec = lookup(props.instance_type)
    except KeyError as error:
        raise ValueError(f"instance_type: {error}") from None
    _check_sizes(props)
    _check_taints(props.taints or ())
    reservation = props.capacity_reservation_id
    if props.capacity == "on-demand":
        if reservation is not None:
            raise ValueError(
                f"capacity_reservation_id {reservation!r} is only used with capacity "
                "'capacity-block' or 'odcr'"
            )
    elif props.capacity in ("capacity-block", "odcr"):
        if reservation is None or not formats.RESERVATION_ID.fullmatch(reservation):
            raise ValueError(
                f"capacity_reservation_id {reservation!r} is not allowed; capacity "
                f"{props.capacity!r} needs 'cr-' and 17 hexadecimal digits"
            )
    else:
        raise ValueError(
            f"capacity {props.capacity!r} is not allowed; use on-demand, capacity-block or odcr"
        )
    if props.root_volume_gib < 100:
        raise ValueError(f"root_volume_gib {props.root_volume_gib} is not allowed; use >= 100")
    lnc = props.lnc
    if lnc is not None:
        problem = (
            device_modes.lnc_problem(spec, lnc)
            if isinstance(spec, trn_catalog.InstanceSpec)
            else f"{props.instance_type} has no NeuronCores"
        )
        if problem:
            raise ValueError(f"lnc {lnc!r} is not allowed: {problem}")
    if props.name_prefix is not None and not NAME_PREFIX.fullmatch(props.name_prefix):
        raise ValueError(
            f"name_prefix {props.name_prefix!r} is not allowed; use 1 to 54 letters, digits, "
            "'-' or '_', starting with a letter or digit"
        )
    return spec


def _max_size(props: TrainiumNodeGroupProps) -> int:
    return max(props.desired_size, 1) if props.max_size is None else props.max_size


def _check_sizes(props: TrainiumNodeGroupProps) -> None:
    """0 <= min_size <= desired_size <= max_size, max_size 1..64 (EKS needs room for one node;
    64 is the catalog's largest Capacity Block)."""
    limit = formats.MAX_BLOCK_INSTANCES
    maximum = _max_size(props)
    if not 1 <= maximum <= limit:
        raise ValueError(f"max_size {maximum} is not allowed; use 1 to {limit}")
    for name, value in (("min_size", props.min_size), ("desired_size", props.desired_size)):
        if value < 0:
            raise ValueError(f"{name} {value} is not allowed; use 0 or more")
    if props.min_size > props.desired_size:
        raise ValueError(
            f"min_size {props.min_size} is greater than desired_size {props.desired_size}; "
            "use 0 <= min_size <= desired_size <= max_size"
        )
    if props.desired_size > maximum:
        raise ValueError(
            f"desired_size {props.desired_size} is greater than max_size {maximum}; "
            "use 0 <= min_size <= desired_size <= max_size"
        )


def _check_taints(taints: Sequence[eks.TaintSpec]) -> None:
    """The EKS API's limits on a taint (key 1 to 63 characters, value up to 63) and Kubernetes'
    rule of one taint per key and effect."""
    seen: set[tuple[str, Any]] = set()
    for taint in taints:
        key, value = taint.key or "", taint.value or ""
        if not 1 <= len(key) <= 63 or len(value) > 63:
            raise ValueError(
                f"taints: key {key!r} value {value!r} is not allowed; a taint needs a key of 1 "
                "to 63 characters and a value of at most 63"
            )
        if (key, taint.effect) in seen:
            raise ValueError(f"taints: key {key!r} appears twice with one effect; give it once")
        seen.add((key, taint.effect))


def _check_labels(labels: Mapping[str, str], node_type: str) -> None:
    """The EKS API's limits on a node group label (key and value 1 to 63 characters each, in the
    botocore EKS model) and the node-type label the platform selects by."""
    for key, value in labels.items():
        if not (1 <= len(key) <= 63 and 1 <= len(value) <= 63):
            raise ValueError(
                f"labels: {key!r}={value!r} is not allowed; EKS takes a label key and value of "
                "1 to 63 characters each"
            )
    given = labels.get(NODE_TYPE_LABEL, node_type)
    if given != node_type:
        raise ValueError(
            f"labels: {NODE_TYPE_LABEL}={given!r} is not allowed; the device plugins and the "
            f"workspace's runtimes select these nodes by {NODE_TYPE_LABEL}={node_type}"
        )
