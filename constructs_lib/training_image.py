"""TrainingImage: an ECR repository for training images and the bundled trainer image asset."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from aws_cdk import ArnFormat, RemovalPolicy, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from constructs_lib._common import acknowledge_wildcards
from constructs_lib._props import props_of
from trn_catalog import neuron_stacks

if TYPE_CHECKING:
    import cdk_ecr_deployment as ecr_deployment

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
    """What a :class:`TrainingImage` was built with (its ``props``): the keyword arguments of
    its constructor, where each is documented with its default."""

    directory: str
    dockerfile: str
    neuron_stack: str
    cuda_dockerfile: str | None
    keep_images: int
    removal_policy: RemovalPolicy


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

    With ``cuda_dockerfile`` a second asset, the CUDA trainer, is built and copied the same
    way into the same repository (``cuda_asset``, ``cuda_copy``, ``cuda_image_uri``).

    Attributes:
        repository, asset, copy, image_tag, image_uri, neuron_stack, cuda_asset, cuda_copy,
        cuda_image_uri (the cuda ones None without ``cuda_dockerfile``).

    Raises:
        ValueError: ``neuron_stack`` not native or xla, or ``keep_images`` below 1.
        ImportError: cdk-ecr-deployment is not installed (the ``image`` extra).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        directory: str,
        dockerfile: str = "training_image/Dockerfile",
        neuron_stack: str = "native",
        cuda_dockerfile: str | None = None,
        keep_images: int = 20,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        """The props, each with its default (a missing required one: TypeError).

        Args:
            directory: the Docker build context (required), e.g. the repository root.
            dockerfile: the Dockerfile, relative to ``directory``. Default
                ``training_image/Dockerfile``.
            neuron_stack: the Dockerfile's NEURON_STACK build argument, ``native`` (TorchNeuron,
                default) or ``xla`` (the last PyTorch/XLA stack).
            keep_images: untagged images kept in the repository. Default 20.
            removal_policy: for the repository and its key; DESTROY also empties the repository on
                deletion. Default RETAIN, as aws-cdk-lib keeps stateful resources.
            cuda_dockerfile: a second Dockerfile, relative to ``directory``, for the CUDA variant of
                the trainer (the GPU node group's image), e.g. ``training_image/Dockerfile.cuda``.
                Default None: no CUDA image.
        """
        super().__init__(scope, construct_id)
        props = props_of(TrainingImageProps, locals())
        if props.neuron_stack not in neuron_stacks.NEURON_STACKS:
            raise ValueError(
                f"neuron_stack {props.neuron_stack!r} is not allowed; use native or xla"
            )
        self.neuron_stack = props.neuron_stack
        if props.keep_images < 1:
            raise ValueError(f"keep_images {props.keep_images} is not allowed; use >= 1")
        self._deployment = ecr_deployment_module()
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
        self._role = self._copy_role(self.asset)
        self.copy = self._copy_into_repository("Copy", self.asset, self.image_uri)
        self.cuda_asset: ecr_assets.DockerImageAsset | None = None
        self.cuda_copy: ecr_deployment.ECRDeployment | None = None
        self.cuda_image_uri: str | None = None
        if props.cuda_dockerfile is not None:
            self._add_cuda(props)
        # After the last grant to the copy role.
        acknowledge_wildcards(
            self._role,
            "ecr:GetAuthorizationToken takes no resource ARN; the copy function's name is "
            "generated by CloudFormation, so its log group is matched by this stack's prefix.",
        )

    def _add_cuda(self, props: TrainingImageProps) -> None:
        # No build arguments: the CUDA image has one stack.
        asset = ecr_assets.DockerImageAsset(
            self,
            "CudaTrainer",
            directory=props.directory,
            file=props.cuda_dockerfile,
            platform=ecr_assets.Platform.LINUX_AMD64,
        )
        asset.repository.grant_pull(self._role)
        self.cuda_asset = asset
        self.cuda_image_uri = (
            f"{self.repository.repository_uri}:{BUNDLED_TAG_PREFIX}{asset.asset_hash}"
        )
        self.cuda_copy = self._copy_into_repository("CudaCopy", asset, self.cuda_image_uri)

    def _copy_role(self, asset: ecr_assets.DockerImageAsset) -> iam.Role:
        role = iam.Role(
            self,
            "CopyRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="Copies the bundled trainer image into the training repository",
        )
        asset.repository.grant_pull(role)
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
        return role

    def _copy_into_repository(
        self, construct_id: str, asset: ecr_assets.DockerImageAsset, image_uri: str
    ) -> ecr_deployment.ECRDeployment:
        role = self._role
        deployment = self._deployment
        copy: ecr_deployment.ECRDeployment = deployment.ECRDeployment(
            self,
            construct_id,
            src=deployment.DockerImageName(asset.image_uri),
            dest=deployment.DockerImageName(image_uri),
            # The construct's own policy (4.2.76) grants 14 ECR actions and s3:GetObject on
            # every resource; the grants above, on the two repositories, are all the copy needs.
            role=role.without_policy_updates(),
            # Neuron images run to tens of GB; memory also buys the function network bandwidth.
            memory_limit=COPY_MEMORY_MIB,
        )
        # The grants live in the role's policy, which the function does not otherwise wait for.
        copy.node.add_dependency(role)
        return copy


def ecr_deployment_module() -> ModuleType:
    """cdklabs' cdk-ecr-deployment, imported only when a TrainingImage copies an image: the rest
    of the library runs without it (it is the ``image`` extra of the distribution).

    Raises:
        ImportError: the package is not installed; the message names the extra.
    """
    try:
        return importlib.import_module("cdk_ecr_deployment")
    except ImportError as error:
        raise ImportError(
            "TrainingImage needs the cdk-ecr-deployment package: pip install 'trn-platform[image]'"
        ) from error
