import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

import aws_cdk as cdk
import jsonschema
import kubernetes_validate
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk.lambda_layer_kubectl_v35 import KubectlV35Layer

import trn_catalog
from constructs_lib import NeuronCluster, TrainingWorkspace
from tests.conftest import Synth, construct_app
from tests.template_parts import scaling
from trn_catalog import crds, ultraservers, versions
from trn_catalog import workspace as shared
from trn_catalog.outputs import EnvironmentOutputs


def cluster_resource(synth: Synth) -> dict[str, Any]:
    (cluster,) = synth.resources("cluster", "AWS::EKS::Cluster").values()
    props: dict[str, Any] = cluster["Properties"]
    return props


def test_endpoint_is_private(dev: Synth) -> None:
    vpc_config = cluster_resource(dev)["ResourcesVpcConfig"]
    assert vpc_config["EndpointPrivateAccess"] is True
    assert vpc_config["EndpointPublicAccess"] is False


def test_secrets_are_encrypted_with_a_rotating_key(dev: Synth) -> None:
    (config,) = cluster_resource(dev)["EncryptionConfig"]
    assert config["Resources"] == ["secrets"]
    key_id = config["Provider"]["KeyArn"]["Fn::GetAtt"][0]
    key = dev.template("cluster")["Resources"][key_id]
    assert key["Type"] == "AWS::KMS::Key" and key["Properties"]["EnableKeyRotation"] is True


def test_control_plane_logs(dev: Synth) -> None:
    enabled = cluster_resource(dev)["Logging"]["ClusterLogging"]["EnabledTypes"]
    assert {t["Type"] for t in enabled} == {"api", "audit", "authenticator"}


def test_version_and_no_auto_mode(dev: Synth) -> None:
    props = cluster_resource(dev)
    assert props["Version"] == versions.KUBERNETES_VERSION
    assert props["ComputeConfig"] == {"Enabled": False}
    assert props["BootstrapSelfManagedAddons"] is False
    assert props["Name"] == "trn-dev"


def test_admin_role_gets_cluster_admin(synth_variant: Callable[[str], Synth]) -> None:
    odcr = synth_variant("odcr")
    entries = odcr.resources("cluster", "AWS::EKS::AccessEntry").values()
    admin = [
        e
        for e in entries
        if e["Properties"]["PrincipalArn"] == "arn:aws:iam::123456789012:role/PlatformAdmin"
    ]
    (entry,) = admin
    (policy,) = entry["Properties"]["AccessPolicies"]
    assert "cluster-access-policy/AmazonEKSClusterAdminPolicy" in json.dumps(policy["PolicyArn"])
    assert policy["AccessScope"] == {"Type": "cluster"}


def test_system_nodegroup(dev: Synth) -> None:
    groups = [
        g["Properties"]
        for g in dev.resources("cluster", "AWS::EKS::Nodegroup").values()
        if g["Properties"]["AmiType"] == "AL2023_x86_64_STANDARD"
    ]
    (system,) = groups
    assert system["CapacityType"] == "ON_DEMAND" and len(system["Subnets"]) == 2
    assert system["ScalingConfig"]["MinSize"] == 2
    template_id = system["LaunchTemplate"]["Id"]["Ref"]
    data = dev.template("cluster")["Resources"][template_id]["Properties"]["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    assert data["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True


def test_node_roles_carry_no_cni_policy(dev: Synth) -> None:
    for role_id, role in dev.resources("cluster", "AWS::IAM::Role").items():
        if "NodeRole" in role_id:
            assert "AmazonEKS_CNI_Policy" not in json.dumps(role["Properties"]), role_id


def test_trainium_nodegroup_in_the_trn_subnet(dev: Synth) -> None:
    ((trn_id, trn),) = [
        (i, g["Properties"])
        for i, g in dev.resources("cluster", "AWS::EKS::Nodegroup").items()
        if g["Properties"]["AmiType"] == "AL2023_x86_64_NEURON"
    ]
    trn_subnet = dev.platform.network.network.trn_subnet
    assert trn_subnet.availability_zone == "us-east-2a"
    (subnet,) = trn["Subnets"]
    assert "PrivateSubnet1" in json.dumps(subnet)
    assert re.fullmatch(r"trn-dev-trn-[0-9a-f]{8}", trn["NodegroupName"])
    assert scaling(dev.template("cluster"), trn_id)["desiredSize"] == 2


def all_addons(synth: Synth) -> dict[str, dict[str, Any]]:
    return {
        a["Properties"]["AddonName"]: a["Properties"]
        for stack in ("cluster", "workloads")
        for a in synth.resources(stack, "AWS::EKS::Addon").values()
    }


def test_addons_are_pinned(dev: Synth) -> None:
    addons = all_addons(dev)
    assert set(addons) == {pin.name for pin in versions.ADDONS}
    for pin in versions.ADDONS:
        assert re.fullmatch(r"v\d+\.\d+\.\d+-eksbuild\.\d+", pin.version), pin.name
        assert addons[pin.name]["AddonVersion"] == pin.version, pin.name
        configuration = addons[pin.name].get("ConfigurationValues")
        assert (json.loads(configuration) if configuration else None) == pin.configuration
    cni = json.loads(addons["vpc-cni"]["ConfigurationValues"])
    assert cni["env"]["ENABLE_PREFIX_DELEGATION"] == "true"
    major, minor, _ = addons["vpc-cni"]["AddonVersion"].lstrip("v").split("-")[0].split(".")
    assert (int(major), int(minor)) >= (1, 19)


def test_csi_node_plugins_reach_the_neuron_tainted_nodes(dev: Synth) -> None:
    # The datasets and FSx mounts happen on trn nodes, which carry the Neuron NoSchedule taint.
    addons = all_addons(dev)
    mountpoint = json.loads(addons["aws-mountpoint-s3-csi-driver"]["ConfigurationValues"])
    assert mountpoint["node"]["tolerateAllTaints"] is True
    major = int(addons["aws-mountpoint-s3-csi-driver"]["AddonVersion"][1:].split(".")[0])
    assert major >= 2, "Pod Identity for the Mountpoint driver needs Mountpoint CSI v2"


def test_pod_identity_for_addons_that_call_aws(dev: Synth) -> None:
    associations = {
        (a["Properties"]["Namespace"], a["Properties"]["ServiceAccount"])
        for stack in ("cluster", "workloads")
        for a in dev.resources(stack, "AWS::EKS::PodIdentityAssociation").values()
    }
    assert associations == {
        ("kube-system", "aws-node"),
        ("amazon-cloudwatch", "cloudwatch-agent"),
        ("neuron-healthcheck-system", "node-problem-detector"),
        ("kube-system", "s3-csi-driver-sa"),
        ("training", "trainer"),
        ("training", "trn-pipelines"),
    }


@pytest.mark.parametrize(
    ("stack", "addon", "account"),
    [
        ("cluster", "vpc-cni", "aws-node"),
        ("cluster", "amazon-cloudwatch-observability", "cloudwatch-agent"),
        ("workloads", "aws-mountpoint-s3-csi-driver", "s3-csi-driver-sa"),
    ],
)
def test_addons_start_after_their_pod_identity(
    dev: Synth, stack: str, addon: str, account: str
) -> None:
    # Pods get Pod Identity credentials only if the association exists when they start.
    resources = dev.template(stack)["Resources"]
    (association,) = [
        logical_id
        for logical_id, r in resources.items()
        if r["Type"] == "AWS::EKS::PodIdentityAssociation"
        and r["Properties"]["ServiceAccount"] == account
    ]
    (installed,) = [
        r
        for r in resources.values()
        if r["Type"] == "AWS::EKS::Addon" and r["Properties"]["AddonName"] == addon
    ]
    assert association in installed["DependsOn"]


def test_node_recovery_policy_is_scoped(dev: Synth) -> None:
    policies = dev.resources("cluster", "AWS::IAM::Policy")
    (npd,) = [p for i, p in policies.items() if "NodeProblemDetector" in i]
    statements = npd["Properties"]["PolicyDocument"]["Statement"]
    by_action = {json.dumps(s["Action"]): s for s in statements}
    health = by_action['"autoscaling:SetInstanceHealth"']
    assert health["Condition"]["StringEquals"]["autoscaling:ResourceTag/eks:cluster-name"]
    metrics = by_action['"cloudwatch:PutMetricData"']
    assert metrics["Condition"] == {"StringEquals": {"cloudwatch:namespace": "NeuronHealthCheck"}}


def charts(synth: Synth) -> dict[str, dict[str, Any]]:
    return {
        c["Properties"]["Release"]: c["Properties"]
        for c in synth.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()
    }


def test_charts_are_pinned(dev: Synth) -> None:
    installed = charts(dev)
    for pin in versions.CHARTS:
        chart = installed[pin.release]
        assert (chart["Repository"], chart["Chart"], chart["Version"]) == (
            pin.repository,
            pin.chart,
            pin.version,
        )
        assert chart["Namespace"] == pin.namespace and chart["Atomic"] is True
        # Helm must time out (and roll back) before the kubectl handler's 900 s Lambda limit.
        assert chart["Wait"] is True and int(chart["Timeout"].removesuffix("s")) < 900
    assert installed["neuron"]["Repository"] == "oci://public.ecr.aws/neuron/neuron-helm-chart"


def test_neuron_chart_values(dev: Synth) -> None:
    values = json.loads(charts(dev)["neuron"]["Values"])
    assert values["devicePlugin"]["enabled"] is True
    assert values["npd"]["enabled"] is True and values["npd"]["nodeRecovery"]["enabled"] is True
    assert "trn3.48xlarge" in values["neuronInstances"]


@pytest.mark.parametrize("variant", ["dev", "odcr"])
def test_the_neuron_scheduler_is_off_by_default(
    synth_variant: Callable[[str], Synth], variant: str
) -> None:
    """The chart's second scheduler is kube-scheduler 1.31 (outside the supported skew of a 1.35
    control plane) and no platform pod names it: off unless `neuron_scheduler_tag` is given."""
    values = json.loads(charts(synth_variant(variant))["neuron"]["Values"])
    assert values["scheduler"] == {"enabled": False}


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, str]) -> bool:
    """Kubernetes' rule: a toleration matches a taint when its effect is empty or the same, and
    its key is empty with Exists (every key), or the same key with Exists, or with Equal and the
    same value."""
    for t in tolerations:
        if t.get("effect") not in (None, "", taint["effect"]):
            continue
        operator = t.get("operator", "Equal")
        if operator == "Exists" and t.get("key") in (None, "", taint["key"]):
            return True
        same_value = t.get("value", "") == taint.get("value", "")
        if operator == "Equal" and t.get("key") == taint["key"] and same_value:
            return True
    return False


TAINTS = [
    {"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"},
    {"key": "example.com/degraded", "value": "neuron", "effect": "NoSchedule"},
    {"key": "example.com/draining", "effect": "PreferNoSchedule"},
    {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoExecute"},
]


@pytest.mark.parametrize("variant", ["dev", "odcr"])
def test_the_node_problem_detector_tolerates_every_taint(
    synth_variant: Callable[[str], Synth], variant: str
) -> None:
    """It must keep running on the degraded nodes it reports. Setting npd.tolerations replaces the
    chart's list (NoSchedule and NoExecute of any key, in 1.9.0), so the list set must itself
    tolerate every taint."""
    tolerations = json.loads(charts(synth_variant(variant))["neuron"]["Values"])["npd"][
        "tolerations"
    ]
    assert [taint for taint in TAINTS if not tolerates(tolerations, taint)] == []
    # The rule above is the real one: the Neuron toleration alone leaves the others out.
    neuron_only = [{"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}]
    assert [t["key"] for t in TAINTS if tolerates(neuron_only, t)] == ["aws.amazon.com/neuron"]


@pytest.mark.parametrize(
    ("variant", "release", "agent"),
    [
        ("dev", "neuron", "devicePlugin"),
        ("dra", "neuron", "draDriver"),
        ("dev", "efa-device-plugin", None),
        ("dra", "aws-dranet", None),
        ("gpu", versions.NVIDIA_DEVICE_PLUGIN_CHART.release, None),
    ],
)
def test_every_device_agent_tolerates_every_taint(
    synth_variant: Callable[[str], Synth], variant: str, release: str, agent: str | None
) -> None:
    """A taint added to a node group (TrainiumNodeGroup's `taints`) must not keep the agents
    that publish its devices off it: they run only where their node affinity puts them."""
    values = json.loads(charts(synth_variant(variant))[release]["Values"])
    tolerations = (values[agent] if agent else values)["tolerations"]
    assert [taint for taint in TAINTS if not tolerates(tolerations, taint)] == []


def test_the_node_monitoring_agents_gpu_checks_reach_the_gpu_nodes(
    synth_variant: Callable[[str], Synth],
) -> None:
    """eks-node-monitoring-agent v1.6.6's DCGM DaemonSet, which its GPU health checks need on
    each NVIDIA node, has no tolerations in the chart: the add-on's configuration gives it
    every taint, the GPU group's among them."""
    addons = all_addons(synth_variant("gpu"))
    configuration = json.loads(addons["eks-node-monitoring-agent"]["ConfigurationValues"])
    tolerations = configuration["dcgmAgent"]["tolerations"]
    gpu_taint = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
    assert [t for t in [*TAINTS, gpu_taint] if not tolerates(tolerations, t)] == []
    # Nor does the chart request resources for it: the configuration does.
    assert set(configuration["dcgmAgent"]["resources"]["requests"]) == {"cpu", "memory"}


def test_efa_plugin_allowlist_has_trn3(dev: Synth) -> None:
    values = json.loads(charts(dev)["efa-device-plugin"]["Values"])
    allow = values["supportedInstanceLabels"]
    assert allow["keys"] == ["node.kubernetes.io/instance-type"]
    assert set(trn_catalog.CATALOG) <= set(allow["values"])
    assert "trn3.48xlarge" in allow["values"]


def test_the_efa_plugin_image_comes_from_the_deploy_regions_eks_registry(dev: Synth) -> None:
    """Not the chart's us-west-2 default: nodes of another region would pull across regions."""
    values = json.loads(charts(dev)["efa-device-plugin"]["Values"])
    assert values["image"] == {
        "repository": "602401143452.dkr.ecr.us-east-2.amazonaws.com/eks/aws-efa-k8s-device-plugin"
    }


def test_job_engine_is_kubeflow_trainer_without_unused_runtimes(dev: Synth) -> None:
    values = json.loads(charts(dev)["kubeflow-trainer"]["Values"])
    assert values["crds"]["enabled"] is True
    # No built-in ClusterTrainingRuntimes, so no post-install hook pulling from Docker Hub.
    assert values["runtimes"]["defaultEnabled"] is False
    assert values["runtimes"]["torchDistributed"]["enabled"] is False
    assert values["dataCache"] == {"enabled": False, "lws": {"install": False}}


def test_neuron_chart_waits_for_its_namespace_and_pod_identity(dev: Synth) -> None:
    manifests = dev.resources("cluster", "Custom::AWSCDK-EKS-KubernetesResource")
    namespaces = {
        logical_id
        for logical_id, resource in manifests.items()
        for obj in json.loads(resource["Properties"]["Manifest"])
        if (obj["kind"], obj["metadata"]["name"]) == ("Namespace", "neuron-healthcheck-system")
    }
    assert len(namespaces) == 1
    (neuron,) = [
        chart
        for chart in dev.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()
        if chart["Properties"]["Release"] == "neuron"
    ]
    assert namespaces <= set(neuron["DependsOn"])
    (npd_identity,) = [
        logical_id
        for logical_id, r in dev.resources("cluster", "AWS::EKS::PodIdentityAssociation").items()
        if r["Properties"]["ServiceAccount"] == "node-problem-detector"
    ]
    assert npd_identity in neuron["DependsOn"]


def test_no_stray_neuron_manifest(dev: Synth) -> None:
    for name, template in dev.templates.items():
        text = json.dumps(template)
        assert "neuron-device-plugin" not in text, name
        assert "k8s-neuron" not in text, name


def test_cluster_and_data_never_depend_on_each_other(dev: Synth) -> None:
    artifacts = dev.manifest()["artifacts"]
    deps = {name: set(a.get("dependencies", [])) for name, a in artifacts.items()}
    assert "trn-dev-data" not in deps["trn-dev-cluster"]
    assert "trn-dev-cluster" not in deps["trn-dev-data"]
    assert {"trn-dev-cluster", "trn-dev-data", "trn-dev-image"} <= deps["trn-dev-workloads"]
    cluster_text = json.dumps(dev.template("cluster"))
    data_text = json.dumps(dev.template("data"))
    assert "trn-dev-data:" not in cluster_text and "trn-dev-cluster:" not in data_text


def test_capacity_modes_reach_the_cluster(synth_variant: Callable[[str], Synth]) -> None:
    block = synth_variant("capacity-block")
    (trn,) = [
        g["Properties"]
        for g in block.resources("cluster", "AWS::EKS::Nodegroup").values()
        if g["Properties"]["AmiType"] == "AL2023_x86_64_NEURON"
    ]
    assert trn["CapacityType"] == "CAPACITY_BLOCK"
    assert not block.resources("cluster", "AWS::EC2::PlacementGroup")
    odcr = synth_variant("odcr")
    (template,) = [
        t["Properties"]["LaunchTemplateData"]
        for t in odcr.resources("cluster", "AWS::EC2::LaunchTemplate").values()
        if "InstanceType" in t["Properties"]["LaunchTemplateData"]
    ]
    assert template["InstanceType"] == "trn1.32xlarge"
    assert len(template["NetworkInterfaces"]) == 8
    assert template["CapacityReservationSpecification"]["CapacityReservationPreference"] == (
        "capacity-reservations-only"
    )


def test_workspace_manifests_are_valid_kubernetes(dev: Synth) -> None:
    manifests = dev.platform.workloads.workspace.manifests()
    kinds = [m["kind"] for m in manifests]
    assert kinds == [
        "Namespace",
        "ServiceAccount",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "TrainingRuntime",
    ]
    for manifest in manifests:
        if manifest["kind"] in crds.KINDS:
            jsonschema.validate(manifest, crds.schema(manifest["kind"]))
        else:
            kubernetes_validate.validate(manifest, "1.35.0", strict=True)


def runtime_pod(synth: Synth) -> dict[str, Any]:
    runtime = synth.platform.workloads.workspace.training_runtime()
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    pod: dict[str, Any] = job["template"]["spec"]["template"]["spec"]
    return pod


def test_runtime_pod_is_a_valid_pod(dev: Synth) -> None:
    """Valid for Kubernetes 1.35, strictly: the same check refuses it with a field misspelled."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": runtime_pod(dev)}
    kubernetes_validate.validate(pod, "1.35.0", strict=True)
    pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalaton"] = False
    with pytest.raises(kubernetes_validate.ValidationError, match="allowPrivilegeEscalaton"):
        kubernetes_validate.validate(pod, "1.35.0", strict=True)


@pytest.mark.parametrize(("variant", "lnc"), [("dev", "2"), ("odcr", None)])
def test_runtime_states_the_lnc_even_at_the_default(
    synth_variant: Callable[[str], Synth], variant: str, lnc: str | None
) -> None:
    """trn3 (dev) runs at its default LNC 2, said in the pod so the compiler and the launcher
    follow the workspace; trn1 (odcr) has no LNC setting."""
    (container,) = runtime_pod(synth_variant(variant))["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env.get("NEURON_LOGICAL_NC_CONFIG") == lnc


@pytest.mark.parametrize(("variant", "chips", "efa"), [("dev", 16, 16), ("odcr", 16, 8)])
def test_runtime_asks_for_every_device_and_efa_of_the_node(
    synth_variant: Callable[[str], Synth], variant: str, chips: int, efa: int
) -> None:
    synth = synth_variant(variant)
    pod = runtime_pod(synth)
    (container,) = pod["containers"]
    limits = container["resources"]["limits"]
    assert limits["aws.amazon.com/neuron"] == chips
    assert limits["vpc.amazonaws.com/efa"] == efa
    assert limits["hugepages-2Mi"] == "5120Mi"
    assert container["resources"]["requests"] == limits
    assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["serviceAccountName"] == "trainer"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/fsx", "/datasets", "/dev/shm"} <= mounts
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["NEURON_COMPILE_CACHE_URL"].endswith("/neuron-compile-cache")
    # TorchNeuron's NEFF cache takes a path, not s3://: it shares compiled graphs on FSx.
    assert env["TORCH_NEURONX_NEFF_CACHE_DIR"].startswith(shared.FSX_MOUNT + "/")
    runtime = synth.platform.workloads.workspace.training_runtime()
    # trnctl finds the runtime and its container by these shared names.
    assert runtime["metadata"]["name"] == shared.RUNTIME_NAME
    assert container["name"] == shared.TRAINER_CONTAINER
    # Trainer 2.2.0 removed the runtime's numProcPerNode: ranks come from each TrainJob.
    assert runtime["spec"]["mlPolicy"]["torch"] == {}


def test_torchrun_gets_the_grace_period_less_a_margin(dev: Synth) -> None:
    pod = runtime_pod(dev)
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= 300  # room for a checkpoint of the largest preset
    assert 0 < int(env["TRN_SHUTDOWN_TIMEOUT_S"]) <= grace - 30


@pytest.mark.parametrize("stack", ["native", "xla"])
def test_the_entrypoint_reads_the_runtime_environment(dev: Synth, stack: str) -> None:
    """The runtime's variables are the ones the image's entrypoint acts on, for both stacks."""
    from trainer import launch

    pod = runtime_pod(dev)
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e} | {
        "NEURON_STACK": stack
    }
    job = launch.job_environment(env, compiler="2.27.5334.0", kernel_release="6.1")
    if stack == "native":
        assert job["TORCH_NEURONX_NEFF_CACHE_DIR"].startswith(
            f"{shared.FSX_MOUNT}/neuron-cache/neff/neuronx-cc-2.27.5334.0/"
        )
    else:
        assert job["NEURON_COMPILE_CACHE_URL"] != env["NEURON_COMPILE_CACHE_URL"]  # keyed
        assert job["NEURON_COMPILE_CACHE_URL"].startswith(env["NEURON_COMPILE_CACHE_URL"])
    argv = launch.torchrun_argv(job, [], shutdown_flag=True)
    timeout = pod["terminationGracePeriodSeconds"] - 30
    assert f"--shutdown-timeout={timeout}" in argv
    assert launch.stack_problem(job) is None  # trn3 runs either stack


def test_platform_builds_the_stack_each_generation_runs(
    synth_variant: Callable[[str], Synth],
) -> None:
    for variant, stack in (("dev", "native"), ("odcr", "xla")):  # trn3, trn1
        synth = synth_variant(variant)
        assets = json.loads(
            (synth.outdir / f"{synth.platform.image.stack_name}.assets.json").read_text()
        )
        (image,) = assets["dockerImages"].values()
        assert image["source"]["dockerBuildArgs"] == {"NEURON_STACK": stack}
        assert synth.platform.workloads.workspace.props.neuron_stack == stack


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"neuron_stack": "native", "instance_type": "trn1.32xlarge"},
            r"neuron_stack: instance type trn1\.32xlarge is Trainium1, which the native stack "
            r"does not support; use the xla stack",
        ),
        (
            {"neuron_stack": "tpu"},
            r"neuron_stack: neuron stack 'tpu' is unknown; use native or xla",
        ),
    ],
)
def test_workspace_refuses_a_stack_that_cannot_run(
    dev: Synth, overrides: dict[str, Any], message: str
) -> None:
    props = {**vars(dev.platform.workloads.workspace.props), **overrides}
    with pytest.raises(ValueError, match=message):
        TrainingWorkspace(cdk.Stack(construct_app(), "W"), "W", **props)


@pytest.mark.parametrize(
    "overrides",
    [
        {"neuron_stack": "xla", "instance_type": "trn1.32xlarge"},
        {"neuron_stack": "native", "instance_type": "trn2.48xlarge"},
        {"neuron_stack": None, "instance_type": "trn1.32xlarge"},  # not stated: not checked
    ],
)
def test_workspace_accepts_a_stack_that_runs(dev: Synth, overrides: dict[str, Any]) -> None:
    """Accepted, the workspace's runtime runs on the type it was given, with all its chips."""
    props = {**vars(dev.platform.workloads.workspace.props), **overrides}
    workspace = TrainingWorkspace(cdk.Stack(construct_app(), "W"), "W", **props)
    (container,) = workspace.pod_spec()["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRN_INSTANCE_TYPE"] == overrides["instance_type"]
    chips = trn_catalog.get(overrides["instance_type"]).chips
    assert container["resources"]["limits"]["aws.amazon.com/neuron"] == chips


def test_job_engine_schema_refuses_bad_jobs() -> None:
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "llama"},
        "spec": {"runtimeRef": {"name": "neuron-torch"}, "trainer": {"numNodes": 2}},
    }
    jsonschema.validate(job, crds.schema("TrainJob"))
    for bad in (
        {"runtimeRef": {"name": "neuron-torch"}, "trainer": {"numNodes": "2"}},
        {"runtimeRef": {"name": "neuron-torch"}, "trainer": {"numProcPerNode": "auto"}},
        {"runtimeRef": {}},
        {"runtimeRef": {"name": "x"}, "trainer": {"gpus": 8}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**job, "spec": bad}, crds.schema("TrainJob"))


def grace_patch(manager: str, seconds: int) -> dict[str, Any]:
    pod = {"spec": {"template": {"spec": {"terminationGracePeriodSeconds": seconds}}}}
    replicated = {"name": "node", "template": pod}
    return {
        "manager": manager,
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [replicated]}}},
    }


def test_job_engine_schema_keeps_the_patch_bounds_of_trainer_2_3_0() -> None:
    """A patch's manager is 1 to 253 characters, a grace period at least 0 and a patched
    container names itself (the TrainJob CRD of Trainer v2.3.0)."""
    job: dict[str, Any] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "llama"},
        "spec": {"runtimeRef": {"name": "neuron-torch"}, "runtimePatches": [grace_patch("m", 0)]},
    }
    jsonschema.validate(job, crds.schema("TrainJob"))
    nameless = grace_patch("m", 0)
    pod = nameless["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    pod["spec"]["template"]["spec"]["containers"] = [{"image": "x"}]
    for bad in (grace_patch("", 0), grace_patch("m", -1), nameless):
        job["spec"]["runtimePatches"] = [bad]
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(job, crds.schema("TrainJob"))


def test_workspace_volumes(dev: Synth) -> None:
    manifests = {
        (m["kind"], m["metadata"]["name"]): m for m in dev.platform.workloads.workspace.manifests()
    }
    fsx = manifests["PersistentVolume", "training-fsx"]["spec"]
    assert fsx["csi"]["driver"] == "fsx.csi.aws.com"
    assert fsx["persistentVolumeReclaimPolicy"] == "Retain"
    assert fsx["capacity"]["storage"] == "1200Gi"
    s3 = manifests["PersistentVolume", "training-datasets-s3"]["spec"]
    assert s3["csi"]["driver"] == "s3.csi.aws.com"
    assert "read-only" in s3["mountOptions"]
    spec = trn_catalog.get(dev.platform.workloads.workspace.props.instance_type)
    per_card = spec.efa_gbps // spec.network_cards
    assert f"maximum-throughput-gbps {per_card}" in s3["mountOptions"] and per_card >= 100
    assert manifests["PersistentVolumeClaim", "fsx"]["spec"]["volumeName"] == "training-fsx"


def test_outputs_parameter_holds_every_output(dev: Synth) -> None:
    (parameter,) = dev.resources("workloads", "AWS::SSM::Parameter").values()
    assert parameter["Properties"]["Name"] == "/trn-platform/trn-dev/outputs"
    value = json.dumps(parameter["Properties"]["Value"])
    # The UltraServer keys are written only with UltraServer blocks (test_ultraserver_nodegroups).
    ultraserver_keys = {"ultraserver_type", "ultraserver_ids"}
    for field in EnvironmentOutputs.__dataclass_fields__:
        assert (f'\\"{field}\\"' in value) is (field not in ultraserver_keys), field
    outputs = dev.template("workloads")["Outputs"]
    assert {"ClusterName", "FsxFileSystemId", "ImageUri", "CompileCacheUrl"} <= set(outputs)


def test_image_repository(dev: Synth) -> None:
    (repository,) = dev.resources("image", "AWS::ECR::Repository").values()
    props = repository["Properties"]
    assert props["ImageScanningConfiguration"] == {"ScanOnPush": True}
    assert props["ImageTagMutability"] == "IMMUTABLE_WITH_EXCLUSION"
    assert props["EncryptionConfiguration"]["EncryptionType"] == "KMS"
    assets = json.loads((dev.outdir / "trn-dev-image.assets.json").read_text())
    (image,) = assets["dockerImages"].values()
    assert image["source"]["dockerFile"] == "training_image/Dockerfile"
    assert image["source"]["platform"] == "linux/amd64"


def test_jobs_run_the_image_copied_into_the_repository(dev: Synth) -> None:
    assets = json.loads((dev.outdir / "trn-dev-image.assets.json").read_text())
    (asset_hash,) = assets["dockerImages"]
    (copy,) = dev.resources("image", "Custom::CDKECRDeployment").values()
    (repository,) = dev.resources("image", "AWS::ECR::Repository")
    source = json.dumps(copy["Properties"]["SrcImage"])
    dest = json.dumps(copy["Properties"]["DestImage"])
    assert "container-assets" in source and asset_hash in source
    assert repository in dest and f":bundled-{asset_hash}" in dest
    assert "container-assets" not in dest
    # The copy waits for its grants, which allow no ECR action beyond the two repositories.
    (policy_id, policy) = next(iter(dev.resources("image", "AWS::IAM::Policy").items()))
    assert policy_id in copy["DependsOn"]
    for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
        if statement["Resource"] == "*":
            assert statement["Action"] == "ecr:GetAuthorizationToken"
    # What the jobs run: the repository's image, by content hash.
    assert dev.platform.workloads.workspace.props.image_uri == dev.platform.image.image.image_uri
    workloads = json.dumps(dev.template("workloads"))
    assert f":bundled-{asset_hash}" in workloads and "container-assets" not in workloads


def neuron_cluster(**overrides: Any) -> NeuronCluster:
    stack = cdk.Stack(
        construct_app(), "C", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=1)
    props: dict[str, Any] = {
        "vpc": vpc,
        "kubectl_layer": KubectlV35Layer(stack, "Layer"),
        **overrides,
    }
    return NeuronCluster(stack, "N", **props)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"public_endpoint_cidrs": ["0.0.0.0/0"]}, r"'0\.0\.0\.0/0' opens the API to the internet"),
        ({"public_endpoint_cidrs": ["office"]}, r"public_endpoint_cidrs: 'office' is not an IPv4"),
        (
            {"admin_role_arn": "arn:aws:iam::123456789012:user/alice"},
            r"admin_role_arn .* is not an IAM role ARN",
        ),
        ({"system_nodes": 1}, r"system_nodes 1 is not allowed; use 2 to 10"),
        (
            {"system_name_prefix": "-system"},
            r"system_name_prefix '-system' is not allowed; use 1 to 54 letters, digits, '-' or "
            r"'_', starting with a letter or digit",
        ),
        (
            {"neuron_scheduler_tag": "v1.31.12-eks-1-31-30"},
            r"neuron_scheduler_tag 'v1\.31\.12-eks-1-31-30' is not a kube-scheduler of "
            r"Kubernetes 1\.35, the control plane's version; use a v1\.35\.x tag of "
            r"public\.ecr\.aws/eks-distro/kubernetes/kube-scheduler",
        ),
    ],
)
def test_cluster_rejects_bad_props(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        neuron_cluster(**overrides)


def system_group_name(cluster: NeuronCluster) -> Any:
    (group,) = [
        r["Properties"]
        for r in cdk.assertions.Template.from_stack(cdk.Stack.of(cluster))
        .to_json()["Resources"]
        .values()
        if r["Type"] == "AWS::EKS::Nodegroup"
    ]
    return group.get("NodegroupName")


def test_a_tag_added_later_makes_a_new_system_node_group() -> None:
    """A new stack tag (the platform's project tag, added to a deployed environment) reaches
    the system nodes' launch template: CloudFormation would refuse to update that version
    together with the group's tags, so the group takes a new name and is replaced. Without
    ``system_name_prefix`` CloudFormation names the group."""
    first = system_group_name(neuron_cluster(system_name_prefix="trn-dev-system"))
    assert re.fullmatch(r"trn-dev-system-[0-9a-f]{8}", first)
    assert system_group_name(neuron_cluster(system_name_prefix="trn-dev-system")) == first
    tagged = neuron_cluster(system_name_prefix="trn-dev-system")
    cdk.Tags.of(cdk.Stack.of(tagged)).add("trn-platform:project", "nlp")
    assert system_group_name(tagged) not in (first, None)
    bigger = neuron_cluster(system_name_prefix="trn-dev-system", system_instance_type="m7i.2xlarge")
    assert system_group_name(bigger) != first
    assert system_group_name(neuron_cluster()) is None


THEIR_NODE_ROLE = "arn:aws:iam::123456789012:role/their-trn-nodes"


@pytest.fixture(scope="module")
def custom_cluster() -> dict[str, Any]:
    """The template of a NeuronCluster built with the props the platform leaves at default,
    and an UltraServer block whose nodes take a role of the caller's."""
    built = neuron_cluster(
        public_endpoint_cidrs=["203.0.113.0/24"], neuron_scheduler_tag="v1.35.2-eks-1-35-7"
    )
    theirs = iam.Role.from_role_arn(built, "TheirNodes", THEIR_NODE_ROLE)
    built.add_ultraserver_nodegroups(
        "u-trn2x64",
        ["cr-0123456789abcdef2", "cr-0123456789abcdef3"],
        subnet=built.cluster.vpc.private_subnets[0],
        node_role=theirs,
    )
    template: dict[str, Any] = cdk.assertions.Template.from_stack(cdk.Stack.of(built)).to_json()
    return template


def test_ultraserver_groups_given_a_node_role_make_none(custom_cluster: dict[str, Any]) -> None:
    """Both blocks' groups take the caller's role; no role of the stack's is a node role."""
    resources = custom_cluster["Resources"]
    groups = [
        r["Properties"]
        for r in resources.values()
        if r["Type"] == "AWS::EKS::Nodegroup"
        and ultraservers.ULTRASERVER_ID_LABEL in r["Properties"].get("Labels", {})
    ]
    assert [g["NodeRole"] for g in groups] == [THEIR_NODE_ROLE] * 2
    node_roles = [
        name
        for name, r in resources.items()
        if r["Type"] == "AWS::IAM::Role"
        and "ec2.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
    ]
    (system,) = node_roles
    assert "SystemNodeRole" in system


def test_neuron_scheduler_at_the_control_plane_version_when_asked(
    custom_cluster: dict[str, Any],
) -> None:
    (neuron,) = [
        r["Properties"]
        for r in custom_cluster["Resources"].values()
        if r["Type"] == "Custom::AWSCDK-EKS-HelmChart" and r["Properties"]["Release"] == "neuron"
    ]
    scheduler = json.loads(neuron["Values"])["scheduler"]
    assert scheduler["enabled"] is True and scheduler["customScheduler"]["enabled"] is True
    assert scheduler["customScheduler"]["image"] == {
        "repository": "public.ecr.aws/eks-distro/kubernetes/kube-scheduler",
        "tag": "v1.35.2-eks-1-35-7",
    }
    assert scheduler["customScheduler"]["nodeSelector"] == {"trn-platform/node-type": "system"}


def test_public_endpoint_only_from_listed_cidrs(custom_cluster: dict[str, Any]) -> None:
    (cluster,) = [
        r for r in custom_cluster["Resources"].values() if r["Type"] == "AWS::EKS::Cluster"
    ]
    vpc_config = cluster["Properties"]["ResourcesVpcConfig"]
    assert vpc_config["EndpointPublicAccess"] is True
    assert vpc_config["PublicAccessCidrs"] == ["203.0.113.0/24"]


def test_trn_nodes_carry_the_lustre_clients_group(dev: Synth) -> None:
    (template,) = [
        t
        for t in dev.resources("cluster", "AWS::EC2::LaunchTemplate").values()
        if "NetworkInterfaces" in t["Properties"]["LaunchTemplateData"]
    ]
    for interface in template["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]:
        groups = [json.dumps(group) for group in interface["Groups"]]
        assert len(groups) == 3 and sum("LustreClients" in g for g in groups) == 1


def test_bring_your_own_secrets_key() -> None:
    """An imported key encrypts Secrets; the cluster makes no key of its own."""
    arn = "arn:aws:kms:us-east-2:123456789012:key/11111111-2222-3333-4444-555555555555"
    stack = cdk.Stack(
        construct_app(), "C", env=cdk.Environment(account="123456789012", region="us-east-2")
    )
    theirs = kms.Key.from_key_arn(stack, "Theirs", arn)
    built = NeuronCluster(
        stack,
        "N",
        vpc=ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=1),
        kubectl_layer=KubectlV35Layer(stack, "Layer"),
        secrets_key=theirs,
    )
    template = cdk.assertions.Template.from_stack(stack).to_json()["Resources"]
    (cluster,) = [r for r in template.values() if r["Type"] == "AWS::EKS::Cluster"]
    (config,) = cluster["Properties"]["EncryptionConfig"]
    assert config == {"Provider": {"KeyArn": arn}, "Resources": ["secrets"]}
    assert built.secrets_key is theirs
    assert not [r for r in template.values() if r["Type"] == "AWS::KMS::Key"]


GPU_NO_SCHEDULE = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_efa_plugin_admits_every_gpu_type(dev: Synth) -> None:
    """The GPU group's EFA interfaces need the EFA device plugin on its nodes: the platform's
    allowlist replaces the chart's (Helm replaces lists), so it must name the GPU types too."""
    values = json.loads(charts(dev)["efa-device-plugin"]["Values"])
    assert set(trn_catalog.GPU_CATALOG) <= set(values["supportedInstanceLabels"]["values"])


def test_nvidia_device_plugin_only_with_a_gpu_group(
    dev: Synth, synth_variant: Callable[[str], Synth]
) -> None:
    pin = versions.NVIDIA_DEVICE_PLUGIN_CHART
    assert pin.release not in charts(dev)
    chart = charts(synth_variant("gpu"))[pin.release]
    assert (chart["Repository"], chart["Chart"], chart["Version"]) == (
        "https://nvidia.github.io/k8s-device-plugin",
        "nvidia-device-plugin",
        "0.20.0",
    )
    assert chart["Atomic"] is True and chart["Wait"] is True
    values = json.loads(chart["Values"])
    assert values["nodeSelector"] == {"trn-platform/node-type": "gpu"}
    (term,) = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term == {
        "matchExpressions": [{"key": "trn-platform/node-type", "operator": "In", "values": ["gpu"]}]
    }


def test_gpu_group_is_wired_into_the_cluster_and_the_outputs(
    dev: Synth, synth_variant: Callable[[str], Synth]
) -> None:
    assert dev.platform.cluster.gpu is None
    assert not dev.platform.workloads.outputs.has_gpu
    gpu = synth_variant("gpu")
    groups = gpu.resources("cluster", "AWS::EKS::Nodegroup").items()
    by_ami = {g["Properties"]["AmiType"]: g["Properties"] for _, g in groups}
    assert set(by_ami) == {"AL2023_x86_64_STANDARD", "AL2023_x86_64_NEURON", "AL2023_x86_64_NVIDIA"}
    nvidia = by_ami["AL2023_x86_64_NVIDIA"]
    (nvidia_id,) = [i for i, g in groups if g["Properties"] is nvidia]
    assert scaling(gpu.template("cluster"), nvidia_id)["desiredSize"] == 2
    assert nvidia["NodegroupName"].startswith("trn-dev-gpu-")
    # The same single-AZ subnet as the trn group (a Capacity Block is in that AZ too).
    assert nvidia["Subnets"] == by_ami["AL2023_x86_64_NEURON"]["Subnets"]
    outputs = gpu.platform.workloads.outputs
    assert (outputs.gpu_instance_type, outputs.gpu_nodes, outputs.gpu_runtime) == (
        "p5.48xlarge",
        2,
        shared.GPU_RUNTIME_NAME,
    )
    workloads = gpu.platform.workloads
    assert workloads.resolve(outputs.gpu_nodegroup) == nvidia["NodegroupName"] and outputs.has_gpu
    # The SSM parameter trnctl reads carries them.
    (parameter,) = gpu.resources("workloads", "AWS::SSM::Parameter").values()
    text = "".join(p for p in parameter["Properties"]["Value"]["Fn::Join"][1] if isinstance(p, str))
    assert '"gpu_instance_type":"p5.48xlarge"' in text and '"gpu_runtime":"cuda-torch"' in text


def test_outputs_written_before_the_gpu_group_still_parse() -> None:
    old = {
        f.name: "x" for f in dataclasses.fields(EnvironmentOutputs) if not f.name.startswith("gpu")
    }
    old["trn_nodes"] = 2
    outputs = EnvironmentOutputs.from_json(json.dumps(old))
    assert (outputs.gpu_instance_type, outputs.gpu_nodes, outputs.has_gpu) == ("", 0, False)


def gpu_pod(synth: Synth) -> dict[str, Any]:
    runtime = synth.platform.workloads.workspace.gpu_training_runtime()
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    pod: dict[str, Any] = job["template"]["spec"]["template"]["spec"]
    return pod


def test_gpu_runtime_pod_is_a_valid_pod_with_the_trn_pods_storage(
    dev: Synth, synth_variant: Callable[[str], Synth]
) -> None:
    gpu = synth_variant("gpu")
    pod = gpu_pod(gpu)
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod},
        "1.35.0",
        strict=True,
    )
    trn = runtime_pod(gpu)
    assert pod["volumes"] == trn["volumes"]
    assert pod["containers"][0]["volumeMounts"] == trn["containers"][0]["volumeMounts"]
    assert pod["tolerations"] == [GPU_NO_SCHEDULE]
    assert pod["serviceAccountName"] == trn["serviceAccountName"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert (limits["nvidia.com/gpu"], limits["vpc.amazonaws.com/efa"]) == (8, 32)
    assert "aws.amazon.com/neuron" not in limits
    assert pod["containers"][0]["image"] == gpu.platform.image.image.cuda_image_uri
    with pytest.raises(ValueError, match="gpu_instance_type is not set"):
        dev.platform.workloads.workspace.gpu_training_runtime()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gpu_instance_type": "p4d.24xlarge"}, r"gpu_instance_type: .*'p4d\.24xlarge'"),
        ({"gpu_instance_type": "p5.48xlarge"}, r"gpu_image_uri is missing"),
        (
            {"gpu_instance_type": "p5.48xlarge", "gpu_image_uri": "i:1", "gpu_nodes": 0},
            r"gpu_nodes 0 is not allowed; use 1 or more",
        ),
    ],
)
def test_workspace_refuses_bad_gpu_props(
    dev: Synth, overrides: dict[str, Any], message: str
) -> None:
    props = {**vars(dev.platform.workloads.workspace.props), **overrides}
    with pytest.raises(ValueError, match=message):
        TrainingWorkspace(cdk.Stack(construct_app(), "W"), "W", **props)
