"""The contract between the deployed platform and its tools: stack tags and one SSM parameter
of outputs per environment.

The workloads stack writes :class:`EnvironmentOutputs` as JSON to :func:`parameter_name`; the
ops CLI reads it to find an environment by name (``trn-dev``, ``trn-prod``, ``trn-pv-<proj>``).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

PARAMETER_PREFIX = "/trn-platform"

# Stack tags: every stack carries the environment and profile; preview stacks also carry the
# project and their expiry (ISO-8601 UTC with Z), which `trnctl preview` reads and reaps by.
TAG_ENVIRONMENT = "trn-platform:environment"
TAG_PROFILE = "trn-platform:profile"
TAG_PREVIEW = "trn-platform:preview"
# The project an environment's resources are for (context key project), a cost allocation tag like
# the environment's. Set it at an environment's first deploy: the trn and GPU instances take it
# through their launch templates, and a new tag there makes EKS replace every node.
TAG_PROJECT = "trn-platform:project"
TAG_EXPIRES_AT = "trn-platform:expires-at"
# Tags that stay on the stacks alone: a value that changes at every synth (the expiry moves with
# each redeploy) must not reach a resource whose update disrupts it. In a launch template's tag
# specifications it makes a new template version, and EKS then replaces every node of the node
# group. CloudFormation still copies stack tags to the resources that take tags, in place.
STACK_ONLY_TAGS = (TAG_EXPIRES_AT,)
# A preview's expiry lies at most two weeks ahead (ttl_hours at synth; `trnctl preview extend`
# moves it to at most two weeks from the moment it runs).
MAX_PREVIEW_TTL_HOURS = 24 * 14
# Where a preview can deploy, and where any environment gets a budget: CloudFormation's
# AWS::Budgets::Budget, which the regional resource schemas (as cfn-lint 1.58 ships them) offer
# in these regions only.
PREVIEW_REGIONS = frozenset(
    {
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-south-1",
        "ap-southeast-1",
        "ap-southeast-2",
        "ca-central-1",
        "cn-north-1",
        "cn-northwest-1",
        "eu-central-1",
        "eu-isoe-west-1",
        "eu-west-1",
        "eu-west-2",
        "eu-west-3",
        "eusc-de-east-1",
        "sa-east-1",
        "us-east-1",
        "us-east-2",
        "us-iso-east-1",
        "us-iso-west-1",
        "us-isob-east-1",
        "us-isob-west-1",
        "us-isof-east-1",
        "us-isof-south-1",
        "us-west-1",
        "us-west-2",
    }
)


# Where an environment's model registry lives (context key model_registry): the manifests in the
# datasets bucket alone, or mirrored into SageMaker Model Registry as well (trnctl
# sagemaker_registry).
MODEL_REGISTRIES = ("s3", "sagemaker")


def parameter_name(environment: str) -> str:
    """The SSM parameter of an environment's outputs: ``/trn-platform/<environment>/outputs``."""
    return f"{PARAMETER_PREFIX}/{environment}/outputs"


@dataclass(frozen=True)
class EnvironmentOutputs:
    """What tools need to use one deployed environment."""

    environment: str
    region: str
    cluster_name: str
    # The Trainium managed node group; its name changes when CloudFormation replaces it.
    trn_nodegroup: str
    node_role_arn: str
    fsx_file_system_id: str
    fsx_mount_name: str
    fsx_dns_name: str
    datasets_bucket: str
    checkpoints_bucket: str
    compile_cache_url: str
    image_uri: str
    namespace: str
    service_account: str
    instance_type: str
    trn_nodes: int
    # The GPU node group for side-by-side runs (context key gpu_instance_type); empty strings and
    # 0 without one. Outputs written before the GPU group existed lack these keys.
    gpu_nodegroup: str = ""
    gpu_instance_type: str = ""
    gpu_nodes: int = 0
    gpu_image_uri: str = ""
    gpu_runtime: str = ""
    # How the trn nodes get their devices ("plugin" or "dra", trn_catalog.devices) and, on the
    # plugin path, the nodes' logical NeuronCore setting (0: per job, under DRA). Outputs
    # written before these keys existed were device-plugin environments at the type's default
    # LNC: 0 there means "the type's default".
    devices: str = "plugin"
    lnc: int = 0
    # UltraServer Capacity Blocks: the type (trn_catalog.ultraservers) and the blocks'
    # reservation ids, comma-separated, which are the UltraServers' ids on the nodes' label.
    # Empty without UltraServer blocks; such environments do not write these keys.
    ultraserver_type: str = ""
    ultraserver_ids: str = ""
    # The zone of the trn capacity, which cannot move once deployed (docs/deploying.md); empty
    # in outputs written before this key existed.
    availability_zone: str = ""
    # The environment's alert topic (alarms and budget) and dashboard; empty in outputs written
    # before they existed.
    alert_topic_arn: str = ""
    dashboard: str = ""
    # The model registry (MODEL_REGISTRIES): "s3" in outputs written before this key existed.
    model_registry: str = "s3"

    @property
    def ultraserver_id_list(self) -> list[str]:
        """The UltraServers' ids (empty without UltraServer blocks)."""
        return [i for i in self.ultraserver_ids.split(",") if i]

    def published(self) -> dict[str, Any]:
        """The keys the environment writes: all but the UltraServer keys of an environment
        without UltraServer blocks (its outputs stay as before they existed)."""
        data = asdict(self)
        if not self.ultraserver_type:
            del data["ultraserver_type"], data["ultraserver_ids"]
        return data

    @property
    def has_gpu(self) -> bool:
        """Whether the environment has a GPU node group to target."""
        return bool(self.gpu_instance_type)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> EnvironmentOutputs:
        """Parse the parameter's value.

        Keys with a default (the GPU group's) may be missing: environments deployed before
        they existed did not write them.

        Raises:
            ValueError: not a JSON object, or required keys missing (the message names them).
        """
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"environment outputs are not JSON: {error}") from None
        if not isinstance(data, dict):
            raise ValueError("environment outputs must be a JSON object")
        names = [f.name for f in fields(cls)]
        required = [f.name for f in fields(cls) if f.default is MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"environment outputs lack keys: {', '.join(missing)}")
        return cls(**{name: data[name] for name in names if name in data})
