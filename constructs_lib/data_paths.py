"""TrainingDataPaths: S3 buckets and an FSx for Lustre file system linked to them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from constructs_lib._common import (
    acknowledge_wildcards,
    check_subnet_zone,
    deny_other_egress,
    subnet_zone,
)
from constructs_lib._props import props_of
from constructs_lib.trainium_nodegroup import TrainiumNodeGroup
from trn_catalog import fsx as fsx_limits

# Lustre client traffic: TCP 988 and 1018-1023 (FSx user guide, "File system access control").
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))
DATASETS_PATH = "/datasets"
CHECKPOINTS_PATH = "/checkpoints"


@dataclass(frozen=True)
class TrainingDataPathsProps:
    """What a :class:`TrainingDataPaths` was built with (its ``props``): the keyword arguments of
    its constructor, where each is documented with its default."""

    vpc: ec2.IVpc
    fsx_subnet: ec2.ISubnet
    trn_availability_zone: str | None
    lustre_clients: ec2.IPeer | None
    fsx_storage_gib: int
    fsx_throughput_per_tib: int
    efa_fsx: bool
    removal_policy: RemovalPolicy
    checkpoint_noncurrent_days: int
    compile_cache_expiry_days: int
    access_log_expiry_days: int
    encryption_key: kms.IKey | None
    datasets_bucket: s3.IBucket | None
    datasets_key: kms.IKey | None
    checkpoints_bucket: s3.IBucket | None
    checkpoints_key: kms.IKey | None
    access_logs_bucket: s3.IBucket | None


class TrainingDataPaths(Construct):
    """Datasets, checkpoints and the Neuron compile cache in S3, with FSx for Lustre in front.

    Default settings: every bucket blocks public access, enforces TLS, writes server access logs
    to a dedicated log bucket and is encrypted with a rotating customer-managed KMS key (bucket
    keys on, so many small cache objects do not each cost a KMS call). Datasets and checkpoints
    are versioned; the compile cache is not (it is rebuildable) and expires instead. The file
    system is PERSISTENT_2, Lustre 2.15, LZ4-compressed, KMS-encrypted, in one subnet, with
    automatic metadata IOPS. ``/datasets`` imports from the datasets bucket and ``/checkpoints``
    exports to the checkpoints bucket, both automatically.

    Three roles for pods, trusted by EKS Pod Identity: ``job_role`` reads datasets and reads and
    writes checkpoints and the compile cache; ``mountpoint_role`` reads datasets;
    ``pipeline_role`` (scheduled pipelines' controllers) reads and writes datasets (versions,
    manifests, run records) and reads checkpoints (exports). Bind them to service accounts with
    :class:`TrainingWorkspace` and :class:`PipelineAccess`.

    Attributes:
        key, datasets, checkpoints, compile_cache, access_logs, file_system,
        lustre_security_group, dataset_association, checkpoint_association, job_role,
        mountpoint_role, pipeline_role.

    Raises:
        ValueError: storage or throughput not allowed for PERSISTENT_2 (or for EFA), EFA with
            CIDR clients, a lifecycle period below one day, a ``datasets_key`` or
            ``checkpoints_key`` without its bucket, or an ``fsx_subnet`` outside
            ``trn_availability_zone``; each message names the prop, the value and what is
            allowed.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        fsx_subnet: ec2.ISubnet,
        trn_availability_zone: str | None = None,
        lustre_clients: ec2.IPeer | None = None,
        fsx_storage_gib: int = fsx_limits.FSX_MIN_GIB,
        fsx_throughput_per_tib: int = 125,
        efa_fsx: bool = False,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        checkpoint_noncurrent_days: int = 14,
        compile_cache_expiry_days: int = 90,
        access_log_expiry_days: int = 365,
        encryption_key: kms.IKey | None = None,
        datasets_bucket: s3.IBucket | None = None,
        datasets_key: kms.IKey | None = None,
        checkpoints_bucket: s3.IBucket | None = None,
        checkpoints_key: kms.IKey | None = None,
        access_logs_bucket: s3.IBucket | None = None,
    ) -> None:
        """The props, each with its default (a missing required one: TypeError).

        Args:
            vpc: the VPC the file system lives in (required).
            fsx_subnet: the single subnet of the file system; put it in the trn AZ (required).
            trn_availability_zone: the AZ of the Trainium capacity. When given, ``fsx_subnet`` must
                be in it wherever its AZ is known at synth (a subnet made in the app, or imported
                with ``availability_zone``). Default none: unchecked, but
                :meth:`TrainingDataPaths.allow_mount_from` still refuses a node group of another AZ.
            lustre_clients: who may mount the file system: a security group the client nodes carry,
                such as ``TrainingNetwork.lustre_clients`` (a group with ``efa_fsx``: EFA takes no
                CIDR rules), or a CIDR peer such as ``ec2.Peer.ipv4(vpc_cidr)``. Default none: open
                the file system to node groups with :meth:`TrainingDataPaths.allow_mount_from`.
            fsx_storage_gib: 1,200 or a multiple of 2,400; with ``efa_fsx`` a multiple of 38,400,
                19,200, 9,600 or 4,800 at 125, 250, 500 or 1000 MB/s per TiB. Default 1200.
            fsx_throughput_per_tib: 125, 250, 500 or 1000 MB/s per TiB. Default 125.
            efa_fsx: EFA-enabled file system (Lustre over EFA to EFA clients; FSx serves no EFA to
                the trn2 family). Default False.
            removal_policy: of the buckets, key and file system this construct creates; DESTROY also
                empties the buckets on deletion. Default RETAIN, as aws-cdk-lib keeps stateful
                resources (resources you bring are never touched).
            checkpoint_noncurrent_days: days an overwritten or deleted checkpoint version is kept
                (jobs may not delete versions). Default 14.
            compile_cache_expiry_days: days a compile-cache object lives; a stale NEFF only costs a
                recompile. Default 90.
            access_log_expiry_days: days S3 server access logs are kept. Default 365.
            encryption_key: bring your own KMS key for buckets and file system; its key policy must
                let FSx's S3-access role
                (``aws-service-role/s3.data-source.lustre.fsx.amazonaws.com``) use it through S3, or
                the data repository associations fail. Default: a new key, with that statement.
            datasets_bucket: bring your own datasets bucket (imported into ``/datasets`` and read by
                jobs; its encryption key must let FSx's S3-access role use it). Default: a new
                bucket.
            datasets_key: the KMS key of your ``datasets_bucket`` when the bucket object does not
                carry it: the job and Mountpoint roles get ``kms:Decrypt`` on it. A bucket imported
                with ``s3.Bucket.from_bucket_attributes(..., encryption_key=key)`` (or made in your
                app with its key) carries its key, and its grants include the key already. Default
                none.
            checkpoints_bucket: bring your own checkpoints bucket (exported from ``/checkpoints``,
                read and written by jobs; its key, if any, as for ``datasets_bucket``; the
                checkpoint lifecycle props do not apply to it). Default: a new versioned bucket.
            checkpoints_key: the KMS key of your ``checkpoints_bucket`` when the bucket object does
                not carry it: the job role gets ``kms:Decrypt`` and ``kms:GenerateDataKey*`` on it
                (S3 needs both to read and write SSE-KMS objects). Default none.
            access_logs_bucket: bring your own bucket for the S3 server access logs of the buckets
                this construct creates (it must admit log delivery from ``logging.s3.amazonaws.com``
                and use SSE-S3; an imported bucket's policy is yours to keep so). Default: a new
                SSE-S3 bucket.
        """
        super().__init__(scope, construct_id)
        props = props_of(TrainingDataPathsProps, locals())
        check_subnet_zone("fsx_subnet", props.fsx_subnet, props.trn_availability_zone)
        # Grant log delivery through the bucket policy, not ACLs, whatever the app's flags say:
        # ACL delivery needs ObjectWriter ownership, which would re-enable ACLs on the buckets.
        self.node.set_context("@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy", True)
        _validate(props)
        self.props = props
        removal = props.removal_policy
        self.key = props.encryption_key or kms.Key(
            self,
            "DataKey",
            description="Encrypts training datasets, checkpoints, compile cache and FSx",
            enable_key_rotation=True,
            removal_policy=removal,
        )
        self.access_logs = props.access_logs_bucket or self._access_log_bucket(removal)
        self.datasets: s3.IBucket = props.datasets_bucket or self._bucket(
            "Datasets",
            removal,
            versioned=True,
            rules=[
                _abort_uploads(),
                s3.LifecycleRule(
                    id="expire-old-versions", noncurrent_version_expiration=Duration.days(30)
                ),
            ],
        )
        self.checkpoints: s3.IBucket = props.checkpoints_bucket or self._bucket(
            "Checkpoints",
            removal,
            versioned=True,
            rules=[
                _abort_uploads(),
                s3.LifecycleRule(
                    id="expire-old-versions",
                    noncurrent_version_expiration=Duration.days(props.checkpoint_noncurrent_days),
                ),
                s3.LifecycleRule(
                    id="tier-old-checkpoints",
                    transitions=[
                        s3.Transition(
                            storage_class=s3.StorageClass.INTELLIGENT_TIERING,
                            transition_after=Duration.days(30),
                        )
                    ],
                ),
            ],
        )
        self.compile_cache = self._bucket(
            "CompileCache",
            removal,
            versioned=False,
            rules=[
                _abort_uploads(),
                s3.LifecycleRule(
                    id="expire-stale-cache",
                    expiration=Duration.days(props.compile_cache_expiry_days),
                ),
            ],
        )
        self._allow_fsx_data_repository_role()
        self.lustre_security_group = self._lustre_security_group()
        self.connections = ec2.Connections(
            security_groups=[self.lustre_security_group], default_port=LUSTRE_PORTS[0]
        )
        if props.lustre_clients is not None:
            self.allow_mount_from(props.lustre_clients)
        self.file_system = self._file_system(removal)
        self.dataset_association = self._association(
            "DatasetsAssociation", DATASETS_PATH, self.datasets, imports=True
        )
        self.checkpoint_association = self._association(
            "CheckpointsAssociation", CHECKPOINTS_PATH, self.checkpoints, imports=False
        )
        self.job_role, self.mountpoint_role, self.pipeline_role = self._pod_roles()

    @property
    def compile_cache_url(self) -> str:
        """The ``NEURON_COMPILE_CACHE_URL`` for jobs (a token until deploy)."""
        return f"s3://{self.compile_cache.bucket_name}/neuron-compile-cache"

    def _pod_roles(self) -> tuple[iam.Role, iam.Role, iam.Role]:
        """Roles for Kubernetes pods (bound to service accounts by EKS Pod Identity elsewhere).

        They live here, beside the buckets they reach, so that the data stack never depends on
        the cluster and its grants name this stack's resources only.
        """
        roles = []
        for construct_id, description in (
            ("JobRole", "Training jobs: read datasets; read and write checkpoints and cache"),
            ("MountpointRole", "Mountpoint S3 CSI driver: read the datasets bucket"),
            ("PipelineRole", "Pipelines: read and write datasets and models; read exports"),
        ):
            roles.append(
                iam.Role(
                    self,
                    construct_id,
                    assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com").with_session_tags(),
                    description=description,
                )
            )
        job, mountpoint, pipeline = roles
        self.datasets.grant_read(job)
        self.checkpoints.grant_read_write(job)
        self.compile_cache.grant_read_write(job)
        self.datasets.grant_read(mountpoint)
        self.datasets.grant_read_write(pipeline)
        self.checkpoints.grant_read(pipeline)
        if self.props.datasets_key is not None:
            for role in roles:
                self.props.datasets_key.grant_decrypt(role)
            self.props.datasets_key.grant(pipeline, "kms:GenerateDataKey*")
        if self.props.checkpoints_key is not None:
            self.props.checkpoints_key.grant(job, "kms:Decrypt", "kms:GenerateDataKey*")
            self.props.checkpoints_key.grant_decrypt(pipeline)
        # Versions are never rewritten: the pipeline writes new keys and conditional updates of
        # manifests, and has no use for purging the older versions the bucket keeps.
        pipeline.add_to_policy(
            iam.PolicyStatement(
                effect=iam.Effect.DENY,
                actions=["s3:DeleteObjectVersion"],
                resources=[self.datasets.arn_for_objects("*")],
            )
        )
        # grant_read_write's s3:DeleteObject* includes DeleteObjectVersion: a job could purge the
        # older checkpoint versions the bucket keeps for checkpoint_noncurrent_days.
        job.add_to_policy(
            iam.PolicyStatement(
                effect=iam.Effect.DENY,
                actions=["s3:DeleteObjectVersion"],
                resources=[self.checkpoints.arn_for_objects("*")],
            )
        )
        for role in roles:
            acknowledge_wildcards(
                role,
                "Wildcards (bucket/*, s3:GetObject*, s3:DeleteObject*, kms:GenerateDataKey*) come "
                "from CDK's grant_read/grant_read_write on the data buckets and their keys; jobs "
                "address objects by key, which cannot be listed ahead of time; deleting object "
                "versions of checkpoints is denied.",
            )
        return job, mountpoint, pipeline

    def allow_mount_from(self, *clients: ec2.IConnectable) -> None:
        """Let ``clients`` mount the file system: node groups (``TrainiumNodeGroup``,
        ``GpuNodeGroup``), security groups or CIDR peers.

        Adds the Lustre rules in both directions between the file system's group and each of
        the clients' groups: TCP 988 and 1018-1023 (all traffic with ``efa_fsx``, which EFA
        needs), ingress and egress on either side, the clients' side kept in this stack.

        Raises:
            ValueError: a CIDR client with ``efa_fsx`` (EFA takes security groups only), or a
                node group whose subnet is in another AZ than ``fsx_subnet`` (both known).
        """
        for client in clients:
            self._check_same_zone(client)
            groups = client.connections.security_groups
            if self.props.efa_fsx and not groups:
                raise ValueError(
                    "allow_mount_from: a client without security groups cannot mount an "
                    "efa_fsx file system; FSx for Lustre over EFA takes no CIDR rules"
                )
            peers: list[ec2.IPeer] = list(groups) or [cast(ec2.IPeer, client)]
            for peer in peers:
                self._allow_client(peer)

    def _check_same_zone(self, client: ec2.IConnectable) -> None:
        """A node group mounts FSx in its own AZ only: the trn AZ, where EFA and the
        placement group keep the nodes."""
        if not isinstance(client, TrainiumNodeGroup):
            return
        zone, fsx_zone = subnet_zone(client.props.subnet), subnet_zone(self.props.fsx_subnet)
        if zone is not None and fsx_zone is not None and zone != fsx_zone:
            raise ValueError(
                f"allow_mount_from: node group {client.node.path!r} is in {zone!r} and "
                f"fsx_subnet in {fsx_zone!r}; put the file system in the node group's AZ"
            )

    def _allow_client(self, clients: ec2.IPeer) -> None:
        group = self.lustre_security_group
        for port in self._client_ports:
            group.add_ingress_rule(clients, port, "Lustre from clients")
            group.add_egress_rule(clients, port, "Lustre to clients")
            if ec2.SecurityGroup.is_security_group(clients):
                # The clients' side of the same rules, kept in this stack (remote rules).
                peer = cast(ec2.ISecurityGroup, clients)
                peer.add_ingress_rule(group, port, "Lustre from the file servers", True)
                peer.add_egress_rule(group, port, "Lustre to the file servers", True)

    def _access_log_bucket(self, removal: RemovalPolicy) -> s3.Bucket:
        # S3 delivers server access logs only to SSE-S3 buckets, so this one bucket is not on KMS.
        return s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            removal_policy=removal,
            auto_delete_objects=removal == RemovalPolicy.DESTROY,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-logs",
                    expiration=Duration.days(self.props.access_log_expiry_days),
                    noncurrent_version_expiration=Duration.days(1),
                ),
            ],
        )

    def _bucket(
        self,
        construct_id: str,
        removal: RemovalPolicy,
        *,
        versioned: bool,
        rules: list[s3.LifecycleRule],
    ) -> s3.Bucket:
        return s3.Bucket(
            self,
            construct_id,
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.key,
            bucket_key_enabled=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=versioned,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix=f"{construct_id.lower()}/",
            removal_policy=removal,
            auto_delete_objects=removal == RemovalPolicy.DESTROY,
            lifecycle_rules=rules,
        )

    def _allow_fsx_data_repository_role(self) -> None:
        """Let FSx's S3-access service-linked role use the key, via S3 only.

        The role's name carries the file system id (AWSServiceRoleForFSxS3Access_fs-...), which
        does not exist before deploy, so the key policy matches its path instead.
        """
        stack = Stack.of(self)
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowFsxDataRepositoryAccess",
                # The actions the FSx for Lustre guide gives this role for SSE-KMS buckets
                # ("Working with server-side encrypted Amazon S3 buckets"). The conditions differ:
                # the role is matched by path, its name not being known before deploy, and the
                # guide's encryption-context condition on the bucket ARN is left out, since the
                # key serves every bucket of the construct.
                actions=[
                    "kms:Encrypt",
                    "kms:Decrypt",
                    "kms:ReEncrypt*",
                    "kms:GenerateDataKey*",
                    "kms:DescribeKey",
                ],
                principals=[iam.AnyPrincipal()],
                resources=["*"],
                conditions={
                    "StringEquals": {
                        "aws:PrincipalAccount": stack.account,
                        "kms:ViaService": f"s3.{stack.region}.amazonaws.com",
                    },
                    "ArnLike": {
                        "aws:PrincipalArn": (
                            f"arn:{stack.partition}:iam::{stack.account}:role/aws-service-role/"
                            "s3.data-source.lustre.fsx.amazonaws.com/*"
                        )
                    },
                },
            )
        )

    def _lustre_security_group(self) -> ec2.SecurityGroup:
        group = ec2.SecurityGroup(
            self,
            "LustreSecurityGroup",
            vpc=self.props.vpc,
            description="FSx for Lustre: Lustre ports from clients and between file servers",
            allow_all_outbound=False,
        )
        if self.props.efa_fsx:
            # EFA needs all traffic between the file servers and between them and their clients,
            # in and out, named by security group.
            self._client_ports = [ec2.Port.all_traffic()]
            group.add_ingress_rule(group, ec2.Port.all_traffic(), "EFA between file servers")
            group.add_egress_rule(group, ec2.Port.all_traffic(), "EFA between file servers")
        else:
            self._client_ports = list(LUSTRE_PORTS)
            for port in LUSTRE_PORTS:
                # Ingress between file servers comes from LustreFileSystem (988-1023 from itself).
                group.add_egress_rule(group, port, "Lustre between file servers")
        deny_other_egress(group)
        return group

    def _file_system(self, removal: RemovalPolicy) -> fsx.LustreFileSystem:
        props = self.props
        file_system = fsx.LustreFileSystem(
            self,
            "FileSystem",
            vpc=props.vpc,
            vpc_subnet=props.fsx_subnet,
            storage_capacity_gib=props.fsx_storage_gib,
            file_system_type_version=fsx.FileSystemTypeVersion.V_2_15,
            kms_key=self.key,
            security_group=self.lustre_security_group,
            removal_policy=removal,
            lustre_configuration=fsx.LustreConfiguration(
                deployment_type=fsx.LustreDeploymentType.PERSISTENT_2,
                per_unit_storage_throughput=props.fsx_throughput_per_tib,
                data_compression_type=fsx.LustreDataCompressionType.LZ4,
                weekly_maintenance_start_time=fsx.LustreMaintenanceTime(
                    day=fsx.Weekday.SUNDAY, hour=3, minute=0
                ),
            ),
        )
        cfn = file_system.node.default_child
        assert isinstance(cfn, fsx.CfnFileSystem)
        cfn.add_property_override("LustreConfiguration.MetadataConfiguration.Mode", "AUTOMATIC")
        if props.efa_fsx:
            cfn.add_property_override("LustreConfiguration.EfaEnabled", True)
        return file_system

    def _association(
        self, construct_id: str, path: str, bucket: s3.IBucket, *, imports: bool
    ) -> fsx.CfnDataRepositoryAssociation:
        events = ["NEW", "CHANGED", "DELETED"]
        s3_policy = (
            fsx.CfnDataRepositoryAssociation.S3Property(
                auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(
                    events=events
                )
            )
            if imports
            else fsx.CfnDataRepositoryAssociation.S3Property(
                auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(
                    events=events
                )
            )
        )
        return fsx.CfnDataRepositoryAssociation(
            self,
            construct_id,
            file_system_id=self.file_system.file_system_id,
            file_system_path=path,
            data_repository_path=f"s3://{bucket.bucket_name}",
            batch_import_meta_data_on_create=imports,
            imported_file_chunk_size=1024,
            s3=s3_policy,
        )


def _abort_uploads() -> s3.LifecycleRule:
    return s3.LifecycleRule(
        id="abort-incomplete-uploads", abort_incomplete_multipart_upload_after=Duration.days(1)
    )


def _validate(props: TrainingDataPathsProps) -> None:
    if not fsx_limits.storage_allowed(props.fsx_storage_gib):
        raise ValueError(
            f"fsx_storage_gib {props.fsx_storage_gib} is not allowed; {fsx_limits.STORAGE_RULE}"
        )
    if props.efa_fsx and not fsx_limits.efa_storage_allowed(
        props.fsx_storage_gib, props.fsx_throughput_per_tib
    ):
        raise ValueError(
            f"fsx_storage_gib {props.fsx_storage_gib} is not allowed; "
            f"{fsx_limits.efa_storage_rule(props.fsx_throughput_per_tib)}"
        )
    if (
        props.efa_fsx
        and props.lustre_clients is not None
        and not ec2.SecurityGroup.is_security_group(props.lustre_clients)
    ):
        raise ValueError(
            "lustre_clients must be a security group with efa_fsx; "
            "FSx for Lustre over EFA takes no CIDR rules"
        )
    if not fsx_limits.throughput_allowed(props.fsx_throughput_per_tib):
        raise ValueError(
            f"fsx_throughput_per_tib {props.fsx_throughput_per_tib} is not allowed; "
            f"{fsx_limits.THROUGHPUT_RULE}"
        )
    for key, bucket in (
        ("datasets_key", "datasets_bucket"),
        ("checkpoints_key", "checkpoints_bucket"),
    ):
        if getattr(props, key) is not None and getattr(props, bucket) is None:
            raise ValueError(
                f"{key} is the key of your {bucket}; without {bucket} the construct's own "
                "bucket uses encryption_key"
            )
    for name in (
        "checkpoint_noncurrent_days",
        "compile_cache_expiry_days",
        "access_log_expiry_days",
    ):
        days = getattr(props, name)
        if days < 1:
            raise ValueError(f"{name} {days} is not allowed; use a whole number of days >= 1")
