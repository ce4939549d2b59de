"""TrainingNetwork: the VPC a Trainium training cluster runs in."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import custom_resources as cr
from constructs import Construct

from constructs_lib._common import (
    AWS_CUSTOM_RESOURCE_PROVIDER as AWS_CUSTOM_RESOURCE_PROVIDER,
)
from constructs_lib._common import (
    acknowledge,
    acknowledge_sdk_call_provider,
    deny_other_egress,
    log_group_key,
    retention,
)
from constructs_lib._props import props_of

# Interface endpoints that private trn and system nodes call on every boot or job, so that none
# of that traffic (multi-GB Neuron images above all) pays NAT data processing or depends on it:
#   ecr.api, ecr.dkr  image manifests and auth for the training and add-on images (layers come
#                     from S3 through the gateway endpoint)
#   sts               web-identity and role credentials for add-ons and jobs
#   eks-auth          EKS Pod Identity credential exchange
#   eks               node bootstrap (nodeadm) and add-ons reading cluster details
#   ec2               VPC CNI attaching ENIs, IP prefixes and EFA interfaces
#   logs              container and control-plane agents shipping logs
#   ssm, ssmmessages  Session Manager: the way onto a node, since SSH is never opened
DEFAULT_INTERFACE_ENDPOINTS: tuple[str, ...] = (
    "ecr.api",
    "ecr.dkr",
    "sts",
    "eks-auth",
    "eks",
    "ec2",
    "logs",
    "ssm",
    "ssmmessages",
)

_ENDPOINT_SERVICES: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "ecr.api": ec2.InterfaceVpcEndpointAwsService.ECR,
    "ecr.dkr": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "eks-auth": ec2.InterfaceVpcEndpointAwsService.EKS_AUTH,
    "eks": ec2.InterfaceVpcEndpointAwsService.EKS,
    "ec2": ec2.InterfaceVpcEndpointAwsService.EC2,
    "logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "ssm": ec2.InterfaceVpcEndpointAwsService.SSM,
    "ssmmessages": ec2.InterfaceVpcEndpointAwsService.SSM_MESSAGES,
    "ec2messages": ec2.InterfaceVpcEndpointAwsService.EC2_MESSAGES,
    "monitoring": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_MONITORING,
    "elasticloadbalancing": ec2.InterfaceVpcEndpointAwsService.ELASTIC_LOAD_BALANCING,
    "fsx": ec2.InterfaceVpcEndpointAwsService.FSX,
}

# The name of TrainingNetwork's zone marker, which CloudFormation names when a deploy would move
# the network's zones (see TrainingNetwork._zone_marker).
ZONE_MARKER_NAME = (
    "trn-zones: fixed once deployed. Another trn zone is another environment: "
    "see docs/deploying.md, Moving the trn zone"
)
PRIVATE_SUBNET_NAME = "Private"
PUBLIC_SUBNET_NAME = "Public"

# Regions where the prefix reservation is CloudFormation's AWS::EC2::SubnetCidrReservation. Its
# regional schemas (as cfn-lint 1.58 ships them) offer that type in us-east-1 and us-west-2 among
# the commercial regions, not in us-east-2; elsewhere the network makes the same reservation with
# EC2's CreateSubnetCidrReservation call at deploy time. The list stays as it is when
# CloudFormation adds regions: moving a deployed network from one way to the other would ask for
# the same block twice, and EC2 refuses overlapping reservations.
NATIVE_RESERVATION_REGIONS = frozenset({"us-east-1", "us-west-2"})


@dataclass(frozen=True)
class TrainingNetworkProps:
    """What a :class:`TrainingNetwork` was built with (its ``props``): the keyword arguments of
    its constructor, where each is documented with its default."""

    trn_availability_zone: str
    availability_zones: Sequence[str]
    vpc: ec2.IVpc | None
    cidr: str
    private_subnet_mask: int
    prefix_reservation_mask: int
    nat_gateways: int
    interface_endpoints: Sequence[str]
    flow_log_retention_days: int
    removal_policy: RemovalPolicy


class TrainingNetwork(Construct):
    """A VPC for Trainium training: private subnets sized for pod IPs, endpoints, flow logs.

    Default settings: one public /24 and one private subnet per AZ; private subnets route out
    through NAT; an S3 gateway endpoint on the private route tables; the interface endpoints of
    :data:`DEFAULT_INTERFACE_ENDPOINTS` with private DNS; all traffic logged to a KMS-encrypted
    CloudWatch log group; the default security group stripped of all rules; a security group
    without rules, ``zone_marker``, that keeps the zones as deployed (below).

    The zones cannot move once deployed: a subnet's block goes by its zone's place in the list,
    so a move replaces a subnet in another zone with the same block, which collides with the
    subnet it replaces; the subnets' ids are exports other stacks import, which CloudFormation
    does not change; and FSx, in the trn subnet, would be a new, empty file system. Every subnet
    depends on ``zone_marker``, whose description names the zones and whose name is fixed: a
    deploy that moves a zone stops at it, before any subnet is touched, with CloudFormation's
    "cannot update a stack when a custom-named resource requires replacing" naming it.

    Pod IPs use VPC CNI prefix delegation rather than a secondary CIDR with custom networking:
    no ENIConfig per AZ to keep in step, the node's primary ENI keeps serving pods, and EFA-only
    interfaces take no IPs at all. Its risk, /28 fragmentation, is removed by a subnet CIDR
    reservation of type ``prefix`` in the trn AZ: an AWS::EC2::SubnetCidrReservation in the
    regions of :data:`NATIVE_RESERVATION_REGIONS`, elsewhere (and in a stack without a region)
    EC2's CreateSubnetCidrReservation and DeleteSubnetCidrReservation calls made by CDK's
    AwsCustomResource at deploy time, since CloudFormation offers no such type there.

    Attributes:
        vpc: the VPC.
        cidr: the VPC's IPv4 block (a literal for a new VPC, for rules in other stacks).
        endpoint_security_group: the group of all interface endpoints (None with ``vpc``).
        trn_subnet_selection: the selection of the trn AZ's private subnet (one subnet).
        private_subnets: the selection of all private subnets.
        flow_log_group: the flow log group (None with ``vpc``).
        lustre_clients: a security group for the nodes that mount FSx for Lustre; the file
            system's group admits it (by group, as EFA requires). Created with ``vpc`` too.
        zone_marker: the group that keeps the zones as deployed (None with ``vpc``).

    Raises:
        ValueError: fewer than two AZs, the trn AZ not among them, a bad CIDR or mask, more NAT
            gateways than AZs, an unknown endpoint name, or a given ``vpc`` imported without
            its CIDR block. Each message names the prop.
    """

    vpc: ec2.IVpc
    cidr: str
    flow_log_group: logs.LogGroup | None
    endpoint_security_group: ec2.SecurityGroup | None
    lustre_clients: ec2.SecurityGroup
    zone_marker: ec2.SecurityGroup | None
    _selection: dict[str, Any]

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        trn_availability_zone: str,
        availability_zones: Sequence[str] = (),
        vpc: ec2.IVpc | None = None,
        cidr: str = "10.64.0.0/16",
        private_subnet_mask: int = 18,
        prefix_reservation_mask: int = 20,
        nat_gateways: int = 1,
        interface_endpoints: Sequence[str] = DEFAULT_INTERFACE_ENDPOINTS,
        flow_log_retention_days: int = 30,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        """The props, each with its default (a missing required one: TypeError).

        Args:
            trn_availability_zone: the AZ that holds the Trainium capacity (required).
            availability_zones: the new VPC's AZs, the trn AZ among them; at least two (required
                unless ``vpc`` is given).
            vpc: bring your own VPC instead: the construct then creates nothing and selects its
                private subnets (the trn AZ must have one). Default: a new VPC.
            cidr: the VPC's IPv4 block. Default ``10.64.0.0/16``.
            private_subnet_mask: prefix length of each private subnet. Default 18 (16,379 usable
                addresses per AZ), sized for VPC CNI prefix delegation, which hands out /28 blocks.
            prefix_reservation_mask: prefix length of the ``prefix`` CIDR reservation kept inside
                the trn AZ's private subnet so that /28 prefixes never fragment away. Default 20.
                Fixed once deployed: the reservation is the subnet's last block of this size, so
                another size overlaps the block in place, and CloudFormation creates the new
                reservation before it deletes the old one, which EC2 refuses ("must not overlap an
                existing reservation"). The same holds for the reservation's description.
            nat_gateways: NAT gateways, at most one per AZ. Default 1.
            interface_endpoints: endpoint short names, from :data:`DEFAULT_INTERFACE_ENDPOINTS` or
                ``ec2messages``, ``monitoring``, ``elasticloadbalancing``, ``fsx``.
            flow_log_retention_days: retention of the VPC flow log group. Default 30.
            removal_policy: for the flow log group and its key. Default RETAIN, as aws-cdk-lib keeps
                stateful resources.
        """
        super().__init__(scope, construct_id)
        props = props_of(TrainingNetworkProps, locals())
        _validate(props)
        self.props = props
        if props.vpc is not None:
            self._adopt(props.vpc)
            self.lustre_clients = self._lustre_clients()
            return
        self.cidr = props.cidr
        self.flow_log_key = log_group_key(self, "FlowLogKey", props.removal_policy)
        self.flow_log_group = logs.LogGroup(
            self,
            "FlowLogs",
            encryption_key=self.flow_log_key,
            retention=retention("flow_log_retention_days", props.flow_log_retention_days),
            removal_policy=props.removal_policy,
        )
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(props.cidr),
            availability_zones=list(props.availability_zones),
            nat_gateways=props.nat_gateways,
            restrict_default_security_group=True,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name=PUBLIC_SUBNET_NAME, subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24
                ),
                ec2.SubnetConfiguration(
                    name=PRIVATE_SUBNET_NAME,
                    subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                    cidr_mask=props.private_subnet_mask,
                ),
            ],
            flow_logs={
                "All": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_log_group),
                    traffic_type=ec2.FlowLogTrafficType.ALL,
                )
            },
        )
        self._selection = {"subnet_group_name": PRIVATE_SUBNET_NAME}
        self.private_subnets = ec2.SubnetSelection(subnet_group_name=PRIVATE_SUBNET_NAME)
        self.trn_subnet_selection = ec2.SubnetSelection(
            subnet_group_name=PRIVATE_SUBNET_NAME,
            availability_zones=[props.trn_availability_zone],
        )
        self.vpc.add_gateway_endpoint(
            "S3", service=ec2.GatewayVpcEndpointAwsService.S3, subnets=[self.private_subnets]
        )
        self.endpoint_security_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            description="Interface endpoints: HTTPS from inside the VPC only",
            allow_all_outbound=False,
        )
        self.endpoint_security_group.add_ingress_rule(
            ec2.Peer.ipv4(props.cidr), ec2.Port.tcp(443), "HTTPS from the VPC"
        )
        for name in props.interface_endpoints:
            self.vpc.add_interface_endpoint(
                _endpoint_id(name),
                service=_ENDPOINT_SERVICES[name],
                subnets=self.private_subnets,
                private_dns_enabled=True,
                open=False,
                security_groups=[self.endpoint_security_group],
            )
        self._reserve_prefixes()
        self.zone_marker = self._zone_marker()
        self.lustre_clients = self._lustre_clients()

    def _zone_marker(self) -> ec2.SecurityGroup:
        """A security group whose name stays and whose description (create-only) names the
        zones, on which every subnet depends: a deploy that moves a zone must replace it first,
        and CloudFormation cannot replace a resource of a fixed name, so the update stops before
        any subnet is touched, naming the group, whose name says where to read on."""
        zones = list(self.props.availability_zones)
        marker = ec2.SecurityGroup(
            self,
            "ZoneMarker",
            vpc=self.vpc,
            security_group_name=ZONE_MARKER_NAME,
            description=(
                f"Zones of this VPC: trn {self.props.trn_availability_zone}, all "
                f"{' '.join(zones)}. Fixed once deployed; another trn zone is another "
                "environment"
            ),
            allow_all_outbound=False,
        )
        deny_other_egress(marker)
        for subnet in [*self.vpc.public_subnets, *self.vpc.private_subnets]:
            subnet.node.add_dependency(marker)
        return marker

    def _lustre_clients(self) -> ec2.SecurityGroup:
        group = ec2.SecurityGroup(
            self,
            "LustreClients",
            vpc=self.vpc,
            description="Lustre clients: the nodes that mount FSx for Lustre",
            allow_all_outbound=False,
        )
        # Rules come from the file system's side; nothing else goes out through this group.
        deny_other_egress(group)
        return group

    def _adopt(self, vpc: ec2.IVpc) -> None:
        """Bring-your-own VPC: select its private subnets; create nothing inside it but the
        Lustre clients group."""
        self.vpc = vpc
        try:
            self.cidr = vpc.vpc_cidr_block
        except RuntimeError:
            raise ValueError(
                f"vpc {vpc.node.path!r} was imported without its CIDR block; import it with "
                "ec2.Vpc.from_vpc_attributes(..., vpc_cidr_block=...)"
            ) from None
        self.flow_log_group = None
        self.endpoint_security_group = None
        self.zone_marker = None
        self._selection = {"subnet_type": ec2.SubnetType.PRIVATE_WITH_EGRESS}
        self.private_subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        self.trn_subnet_selection = ec2.SubnetSelection(
            subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
            availability_zones=[self.props.trn_availability_zone],
        )
        zones = [s.availability_zone for s in vpc.private_subnets]
        if self.props.trn_availability_zone not in zones:
            raise ValueError(
                f"trn_availability_zone {self.props.trn_availability_zone!r} has no private "
                f"subnet in the given vpc; its private subnets are in {zones!r}"
            )

    @property
    def trn_subnet(self) -> ec2.ISubnet:
        """The private subnet of the trn AZ: trn nodes, FSx and the EFA placement live here."""
        return self.vpc.select_subnets(
            **self._selection,
            availability_zones=[self.props.trn_availability_zone],
        ).subnets[0]

    def _reserve_prefixes(self) -> None:
        subnet_cidr = ipaddress.ip_network(self.trn_subnet.ipv4_cidr_block)
        reserved = list(subnet_cidr.subnets(new_prefix=self.props.prefix_reservation_mask))[-1]
        reservation = {
            "SubnetId": self.trn_subnet.subnet_id,
            "Cidr": str(reserved),
            "ReservationType": "prefix",
            "Description": "Contiguous /28 prefixes for VPC CNI prefix delegation on trn nodes",
        }
        if Stack.of(self).region in NATIVE_RESERVATION_REGIONS:
            ec2.CfnSubnetCidrReservation(
                self,
                "TrnPrefixReservation",
                subnet_id=reservation["SubnetId"],
                cidr=reservation["Cidr"],
                reservation_type=reservation["ReservationType"],
                description=reservation["Description"],
            )
        else:
            self._reserve_prefixes_by_call(reservation)

    def _reserve_prefixes_by_call(self, reservation: dict[str, str]) -> None:
        # A new subnet creates a reservation under a new id; CloudFormation then deletes the old
        # one by its id. In the same subnet a new block overlaps the old one, which EC2 refuses
        # (the mask is fixed once deployed, see TrainingNetworkProps).
        create = cr.AwsSdkCall(
            service="EC2",
            action="CreateSubnetCidrReservation",
            parameters=reservation,
            physical_resource_id=cr.PhysicalResourceId.from_response(
                "SubnetCidrReservation.SubnetCidrReservationId"
            ),
        )
        call = cr.AwsCustomResource(
            self,
            "TrnPrefixReservationCall",
            on_create=create,
            on_update=create,
            on_delete=cr.AwsSdkCall(
                service="EC2",
                action="DeleteSubnetCidrReservation",
                parameters={"SubnetCidrReservationId": cr.PhysicalResourceIdReference()},
            ),
            policy=cr.AwsCustomResourcePolicy.from_statements(
                [
                    iam.PolicyStatement(
                        actions=[
                            "ec2:CreateSubnetCidrReservation",
                            "ec2:DeleteSubnetCidrReservation",
                        ],
                        resources=["*"],
                    )
                ]
            ),
            # The SDK in Lambda's runtime has both calls; installing another needs the internet.
            install_latest_aws_sdk=False,
        )
        acknowledge_sdk_call_provider(self)
        acknowledge(
            call,
            "AwsSolutions-IAM5[Resource::*]",
            "A reservation's id exists only once created, so its ARN cannot be named up front; "
            "the policy allows making and deleting reservations only, at deploy time.",
        )


def _validate(props: TrainingNetworkProps) -> None:
    if props.vpc is not None:
        return
    azs = list(props.availability_zones)
    if len(azs) < 2 or len(set(azs)) != len(azs):
        raise ValueError(
            f"availability_zones {azs!r} must name at least two distinct availability zones"
        )
    if props.trn_availability_zone not in azs:
        raise ValueError(
            f"trn_availability_zone {props.trn_availability_zone!r} must be one of "
            f"availability_zones {azs!r}"
        )
    try:
        network = ipaddress.ip_network(props.cidr)
    except ValueError:
        raise ValueError(
            f"cidr {props.cidr!r} is not an IPv4 network such as 10.64.0.0/16"
        ) from None
    if not 16 <= network.prefixlen <= 20:
        raise ValueError(f"cidr {props.cidr!r} must have a prefix length from /16 to /20")
    needed = len(azs) * (2 ** (32 - props.private_subnet_mask) + 256)
    if not network.prefixlen < props.private_subnet_mask <= 24 or needed > network.num_addresses:
        raise ValueError(
            f"private_subnet_mask {props.private_subnet_mask} does not fit {len(azs)} private and "
            f"public subnets into {props.cidr}; use a longer mask (at most 24) or a larger cidr"
        )
    if not props.private_subnet_mask < props.prefix_reservation_mask <= 28:
        raise ValueError(
            f"prefix_reservation_mask {props.prefix_reservation_mask} must lie between "
            f"private_subnet_mask {props.private_subnet_mask} (exclusive) and 28"
        )
    if not 0 <= props.nat_gateways <= len(azs):
        raise ValueError(
            f"nat_gateways {props.nat_gateways} must be from 0 to the number of AZs ({len(azs)})"
        )
    unknown = sorted(set(props.interface_endpoints) - set(_ENDPOINT_SERVICES))
    if unknown:
        raise ValueError(
            f"interface_endpoints {unknown!r} are unknown; known: {', '.join(_ENDPOINT_SERVICES)}"
        )


def _endpoint_id(name: str) -> str:
    return "".join(part.capitalize() for part in name.replace("-", ".").split(".")) + "Endpoint"
