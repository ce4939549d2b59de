"""Scheduled fine-tuning pipelines in CDK code: :class:`PipelineAccess`, what their controllers
run as in a training namespace, and :class:`TrainingPipeline`, one pipeline's CronJob, the same
object ``trnctl pipeline create`` applies (both render :mod:`trn_catalog.pipelines`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from constructs import Construct

from constructs_lib._common import acknowledge, nag_reference
from constructs_lib._props import props_of
from trn_catalog import pipelines as shared
from trn_catalog import workspace as ws
from trn_catalog.outputs import parameter_name
from trn_catalog.settings import SettingError

# The ServiceAccount pipelines' CronJobs run their controller pods as.
SERVICE_ACCOUNT = shared.SERVICE_ACCOUNT
# What a controller does in the namespace: create, watch and delete its run's TrainJobs, read
# their pods and the eval pods' logs, and record events on its CronJob. Nothing else: it cannot
# create pods or CronJobs, read secrets, or act outside the namespace.
RULES: tuple[dict[str, Any], ...] = (
    {
        "apiGroups": [ws.TRAINER_API_GROUP],
        "resources": ["trainjobs"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)
# SageMaker Model Registry calls trnctl makes (trnctl/sagemaker_registry.py), on the
# environment's groups and packages only; AddTags because CreateModelPackageGroup tags the group.
SAGEMAKER_ACTIONS = (
    "sagemaker:AddTags",
    "sagemaker:CreateModelPackage",
    "sagemaker:CreateModelPackageGroup",
    "sagemaker:DescribeModelPackage",
    "sagemaker:DescribeModelPackageGroup",
    "sagemaker:UpdateModelPackage",
)


@dataclass(frozen=True)
class PipelineAccessProps:
    """What a :class:`PipelineAccess` was built with (its ``props``): the keyword arguments of
    its constructor, where each is documented with its default."""

    cluster: eks.ICluster
    namespace: str
    environment: str
    role: iam.IRole
    alert_topic: sns.ITopic
    alert_key: kms.IKey
    sagemaker: bool


class PipelineAccess(Construct):
    """The ``trn-pipelines`` ServiceAccount in ``namespace``, a Role limited to :data:`RULES`
    bound to it, and the EKS Pod Identity association that gives its pods ``role`` plus a
    policy to publish to ``alert_topic``, read the environment's outputs parameter and, with
    ``sagemaker``, keep the environment's model package groups and packages. One per training
    namespace; each :class:`TrainingPipeline` in it runs as this ServiceAccount.

    Attributes:
        props (:class:`PipelineAccessProps`), manifest (the KubernetesManifest of the
        ServiceAccount, Role and RoleBinding), association, policy.

    Raises:
        ValueError: ``environment`` is not a DNS label (the outputs parameter and the model
            package groups are named after it).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        namespace: str,
        environment: str,
        role: iam.IRole,
        alert_topic: sns.ITopic,
        alert_key: kms.IKey,
        sagemaker: bool = False,
    ) -> None:
        """The props, each with its default (a missing required one: TypeError).

        Args:
            cluster: the EKS cluster (required), with a kubectl provider (one made in this app,
                or imported with ``kubectl_provider``).
            namespace: the training namespace (required), which must exist before this
                construct's manifest is applied (make it depend on the workspace's).
            environment: the environment's name (required), e.g. ``trn-dev``: the outputs
                parameter ``/trn-platform/<environment>/outputs`` the controller reads, and the
                prefix of its SageMaker model package groups.
            role: the role the controllers' pods get through Pod Identity (required); its S3
                access comes with it (``TrainingDataPaths.pipeline_role``).
            alert_topic: the SNS topic failures and rejections go to (required).
            alert_key: the KMS key ``alert_topic`` is encrypted with (required).
            sagemaker: also allow the SageMaker Model Registry calls of a mirrored registry
                (``-c model_registry=sagemaker``), on ``<environment>-*`` groups and packages.
                Default False.
        """
        super().__init__(scope, construct_id)
        self.props = props_of(PipelineAccessProps, locals())
        try:
            shared.check_environment(environment)
        except SettingError as error:
            raise ValueError(str(error)) from None
        stack = Stack.of(self)
        self.association = eks.CfnPodIdentityAssociation(
            self,
            "PodIdentity",
            cluster_name=cluster.cluster_name,
            namespace=namespace,
            service_account=SERVICE_ACCOUNT,
            role_arn=role.role_arn,
        )
        statements = [
            iam.PolicyStatement(actions=["sns:Publish"], resources=[alert_topic.topic_arn]),
            iam.PolicyStatement(
                actions=["kms:Decrypt", "kms:GenerateDataKey"], resources=[alert_key.key_arn]
            ),
            iam.PolicyStatement(
                actions=["ssm:GetParameter"],
                resources=[
                    stack.format_arn(
                        service="ssm",
                        resource="parameter",
                        resource_name=parameter_name(environment).lstrip("/"),
                    )
                ],
            ),
        ]
        sagemaker_arns = self._sagemaker_arns(stack, environment) if sagemaker else []
        if sagemaker_arns:
            statements.append(
                iam.PolicyStatement(actions=list(SAGEMAKER_ACTIONS), resources=sagemaker_arns)
            )
        self.policy = iam.Policy(self, "Policy", roles=[role], statements=statements)
        for arn in sagemaker_arns:
            acknowledge(
                self.policy,
                f"AwsSolutions-IAM5[Resource::{nag_reference(stack.resolve(arn))}]",
                "Model package groups and packages are named per model as pipelines and trnctl "
                "register them; the environment's prefix bounds them.",
            )
        self.manifest = eks.KubernetesManifest(
            self, "Manifest", cluster=cluster, manifest=manifests(namespace), prune=True
        )

    @staticmethod
    def _sagemaker_arns(stack: Stack, environment: str) -> list[str]:
        return [
            stack.format_arn(service="sagemaker", resource=kind, resource_name=f"{environment}-*")
            for kind in ("model-package-group", "model-package")
        ]


def manifests(namespace: str) -> list[dict[str, Any]]:
    """The ServiceAccount, Role and RoleBinding of pipelines' controllers in ``namespace``."""
    meta = {"name": SERVICE_ACCOUNT, "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [dict(rule) for rule in RULES],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": SERVICE_ACCOUNT,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}
            ],
        },
    ]


@dataclass(frozen=True)
class TrainingPipelineProps:
    """What a :class:`TrainingPipeline` was built with (its ``props``): the keyword arguments of
    its constructor, where each is documented with its default."""

    access: PipelineAccess
    pipeline_name: str
    schedule: str
    model: str
    data: str
    eval_data: str
    gate: str
    image: str
    register_as: str
    time_zone: str
    nodes: int
    capacity_wait_minutes: int
    suspend: bool
    max_steps: int | None
    epochs: int | None
    seq_len: int | None
    seed: int | None
    lora_rank: int | None
    lora_alpha: float | None
    eval_every: int | None
    eval_batches: int | None
    checkpoint_every: int | None
    log_every: int | None


# How this construct names the settings the shared checks refuse: by its props.
_PROP_NAMES = {"name": "pipeline_name"}


class TrainingPipeline(Construct):
    """One scheduled fine-tuning pipeline, kept in CDK code: the CronJob that ``trnctl pipeline
    create`` would apply for the same settings (:func:`trn_catalog.pipelines.render_cronjob`),
    in ``access``'s namespace and environment, its controller running as ``access``'s
    ServiceAccount in the stack's region. Every run trains ``model`` on the newest version of
    ``data``, exports, evaluates the candidate and the model in service on ``eval_data`` and
    registers the candidate as ``models/<register_as>@vN``, promoted when ``gate`` holds, else
    rejected (docs/pipelines.md).

    Default settings: ``concurrencyPolicy: Forbid``, a 600-second starting deadline, 5 finished
    Jobs of each outcome kept, 3 retries of a failed controller pod (which resume the run, never
    train twice), the controller on the system node group as a non-root user with a read-only
    root file system. ``trnctl pipeline list``, ``show``, ``run-now`` and ``history`` work on it
    as on any pipeline; change and delete it here: a ``trnctl pipeline pause`` or ``delete``
    lasts until a deploy that changes this CronJob (CloudFormation re-applies a manifest only
    when it changes).

    Attributes:
        props (:class:`TrainingPipelineProps`), pipeline (its
        :class:`trn_catalog.pipelines.Pipeline`), cronjob (the rendered object), manifest (the
        KubernetesManifest that applies it, after ``access``'s).

    Raises:
        ValueError: at construction, for any refused prop, naming it, its value and what is
            allowed (the checks of ``trnctl pipeline create``); every prop but ``image`` must be
            a plain value at synth, not a token.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        access: PipelineAccess,
        pipeline_name: str,
        schedule: str,
        model: str,
        data: str,
        eval_data: str,
        gate: str,
        image: str,
        register_as: str = "",
        time_zone: str = shared.DEFAULT_TIME_ZONE,
        nodes: int = 1,
        capacity_wait_minutes: int = shared.DEFAULT_CAPACITY_WAIT_MINUTES,
        suspend: bool = False,
        max_steps: int | None = None,
        epochs: int | None = None,
        seq_len: int | None = None,
        seed: int | None = None,
        lora_rank: int | None = None,
        lora_alpha: float | None = None,
        eval_every: int | None = None,
        eval_batches: int | None = None,
        checkpoint_every: int | None = None,
        log_every: int | None = None,
    ) -> None:
        """The props, each with its default (a missing required one: TypeError).

        Args:
            access: the :class:`PipelineAccess` of the training namespace (required): its
                cluster, namespace and environment, and the ServiceAccount the controller runs
                as, which this CronJob is applied after.
            pipeline_name: the CronJob's name and the pipeline's (required): a DNS label of at
                most 33 characters, as its runs' TrainJobs are named after it.
            schedule: when it runs (required): five cron fields (``0 3 * * 1``: Mondays at
                03:00) or a macro such as ``@weekly``, in ``time_zone``.
            model: the base model (required), ``models/NAME`` (the version in service) or
                ``models/NAME@vN``.
            data: the training data (required), ``datasets/NAME``: each run takes its newest
                version, and a run without a new version is skipped.
            eval_data: the evaluation data (required), ``datasets/NAME`` or ``datasets/NAME@vN``.
            gate: when a candidate is promoted (required), e.g. ``eval_loss <= current - 0.01``
                (``accuracy`` or ``macro_f1`` for classification data).
            image: the platform image (required), e.g. ``TrainingImage``'s ``image_uri``: the
                controller and the run's TrainJobs run it (``trnctl pipeline create --image``).
            register_as: register candidates as ``models/<register_as>``. Default ``""``: the
                pipeline's name.
            time_zone: the IANA time zone of ``schedule``. Default ``Etc/UTC``.
            nodes: trn nodes per training run, 1 to 128. Default 1.
            capacity_wait_minutes: a run whose training finds no free trn node this long is
                skipped, 1 to 1440. Default 60.
            suspend: create it paused. Default False.
            max_steps: ``trn-train run --max-steps`` (1 or more; not with ``epochs``). Default
                None: trn-train's.
            epochs: ``--epochs`` (0 or more). Default None.
            seq_len: ``--seq-len`` (0 or more). Default None.
            seed: ``--seed``. Default None.
            lora_rank: ``--lora-rank``, LoRA instead of full fine-tuning (1 or more). Default
                None.
            lora_alpha: ``--lora-alpha`` (above 0; needs ``lora_rank``). Default None.
            eval_every: ``--eval-every`` (0 or more). Default None.
            eval_batches: ``--eval-batches`` (1 or more). Default None.
            checkpoint_every: ``--checkpoint-every`` (0 or more). Default None.
            log_every: ``--log-every`` (1 or more). Default None.
        """
        super().__init__(scope, construct_id)
        self.props = props_of(TrainingPipelineProps, locals())
        self.pipeline = _pipeline(self.props)
        if not isinstance(suspend, bool):
            raise ValueError(f"suspend {suspend!r} is not allowed; use True or False")
        namespace = access.props.namespace
        self.cronjob = shared.render_cronjob(
            self.pipeline,
            namespace=namespace,
            image=image,
            region=Stack.of(self).region,
            suspend=suspend,
        )
        self.manifest = eks.KubernetesManifest(
            self, "Manifest", cluster=access.props.cluster, manifest=[self.cronjob], prune=True
        )
        self.manifest.node.add_dependency(access.manifest)


def _pipeline(props: TrainingPipelineProps) -> shared.Pipeline:
    """The pipeline ``props`` define.

    Raises:
        ValueError: a refused prop, named as the construct takes it.
    """
    training = {key: getattr(props, key) for key in shared.TRAINING_FIELDS}
    try:
        return shared.Pipeline(
            name=props.pipeline_name,
            environment=props.access.props.environment,
            schedule=props.schedule,
            model=props.model,
            data=props.data,
            eval_data=props.eval_data,
            gate=props.gate,
            register_as=props.register_as,
            time_zone=props.time_zone,
            nodes=props.nodes,
            capacity_wait_minutes=props.capacity_wait_minutes,
            image=props.image,
            training={k: v for k, v in training.items() if v is not None},
        )
    except SettingError as error:
        raise ValueError(error.render(lambda name: _PROP_NAMES.get(name, name))) from None
