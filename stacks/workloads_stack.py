"""The workloads stack: what needs both the cluster and the data (namespace, volumes, outputs)."""

from __future__ import annotations

from typing import Any

from aws_cdk import Annotations, CfnOutput, Stack
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from constructs_lib import (
    GpuNodeGroup,
    NeuronCluster,
    NodeGroupSummary,
    PipelineAccess,
    TrainingDataPaths,
    TrainingImage,
    TrainingObservability,
    TrainingWorkspace,
    TrainiumNodeGroup,
)
from platform_config import PlatformConfig
from stacks._removal import removal_policy
from trn_catalog.outputs import PREVIEW_REGIONS, EnvironmentOutputs, parameter_name
from trn_catalog.workspace import GPU_RUNTIME_NAME


class WorkloadsStack(Stack):
    """Composes :class:`TrainingWorkspace` and publishes the environment's outputs for tools.

    The outputs go to CfnOutputs and to one SSM parameter (JSON, ``/trn-platform/<env>/outputs``)
    that ``trnctl`` reads to find an environment by name.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: PlatformConfig,
        cluster: NeuronCluster,
        trainium: TrainiumNodeGroup,
        gpu: GpuNodeGroup | None = None,
        data: TrainingDataPaths,
        image: TrainingImage,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.workspace = TrainingWorkspace(
            self,
            "Workspace",
            cluster=cluster.icluster,
            file_system=data.file_system,
            datasets=data.datasets,
            job_role=data.job_role,
            mountpoint_role=data.mountpoint_role,
            image_uri=image.image_uri,
            instance_type=config.trn.instance_type,
            compile_cache_url=data.compile_cache_url,
            nodes=max(config.trn.nodes, 1),
            fsx_storage_gib=config.fsx.storage_gib,
            neuron_stack=image.neuron_stack,
            gpu_instance_type=config.gpu.instance_type if config.gpu else None,
            gpu_image_uri=image.cuda_image_uri,
            gpu_nodes=max(config.gpu.nodes, 1) if config.gpu else 1,
            devices=config.devices,
            lnc=config.trn.lnc,
            environment=config.name,
            capacity=_trn_capacity(config)[0],
            capacity_reservation_id=_trn_capacity(config)[1],
            gpu_capacity=config.gpu.capacity if config.gpu else None,
            gpu_capacity_reservation_id=(
                config.gpu.capacity_reservation_id if config.gpu else None
            ),
        )
        # Charts install the device plugins and the job engine the workspace's jobs rely on.
        for chart in cluster.charts.values():
            self.workspace.manifest.node.add_dependency(chart)
        self.observability = self._observability(config, data)
        self.pipelines = PipelineAccess(
            self,
            "Pipelines",
            cluster=cluster.icluster,
            namespace=self.workspace.props.namespace,
            environment=config.name,
            role=data.pipeline_role,
            alert_topic=self.observability.topic,
            alert_key=self.observability.alert_key,
            sagemaker=config.model_registry == "sagemaker",
        )
        # The namespace comes with the workspace's manifest.
        self.pipelines.manifest.node.add_dependency(self.workspace.manifest)
        self.outputs = EnvironmentOutputs(
            environment=config.name,
            region=config.region,
            availability_zone=config.availability_zone,
            cluster_name=cluster.cluster_name,
            # A plain string at synth, not a reference: the cluster stack can replace the node
            # group (new name) without an export that this stack holds.
            trn_nodegroup=trainium.nodegroup_name,
            node_role_arn=trainium.node_role.role_arn,
            fsx_file_system_id=data.file_system.file_system_id,
            fsx_mount_name=data.file_system.mount_name,
            fsx_dns_name=data.file_system.dns_name,
            datasets_bucket=data.datasets.bucket_name,
            checkpoints_bucket=data.checkpoints.bucket_name,
            compile_cache_url=data.compile_cache_url,
            image_uri=image.image_uri,
            namespace=self.workspace.props.namespace,
            service_account=self.workspace.props.service_account,
            instance_type=config.trn.instance_type,
            trn_nodes=config.trn.nodes,
            devices=config.devices,
            lnc=0 if config.devices == "dra" else config.trn.lnc or config.trn.spec.default_lnc,
            model_registry=config.model_registry,
            **_gpu_outputs(config, gpu, image),
            **_ultraserver_outputs(config),
            alert_topic_arn=self.observability.topic.topic_arn,
            dashboard=config.name,
        )
        self.parameter = ssm.StringParameter(
            self,
            "Outputs",
            parameter_name=parameter_name(config.name),
            description=f"Outputs of the {config.name} training platform, read by trnctl",
            string_value=self.to_json_string(self.outputs.published()),
        )
        for key, value in self.outputs.published().items():
            CfnOutput(self, _output_id(key), value=str(value), description=key)

    def _observability(
        self, config: PlatformConfig, data: TrainingDataPaths
    ) -> TrainingObservability:
        """The dashboard, alarms, alert topic and budget of the environment, whose cluster the
        cluster stack names after it."""
        return TrainingObservability(
            self,
            "Observability",
            environment=config.name,
            cluster_name=config.name,
            namespace=self.workspace.props.namespace,
            file_system_id=data.file_system.file_system_id,
            node_groups=_node_groups(config),
            alert_email=config.budget_email,
            budget_usd=_budget_usd(self, config),
            log_retention_days=config.profile.log_retention_days,
            removal_policy=removal_policy(config),
            devices=config.devices,
        )


def _budget_usd(scope: Stack, config: PlatformConfig) -> int | None:
    """The environment's monthly budget, where CloudFormation offers one: a preview's comes with
    its lifecycle stack instead."""
    if config.preview is not None:
        return None
    if config.region not in PREVIEW_REGIONS:
        Annotations.of(scope).add_warning_v2(
            "trn:no-budget",
            f"{config.region}: CloudFormation has no AWS::Budgets::Budget here; "
            f"{config.name} gets no monthly budget",
        )
        return None
    return config.budget_usd or config.profile.default_budget_usd


def _gpu_outputs(
    config: PlatformConfig, gpu: GpuNodeGroup | None, image: TrainingImage
) -> dict[str, Any]:
    """What trnctl needs to target the GPU node group; nothing without one."""
    if config.gpu is None or gpu is None:
        return {}
    return {
        # A plain string at synth, as the trn group's name.
        "gpu_nodegroup": gpu.nodegroup_name,
        "gpu_instance_type": config.gpu.instance_type,
        "gpu_nodes": config.gpu.nodes,
        "gpu_image_uri": image.cuda_image_uri or "",
        "gpu_runtime": GPU_RUNTIME_NAME,
    }


def _ultraserver_outputs(config: PlatformConfig) -> dict[str, Any]:
    """The UltraServer type and ids (the blocks' reservation ids); nothing without blocks."""
    spec = config.trn.ultraserver
    if spec is None:
        return {}
    return {
        "ultraserver_type": spec.name,
        "ultraserver_ids": ",".join(config.trn.ultraserver_reservation_ids),
    }


def _node_groups(config: PlatformConfig) -> list[NodeGroupSummary]:
    trn_capacity = _trn_capacity(config)[0]
    groups = [NodeGroupSummary("trn", config.trn.instance_type, config.trn.nodes, trn_capacity)]
    if config.gpu is not None:
        gpu = config.gpu
        groups.append(NodeGroupSummary("gpu", gpu.instance_type, gpu.nodes, gpu.capacity))
    return groups


def _trn_capacity(config: PlatformConfig) -> tuple[str, str | None]:
    """How the trn nodes are paid for and their reservation, which the trainer records in its
    metrics header: an UltraServer environment's are Capacity Blocks (comma-separated ids)."""
    trn = config.trn
    if trn.ultraserver_reservation_ids:
        return "capacity-block", ",".join(trn.ultraserver_reservation_ids)
    return trn.capacity, trn.capacity_reservation_id


def _output_id(key: str) -> str:
    return "".join(part.capitalize() for part in key.split("_"))
