"""TrainingImage: an ECR repository for training images and the bundled trainer image asset."""

from __future__ import annotations

from dataclasses import dataclass

import cdk_ecr_deployment as ecr_deployment
from aws_cdk import ArnFormat, RemovalPolicy, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from constructs_lib._common import acknowledge_wildcards
from trn_catalog import neuron_stacks

COPY_MEMORY_MIB = 3008
# The bundled image's tags, ``bundled-<content hash>``: the one pattern left out of the
# repository's tag immutability. CloudFormation re-runs the deploy-time copy with the same image
# (a rollback, a construct upgrade, a changed property), and ECR refuses any push to an existing
# immutable tag (cdklabs/cdk-ecr-deployment#207). Only the copy writes these tags, each always
# with the same image: its source is the CDK assets repository's tag of the same hash, which the
# bootstrap template (CDK CLI 2.1148.1, bootstrap version 33) makes IMMUTABLE.
BUNDLED_TAG_PREFIX = "bundled-"


@dataclass(frozen=True)
class TrainingImageProps:
    """Props of :class:`TrainingImage`.

    Attributes:
        directory: the Docker build context (required), e.g. the repository root.
        dockerfile: the Dockerfile, relative to ``directory``. Default
            ``training_image/Dockerfile``.
        neuron_stack: the Dockerfile's NEURON_STACK build argument, ``native`` (TorchNeuron,
            default) or ``xla`` (the last PyTorch/XLA stack).
        keep_images: untagged images kept in the repository. Default 20.
        removal_policy: for the repository and its key. Default DESTROY.
    """

    directory: str
    dockerfile: str = "training_image/Dockerfile"
    neuron_stack: str = "native"
    keep_images: int = 20
    removal_policy: RemovalPolicy = RemovalPolicy.DESTROY


class TrainingImage(Construct):
    """Where training images live: an ECR repository and the bundled trainer, built at deploy.

    Default settings: the repository scans on push, refuses tag overwrites except on the
    bundled image's own ``bundled-<content hash>`` tags (IMMUTABLE_WITH_EXCLUSION), is encrypted
    with a rotating KMS key and expires untagged images beyond ``keep_images``. The bundled image
    is a DockerImageAsset (linux/amd64) built by ``cdk deploy``; synth needs no Docker.
    ``cdk deploy`` publishes it to the CDK assets repository, and a deploy-time copy (cdklabs'
    cdk-ecr-deployment, with a role limited to the two repositories) puts it into this
    repository as ``bundled-<content hash>``: ``image_uri`` is that copy. The copy may run again
    with the same image (CloudFormation re-runs it on a rollback or a changed property), which
    an immutable tag would refuse; every other tag, any image pushed for jobs, stays immutable.

    Attributes:
        repository, asset, copy, image_tag, image_uri, neuron_stack.

    Raises:
        ValueError: ``neuron_stack`` not native or xla, or ``keep_images`` below 1.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: TrainingImageProps) -> None:
        super().__init__(scope, construct_id)
        if props.neuron_stack not in neuron_stacks.NEURON_STACKS:
            raise ValueError(
                f"neuron_stack {props.neuron_stack!r} is not allowed; use native or xla"
            )
        self.neuron_stack = props.neuron_stack
        if props.keep_images < 1:
            raise ValueError(f"keep_images {props.keep_images} is not allowed; use >= 1")
        key = kms.Key(
            self,
            "RepositoryKey",
            description="Encrypts training images",
            enable_key_rotation=True,
            removal_policy=props.removal_policy,
        )
        self.repository = ecr.Repository(
            self,
            "Repository",
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE_WITH_EXCLUSION,
            image_tag_mutability_exclusion_filters=[
                ecr.ImageTagMutabilityExclusionFilter.wildcard(f"{BUNDLED_TAG_PREFIX}*")
            ],
            encryption=ecr.RepositoryEncryption.KMS,
            encryption_key=key,
            removal_policy=props.removal_policy,
            empty_on_delete=props.removal_policy == RemovalPolicy.DESTROY,
            lifecycle_rules=[
                ecr.LifecycleRule(
                    description="Keep the newest untagged images only",
                    tag_status=ecr.TagStatus.UNTAGGED,
                    max_image_count=props.keep_images,
                )
            ],
        )
        self.asset = ecr_assets.DockerImageAsset(
            self,
            "Trainer",
            directory=props.directory,
            file=props.dockerfile,
            build_args={"NEURON_STACK": props.neuron_stack},
            platform=ecr_assets.Platform.LINUX_AMD64,
        )
        # cdk deploy publishes the asset to the CDK bootstrap repository, which neither scans
        # nor uses this key; the copy puts the image here, tagged with its content hash.
        self.image_tag = f"{BUNDLED_TAG_PREFIX}{self.asset.asset_hash}"
        self.image_uri = f"{self.repository.repository_uri}:{self.image_tag}"
        self.copy = self._copy_into_repository()

    def _copy_into_repository(self) -> ecr_deployment.ECRDeployment:
        role = iam.Role(
            self,
            "CopyRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="Copies the bundled trainer image into the training repository",
        )
        self.asset.repository.grant_pull(role)
        self.repository.grant_pull_push(role)
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[
                    Stack.of(self).format_arn(
                        service="logs",
                        resource="log-group",
                        resource_name=f"/aws/lambda/{Stack.of(self).stack_name}-*",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                ],
            )
        )
        acknowledge_wildcards(
            role,
            "ecr:GetAuthorizationToken takes no resource ARN; the copy function's name is "
            "generated by CloudFormation, so its log group is matched by this stack's prefix.",
        )
        copy = ecr_deployment.ECRDeployment(
            self,
            "Copy",
            src=ecr_deployment.DockerImageName(self.asset.image_uri),
            dest=ecr_deployment.DockerImageName(self.image_uri),
            # The construct's own policy is ecr:* and s3:GetObject on every resource; the
            # grants above are all the copy needs.
            role=role.without_policy_updates(),
            # Neuron images run to tens of GB; memory also buys the function network bandwidth.
            memory_limit=COPY_MEMORY_MIB,
        )
        # The grants live in the role's policy, which the function does not otherwise wait for.
        copy.node.add_dependency(role)
        return copy
