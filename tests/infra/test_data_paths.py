import json
from collections.abc import Callable
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3

from constructs_lib import TrainingDataPaths
from tests.conftest import Synth, construct_app


def buckets(synth: Synth) -> dict[str, dict[str, Any]]:
    """Buckets keyed by their construct id (Datasets, Checkpoints, CompileCache, AccessLogs)."""
    found = {}
    for logical_id, resource in synth.resources("data", "AWS::S3::Bucket").items():
        for name in ("Datasets", "Checkpoints", "CompileCache", "AccessLogs"):
            if logical_id.startswith(f"DataPaths{name}"):
                found[name] = resource
    assert len(found) == 4
    return found


def rules(bucket: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["Id"]: r for r in bucket["Properties"]["LifecycleConfiguration"]["Rules"]}


def test_every_bucket_blocks_public_access_and_is_encrypted(dev: Synth) -> None:
    for name, bucket in buckets(dev).items():
        props = bucket["Properties"]
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True,
            "BlockPublicPolicy": True,
            "IgnorePublicAcls": True,
            "RestrictPublicBuckets": True,
        }, name
        (encryption,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        algorithm = encryption["ServerSideEncryptionByDefault"]["SSEAlgorithm"]
        assert algorithm == ("AES256" if name == "AccessLogs" else "aws:kms"), name


def test_data_buckets_use_the_data_key_with_bucket_keys(dev: Synth) -> None:
    (key_id,) = dev.resources("data", "AWS::KMS::Key")
    for name, bucket in buckets(dev).items():
        if name == "AccessLogs":
            continue
        (encryption,) = bucket["Properties"]["BucketEncryption"][
            "ServerSideEncryptionConfiguration"
        ]
        assert encryption["BucketKeyEnabled"] is True
        key_ref = encryption["ServerSideEncryptionByDefault"]["KMSMasterKeyID"]
        assert key_ref == {"Fn::GetAtt": [key_id, "Arn"]}


def test_every_bucket_policy_denies_plain_http(dev: Synth) -> None:
    policies = dev.resources("data", "AWS::S3::BucketPolicy").values()
    assert len(policies) == 4
    for policy in policies:
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        assert any(
            s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
            for s in statements
        )


def test_every_data_bucket_logs_to_the_access_log_bucket(dev: Synth) -> None:
    found = buckets(dev)
    (log_id,) = [
        i for i in dev.resources("data", "AWS::S3::Bucket") if i.startswith("DataPathsAccessLogs")
    ]
    for name, bucket in found.items():
        if name == "AccessLogs":
            assert "LoggingConfiguration" not in bucket["Properties"]
            continue
        logging = bucket["Properties"]["LoggingConfiguration"]
        assert logging["DestinationBucketName"] == {"Ref": log_id}


def test_versioning_protects_datasets_and_checkpoints_not_the_cache(dev: Synth) -> None:
    found = buckets(dev)
    for name in ("Datasets", "Checkpoints", "AccessLogs"):
        assert found[name]["Properties"]["VersioningConfiguration"] == {"Status": "Enabled"}
    assert "VersioningConfiguration" not in found["CompileCache"]["Properties"]


def test_lifecycle_rules(dev: Synth) -> None:
    found = buckets(dev)
    checkpoints = rules(found["Checkpoints"])
    assert checkpoints["expire-old-versions"]["NoncurrentVersionExpiration"] == {
        "NoncurrentDays": 14
    }
    assert checkpoints["tier-old-checkpoints"]["Transitions"] == [
        {"StorageClass": "INTELLIGENT_TIERING", "TransitionInDays": 30}
    ]
    assert rules(found["CompileCache"])["expire-stale-cache"]["ExpirationInDays"] == 90
    assert rules(found["AccessLogs"])["expire-logs"]["ExpirationInDays"] == 365
    for name in ("Datasets", "Checkpoints", "CompileCache"):
        abort = rules(found[name])["abort-incomplete-uploads"]
        assert abort["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}


def file_system(synth: Synth) -> dict[str, Any]:
    (fs,) = synth.resources("data", "AWS::FSx::FileSystem").values()
    return fs


def test_fsx_is_persistent_2_lz4_kms_in_the_trn_az(dev: Synth) -> None:
    fs = file_system(dev)
    props = fs["Properties"]
    lustre = props["LustreConfiguration"]
    assert props["FileSystemType"] == "LUSTRE" and props["FileSystemTypeVersion"] == "2.15"
    assert lustre["DeploymentType"] == "PERSISTENT_2"
    assert lustre["DataCompressionType"] == "LZ4"
    assert lustre["PerUnitStorageThroughput"] == 125
    assert lustre["MetadataConfiguration"] == {"Mode": "AUTOMATIC"}
    assert "EfaEnabled" not in lustre
    assert props["StorageCapacity"] == 1200
    (key_id,) = dev.resources("data", "AWS::KMS::Key")
    assert props["KmsKeyId"] == {"Ref": key_id}


def exported(synth: Synth, reference: Any) -> tuple[str, str]:
    """(stack suffix, logical id) of the resource behind a cross-stack ``Fn::ImportValue``."""
    name = reference["Fn::ImportValue"]
    for stack_name, template in synth.templates.items():
        for output in template.get("Outputs", {}).values():
            if output.get("Export", {}).get("Name") == name:
                value = output["Value"]
                logical_id = value["Ref"] if "Ref" in value else value["Fn::GetAtt"][0]
                return stack_name.rsplit("-", 1)[1], logical_id
    raise AssertionError(f"no stack exports {name}")


@pytest.mark.parametrize("variant", ["dev", "prod"])
def test_fsx_sits_in_the_trn_subnet_with_the_trn_nodes(
    synth_variant: Callable[[str], Synth], variant: str
) -> None:
    synth = synth_variant(variant)
    (subnet,) = file_system(synth)["Properties"]["SubnetIds"]
    stack, subnet_id = exported(synth, subnet)
    props = synth.template("network")["Resources"][subnet_id]["Properties"]
    tags = {t["Key"]: t["Value"] for t in props["Tags"]}
    assert stack == "network" and tags["aws-cdk:subnet-name"] == "Private"
    assert props["AvailabilityZone"] == synth.platform.network.network.props.trn_availability_zone
    (trn,) = [
        g["Properties"]
        for g in synth.resources("cluster", "AWS::EKS::Nodegroup").values()
        if g["Properties"]["AmiType"] == "AL2023_x86_64_NEURON"
    ]
    assert trn["Subnets"] == [subnet]


def test_fsx_sizes_follow_the_profile(prod: Synth) -> None:
    props = file_system(prod)["Properties"]
    assert props["StorageCapacity"] == 4800
    assert props["LustreConfiguration"]["PerUnitStorageThroughput"] == 250


Rule = tuple[str, str, str, str, int | None, int | None]


def lustre_clients_id(synth: Synth) -> str:
    """The logical id of the network's Lustre clients group."""
    group = synth.platform.network.network.lustre_clients
    logical_id: str = synth.platform.network.resolve(group.node.default_child.logical_id)
    return logical_id


def lustre_rules(synth: Synth) -> set[Rule]:
    """(group, direction, peer, protocol, from, to) of every separate rule in the data stack;
    groups and peers are 'servers' (the file system's group), 'clients' (the network's Lustre
    clients group, by its export) or, for anything else, the reference as written."""
    (servers,) = synth.resources("data", "AWS::EC2::SecurityGroup")
    clients = lustre_clients_id(synth)

    def who(reference: Any) -> str:
        if reference == {"Fn::GetAtt": [servers, "GroupId"]}:
            return "servers"
        if "Fn::ImportValue" in reference and exported(synth, reference) == ("network", clients):
            return "clients"
        return json.dumps(reference)

    rules = set()
    for kind, peer_field in (
        ("ingress", "SourceSecurityGroupId"),
        ("egress", "DestinationSecurityGroupId"),
    ):
        resource_type = f"AWS::EC2::SecurityGroup{kind.capitalize()}"
        for resource in synth.resources("data", resource_type).values():
            p = resource["Properties"]
            peer = who(p[peer_field]) if peer_field in p else p["CidrIp"]
            rules.add(
                (who(p["GroupId"]), kind, peer, p["IpProtocol"], p.get("FromPort"), p.get("ToPort"))
            )
    return rules


LUSTRE = [("tcp", 988, 988), ("tcp", 1018, 1023)]


def test_lustre_ports_open_between_servers_and_the_client_group_only(dev: Synth) -> None:
    both_ways = {
        (group, kind, peer, *port)
        for group, peer in (("servers", "clients"), ("clients", "servers"))
        for kind in ("ingress", "egress")
        for port in LUSTRE
    }
    between_servers = {("servers", "egress", "servers", *port) for port in LUSTRE}
    # LustreFileSystem opens 988-1023 from the group itself.
    from_self = {("servers", "ingress", "servers", "tcp", 988, 1023)}
    assert lustre_rules(dev) == both_ways | between_servers | from_self
    (servers,) = dev.resources("data", "AWS::EC2::SecurityGroup").values()
    # The inline placeholder keeps EC2 from adding its default allow-all egress rule.
    inline = servers["Properties"]["SecurityGroupEgress"]
    assert [r["CidrIp"] for r in inline] == ["255.255.255.255/32"]
    assert "SecurityGroupIngress" not in servers["Properties"]


def test_efa_fsx_enables_efa_and_opens_all_traffic_by_group(
    synth_variant: Callable[[str], Synth],
) -> None:
    efa = synth_variant("efa-fsx")
    lustre = file_system(efa)["Properties"]["LustreConfiguration"]
    assert lustre["EfaEnabled"] is True
    assert lustre["MetadataConfiguration"] == {"Mode": "AUTOMATIC"}
    assert (
        file_system(efa)["Properties"]["StorageCapacity"],
        lustre["PerUnitStorageThroughput"],
    ) == (
        4800,
        1000,
    )
    all_traffic = {
        (group, kind, peer, "-1", None, None)
        for group, peer in (("servers", "servers"), ("servers", "clients"), ("clients", "servers"))
        for kind in ("ingress", "egress")
    }
    from_self = {("servers", "ingress", "servers", "tcp", 988, 1023)}
    assert lustre_rules(efa) == all_traffic | from_self


def test_the_trn_nodes_carry_the_group_the_file_system_admits(dev: Synth) -> None:
    clients = lustre_clients_id(dev)
    (template,) = [
        t["Properties"]["LaunchTemplateData"]
        for t in dev.resources("cluster", "AWS::EC2::LaunchTemplate").values()
        if "NetworkInterfaces" in t["Properties"]["LaunchTemplateData"]
    ]
    for interface in template["NetworkInterfaces"]:
        imported = [exported(dev, g) for g in interface["Groups"] if "Fn::ImportValue" in g]
        assert imported == [("network", clients)]


def test_data_repository_associations(dev: Synth) -> None:
    associations = {
        r["Properties"]["FileSystemPath"]: r["Properties"]
        for r in dev.resources("data", "AWS::FSx::DataRepositoryAssociation").values()
    }
    events = ["NEW", "CHANGED", "DELETED"]
    datasets, checkpoints = associations["/datasets"], associations["/checkpoints"]
    assert datasets["S3"] == {"AutoImportPolicy": {"Events": events}}
    assert datasets["BatchImportMetaDataOnCreate"] is True
    assert checkpoints["S3"] == {"AutoExportPolicy": {"Events": events}}
    found = buckets(dev)
    for props, name in ((datasets, "Datasets"), (checkpoints, "Checkpoints")):
        (bucket_id,) = [
            i for i, b in dev.resources("data", "AWS::S3::Bucket").items() if b is found[name]
        ]
        assert props["DataRepositoryPath"] == {"Fn::Join": ["", ["s3://", {"Ref": bucket_id}]]}


def test_wildcard_key_principals_are_pinned_to_the_fsx_role(dev: Synth) -> None:
    (key,) = dev.resources("data", "AWS::KMS::Key").values()
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    wildcard = [s for s in statements if s["Principal"] == {"AWS": "*"}]
    assert len(wildcard) == 1
    conditions = wildcard[0]["Condition"]
    assert conditions["StringEquals"]["aws:PrincipalAccount"] == "123456789012"
    assert conditions["StringEquals"]["kms:ViaService"] == "s3.us-east-2.amazonaws.com"
    principal_arn = str(conditions["ArnLike"]["aws:PrincipalArn"])
    assert "s3.data-source.lustre.fsx.amazonaws.com/" in principal_arn
    # The actions the FSx for Lustre guide gives the role for SSE-KMS buckets.
    assert sorted(wildcard[0]["Action"]) == [
        "kms:Decrypt",
        "kms:DescribeKey",
        "kms:Encrypt",
        "kms:GenerateDataKey*",
        "kms:ReEncrypt*",
    ]


def test_jobs_cannot_delete_the_checkpoint_versions_the_bucket_keeps(dev: Synth) -> None:
    """CDK's read-write grant holds s3:DeleteObject*, DeleteObjectVersion included; the older
    versions are kept for checkpoint_noncurrent_days."""
    statements = [
        statement
        for logical_id, policy in dev.resources("data", "AWS::IAM::Policy").items()
        if logical_id.startswith("DataPathsJobRole")
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    (deny,) = [s for s in statements if s["Effect"] == "Deny"]
    assert deny["Action"] == "s3:DeleteObjectVersion"
    (checkpoints_id,) = [
        i
        for i, b in dev.resources("data", "AWS::S3::Bucket").items()
        if b is buckets(dev)["Checkpoints"]
    ]
    assert deny["Resource"] == {"Fn::Join": ["", [{"Fn::GetAtt": [checkpoints_id, "Arn"]}, "/*"]]}


def test_removal_and_termination_protection_per_profile(dev: Synth, prod: Synth) -> None:
    stateful = ("AWS::S3::Bucket", "AWS::FSx::FileSystem", "AWS::KMS::Key")
    for synth, policy in ((dev, "Delete"), (prod, "Retain")):
        for resource_type in stateful:
            for resource in synth.resources("data", resource_type).values():
                assert resource["DeletionPolicy"] == policy, resource_type
                assert resource["UpdateReplacePolicy"] == policy, resource_type
    assert len(dev.resources("data", "Custom::S3AutoDeleteObjects")) == 4
    assert not prod.resources("data", "Custom::S3AutoDeleteObjects")
    assert prod.platform.data.termination_protection is True
    assert prod.platform.network.termination_protection is True
    assert dev.platform.data.termination_protection is False


def data_paths(**overrides: Any) -> TrainingDataPaths:
    stack = cdk.Stack(
        construct_app(), "S", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2)
    props: dict[str, Any] = {
        "vpc": vpc,
        "fsx_subnet": vpc.private_subnets[0],
        "lustre_clients": ec2.Peer.ipv4("10.0.0.0/16"),
        **overrides,
    }
    return TrainingDataPaths(stack, "D", **props)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"fsx_storage_gib": 1000}, r"fsx_storage_gib 1000 is not allowed; PERSISTENT_2 storage"),
        ({"fsx_storage_gib": 3600}, r"fsx_storage_gib 3600 is not allowed; .*multiple of 2400"),
        ({"fsx_throughput_per_tib": 50}, r"fsx_throughput_per_tib 50 is not allowed; .*125, 250"),
        ({"checkpoint_noncurrent_days": 0}, r"checkpoint_noncurrent_days 0 is not allowed"),
        ({"compile_cache_expiry_days": -1}, r"compile_cache_expiry_days -1 is not allowed"),
        (
            {"efa_fsx": True, "fsx_storage_gib": 2400, "fsx_throughput_per_tib": 1000},
            r"fsx_storage_gib 2400 is not allowed; an EFA-enabled .* multiple of 4800 GiB",
        ),
        (
            {"efa_fsx": True, "fsx_storage_gib": 4800, "fsx_throughput_per_tib": 1000},
            r"lustre_clients must be a security group with efa_fsx; .*no CIDR rules",
        ),
    ],
)
def test_construct_rejects_bad_props(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        data_paths(**overrides)


def test_bring_your_own_datasets_bucket() -> None:
    theirs_name = "research-datasets"
    stack = cdk.Stack(
        construct_app(), "S", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2)
    theirs = s3.Bucket.from_bucket_name(stack, "Theirs", theirs_name)
    paths = TrainingDataPaths(
        stack,
        "D",
        vpc=vpc,
        fsx_subnet=vpc.private_subnets[0],
        lustre_clients=ec2.Peer.ipv4("10.0.0.0/16"),
        datasets_bucket=theirs,
    )
    template = cdk.assertions.Template.from_stack(stack).to_json()
    buckets = [i for i, r in template["Resources"].items() if r["Type"] == "AWS::S3::Bucket"]
    assert not any(i.startswith("DDatasets") for i in buckets) and len(buckets) == 3
    (association,) = [
        r["Properties"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::FSx::DataRepositoryAssociation"
        and r["Properties"]["FileSystemPath"] == "/datasets"
    ]
    assert association["DataRepositoryPath"] == f"s3://{theirs_name}"
    assert paths.datasets is theirs
    assert theirs_name in json.dumps(template)


def test_construct_exposes_the_compile_cache_url() -> None:
    built = data_paths()
    assert built.compile_cache_url.startswith("s3://")
    assert built.compile_cache_url.endswith("/neuron-compile-cache")


KEY_ARN = "arn:aws:kms:us-east-2:123456789012:key/11111111-2222-3333-4444-555555555555"


def test_bring_your_own_encryption_key() -> None:
    """An imported key encrypts the data buckets and the file system, and the job role may use
    it; no key is made. (Its key policy is the owner's: see the prop's docstring.)"""
    stack = cdk.Stack(
        construct_app(), "S", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2)
    theirs = kms.Key.from_key_arn(stack, "Theirs", KEY_ARN)
    paths = TrainingDataPaths(
        stack,
        "D",
        vpc=vpc,
        fsx_subnet=vpc.private_subnets[0],
        lustre_clients=ec2.Peer.ipv4("10.0.0.0/16"),
        encryption_key=theirs,
    )
    resources = cdk.assertions.Template.from_stack(stack).to_json()["Resources"]
    assert paths.key is theirs
    assert not [r for r in resources.values() if r["Type"] == "AWS::KMS::Key"]
    kms_buckets = [
        r["Properties"]["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
        for r in resources.values()
        if r["Type"] == "AWS::S3::Bucket"
        and "KMSMasterKeyID" in json.dumps(r["Properties"]["BucketEncryption"])
    ]
    assert len(kms_buckets) == 3  # datasets, checkpoints, compile cache
    for encryption in kms_buckets:
        assert encryption["ServerSideEncryptionByDefault"]["KMSMasterKeyID"] == KEY_ARN
    (fs,) = [r for r in resources.values() if r["Type"] == "AWS::FSx::FileSystem"]
    assert fs["Properties"]["KmsKeyId"] == "11111111-2222-3333-4444-555555555555"
    job_policy = [
        r["Properties"]["PolicyDocument"]
        for logical_id, r in resources.items()
        if r["Type"] == "AWS::IAM::Policy" and logical_id.startswith("DJobRole")
    ]
    (document,) = job_policy
    assert any(
        s["Resource"] == KEY_ARN and "kms:Decrypt" in s["Action"] for s in document["Statement"]
    )
