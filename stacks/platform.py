"""One environment of the platform: its stacks, named and tagged after the config."""

from __future__ import annotations

from dataclasses import dataclass, replace

from aws_cdk import Environment, Stack, Tags
from constructs import Construct

from platform_config import PlatformConfig
from stacks.cluster_stack import ClusterStack
from stacks.data_stack import DataStack
from stacks.image_stack import ImageStack
from stacks.lifecycle_stack import LifecycleStack
from stacks.network_stack import NetworkStack
from stacks.workloads_stack import WorkloadsStack
from trn_catalog.outputs import TAG_ENVIRONMENT, TAG_PROFILE, TAG_PROJECT


@dataclass(frozen=True)
class Platform:
    """The stacks of one environment.

    network -> data and network -> cluster (data and cluster never depend on each other, so FSx
    and EKS are created at the same time); workloads needs cluster, data and image.
    """

    network: NetworkStack
    data: DataStack
    cluster: ClusterStack
    image: ImageStack
    workloads: WorkloadsStack
    lifecycle: LifecycleStack | None = None

    @property
    def stacks(self) -> tuple[Stack, ...]:
        ordered = (self.network, self.data, self.cluster, self.image, self.workloads)
        return ordered if self.lifecycle is None else (self.lifecycle, *ordered)


def build_platform(scope: Construct, config: PlatformConfig) -> Platform:
    """Add one environment's stacks to ``scope`` (an App), named ``<config.name>-<part>``."""
    common = {
        "env": Environment(account=config.account, region=config.region),
        "termination_protection": config.profile.termination_protection,
    }
    name = config.name
    network = NetworkStack(
        scope,
        f"{name}-network",
        config=config,
        description=f"Trainium training platform {name}: VPC, endpoints, flow logs",
        **common,
    )
    data = DataStack(
        scope,
        f"{name}-data",
        config=config,
        network=network.network,
        description=f"Trainium training platform {name}: S3 data paths and FSx for Lustre",
        **common,
    )
    cluster = ClusterStack(
        scope,
        f"{name}-cluster",
        config=config,
        network=network.network,
        description=f"Trainium training platform {name}: EKS, Neuron, EFA, trn capacity"
        + (f", {config.gpu.instance_type} GPU group" if config.gpu else ""),
        **common,
    )
    image = ImageStack(
        scope,
        f"{name}-image",
        config=config,
        description=f"Trainium training platform {name}: training image repository",
        **common,
    )
    workloads = WorkloadsStack(
        scope,
        f"{name}-workloads",
        config=config,
        cluster=cluster.neuron_cluster,
        trainium=cluster.trainium,
        gpu=cluster.gpu,
        data=data.data,
        image=image.image,
        description=f"Trainium training platform {name}: training namespace, volumes, outputs",
        **common,
    )
    # The outputs name the bundled image, which the image stack's deploy publishes.
    workloads.add_stack_dependency(image)
    platform = Platform(
        network=network, data=data, cluster=cluster, image=image, workloads=workloads
    )
    if config.preview:
        lifecycle = LifecycleStack(
            scope,
            f"{name}-lifecycle",
            config=config,
            stacks=platform.stacks,
            description=f"Trainium training platform {name}: expiry, deletion and budget",
            **common,
        )
        platform = replace(platform, lifecycle=lifecycle)
    for stack in platform.stacks:
        Tags.of(stack).add(TAG_ENVIRONMENT, name)
        Tags.of(stack).add(TAG_PROFILE, config.env)
        if config.project:
            Tags.of(stack).add(TAG_PROJECT, config.project)
    return platform
