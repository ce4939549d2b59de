"""Seam: where each pod may run, read from the synthesized templates.

The runtime's nodeSelector (workspace), the node groups' labels and taints (cluster, Trainium node
group), the system label of the Neuron scheduler and the Trainer manager (chart values), the
allowlists of the Neuron and EFA device plugins and the add-ons' node plugins are separate
literals. Here every pod template the platform writes (Kubernetes manifests, Helm values laid
over the pinned charts' defaults, add-on configuration) is placed on the node groups as the
scheduler would place it: every selector must match a node group, and the Neuron taint must be
tolerated by exactly the pods meant for trn nodes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import Synth
from trn_catalog import versions

INSTANCE_TYPE = "node.kubernetes.io/instance-type"
# EKS node group taint effects and their Kubernetes names.
EFFECTS = {
    "NO_SCHEDULE": "NoSchedule",
    "NO_EXECUTE": "NoExecute",
    "PREFER_NO_SCHEDULE": "PreferNoSchedule",
}
TOLERATE_ALL = {"operator": "Exists"}

# The chart defaults that decide placement where the platform's values leave them, per
# component: (where its values live, enabled by default, default nodeSelector and tolerations,
# where its required instance-type affinity comes from). Stated from the pinned charts' own
# values and templates: neuron-helm-chart (aws-neuron/neuron-helm-charts charts/neuron-helm-chart:
# the device plugin and node problem detector have an affinity on the instance-type label over
# `neuronInstances`; the scheduler extension reads `scheduler.nodeSelector`, the custom
# scheduler `scheduler.customScheduler.*` and runs only with `scheduler.enabled`),
# aws-efa-k8s-device-plugin v0.5.30 (affinity over `supportedInstanceLabels`), kubeflow-trainer
# 2.3.0 (`manager.*`).
NEURON_NO_SCHEDULE = {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Component:
    release: str
    name: str
    path: tuple[str, ...]
    enabled: bool
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, str], ...]
    allowlist: tuple[str, ...] | None = None  # values path of an instance-type affinity
    requires: tuple[str, ...] | None = None  # another component's path that must be enabled
    # A chart default node affinity on labels (key -> value), replaced by the values' own
    # single-term affinity when they set one.
    label_affinity: Mapping[str, str] | None = None


CHART_COMPONENTS = (
    Component(
        "neuron",
        "neuron device plugin",
        ("devicePlugin",),
        True,
        {},
        ({"key": "CriticalAddonsOnly", "operator": "Exists"}, NEURON_NO_SCHEDULE),
        allowlist=("neuronInstances",),
    ),
    Component("neuron", "neuron scheduler extension", ("scheduler",), False, {}, ()),
    Component(
        "neuron",
        "neuron custom scheduler",
        ("scheduler", "customScheduler"),
        True,
        {},
        (),
        requires=("scheduler",),
    ),
    Component(
        "neuron",
        "neuron node problem detector",
        ("npd",),
        True,
        {},
        tuple({"operator": "Exists", "effect": e} for e in ("NoSchedule", "NoExecute")),
        allowlist=("neuronInstances",),
    ),
    Component(
        "efa-device-plugin",
        "efa device plugin",
        (),
        True,
        {},
        (),
        allowlist=("supportedInstanceLabels", "values"),
    ),
    Component("kubeflow-trainer", "kubeflow trainer manager", ("manager",), True, {}, ()),
    # NVIDIA/k8s-device-plugin v0.20.0: tolerations CriticalAddonsOnly and nvidia.com/gpu; the
    # default affinity asks for node-feature-discovery's NVIDIA PCI label (or the
    # nvidia.com/gpu.present label), which no node here carries unless the values replace it.
    Component(
        "nvidia-device-plugin",
        "nvidia device plugin",
        (),
        True,
        {},
        (
            {"key": "CriticalAddonsOnly", "operator": "Exists"},
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ),
        label_affinity={"feature.node.kubernetes.io/pci-10de.present": "true"},
    ),
)
GPU_RELEASES = {pin.release for pin in versions.GPU_CHARTS}
# The node plugins of the CSI add-ons tolerate every taint unless configured not to
# (`node.tolerateAllTaints`, true in aws-fsx-csi-driver v1.9.0 and aws-mountpoint-s3-csi-driver
# v2.7.0).
CSI_NODE_PLUGINS = {"aws-fsx-csi-driver": True, "aws-mountpoint-s3-csi-driver": True}

# What must run on the trn nodes, and so tolerate their taint; nothing else may.
TRN_PODS = {
    "TrainingRuntime neuron-torch",
    "neuron device plugin",
    "neuron node problem detector",
    "efa device plugin",
    "aws-fsx-csi-driver node",
    "aws-mountpoint-s3-csi-driver node",
}


@dataclass(frozen=True)
class NodeGroup:
    logical_id: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...]


@dataclass(frozen=True)
class Placement:
    """Where one pod template may go: its nodeSelector, tolerations and the instance types of
    a required affinity (None: no such affinity)."""

    name: str
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    instance_types: frozenset[str] | None = None


def node_groups(synth: Synth) -> list[NodeGroup]:
    """Every managed node group with its labels, plus the instance-type label the kubelet sets
    from the instance (the group's instance type, or its launch template's)."""
    resources = synth.template("cluster")["Resources"]
    groups = []
    for logical_id, group in synth.resources("cluster", "AWS::EKS::Nodegroup").items():
        props = group["Properties"]
        if "InstanceTypes" in props:
            (instance_type,) = props["InstanceTypes"]
        else:
            template = resources[props["LaunchTemplate"]["Id"]["Ref"]]
            instance_type = template["Properties"]["LaunchTemplateData"]["InstanceType"]
        taints = tuple(
            {"key": t["Key"], "value": t.get("Value", ""), "effect": EFFECTS[t["Effect"]]}
            for t in props.get("Taints", [])
        )
        labels = {**props.get("Labels", {}), INSTANCE_TYPE: instance_type}
        groups.append(NodeGroup(logical_id, labels, taints))
    return groups


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, str]) -> bool:
    """Kubernetes' rule: an empty effect matches every effect, Exists without a key every key,
    Equal (the default operator) the key and value."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint["key"]
    return bool(
        toleration.get("key") == taint["key"] and toleration.get("value", "") == taint["value"]
    )


def tolerated(pod: Placement, group: NodeGroup) -> bool:
    """Whether ``pod`` tolerates every taint of ``group`` that keeps pods off."""
    hard = [t for t in group.taints if t["effect"] in ("NoSchedule", "NoExecute")]
    return all(any(tolerates(tol, taint) for tol in pod.tolerations) for taint in hard)


def can_run(pod: Placement, group: NodeGroup) -> bool:
    if any(group.labels.get(key) != value for key, value in pod.node_selector.items()):
        return False
    if pod.instance_types is not None and group.labels[INSTANCE_TYPE] not in pod.instance_types:
        return False
    return tolerated(pod, group)


def _detokenized(value: Any) -> str:
    """A manifest or values string; CloudFormation references inside it (only ever inside JSON
    strings) become a placeholder."""
    if isinstance(value, str):
        return value
    (parts,) = [value["Fn::Join"][1]]
    return "".join(p if isinstance(p, str) else "TOKEN" for p in parts)


def _pod_specs(node: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield node
            return
        for child in node.values():
            yield from _pod_specs(child)
    elif isinstance(node, list):
        for child in node:
            yield from _pod_specs(child)


def manifest_placements(synth: Synth) -> list[Placement]:
    """Every pod template in the Kubernetes manifests the stacks apply."""
    found = []
    for stack in ("cluster", "workloads"):
        for resource in synth.resources(stack, "Custom::AWSCDK-EKS-KubernetesResource").values():
            for obj in json.loads(_detokenized(resource["Properties"]["Manifest"])):
                for spec in _pod_specs(obj):
                    found.append(
                        Placement(
                            f"{obj['kind']} {obj['metadata']['name']}",
                            spec.get("nodeSelector", {}),
                            tuple(spec.get("tolerations", [])),
                        )
                    )
    return found


def _at(values: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        values = values.get(key) or {}
    return values


def _enabled(component: Component, values: Mapping[str, Any]) -> bool:
    return bool(values.get("enabled", component.enabled))


def chart_placements(synth: Synth) -> list[Placement]:
    """The pods of every enabled chart component, its values laid over the chart's defaults
    (Helm merges maps and replaces lists)."""
    charts = {
        c["Properties"]["Release"]: json.loads(_detokenized(c["Properties"]["Values"]))
        for c in synth.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()
    }
    assert set(charts) - GPU_RELEASES == {pin.release for pin in versions.CHARTS}
    components = {(c.release, c.path): c for c in CHART_COMPONENTS}
    found = []
    for c in CHART_COMPONENTS:
        if c.release not in charts:
            continue
        values = _at(charts[c.release], c.path)
        needed = components[(c.release, c.requires)] if c.requires else c
        if not (_enabled(c, values) and _enabled(needed, _at(charts[c.release], needed.path))):
            continue
        allowlist = frozenset(_at(charts[c.release], c.allowlist) or ()) if c.allowlist else None
        found.append(
            Placement(
                c.name,
                {
                    **c.node_selector,
                    **_label_affinity(c, values),
                    **values.get("nodeSelector", {}),
                },
                tuple(values.get("tolerations", c.tolerations)),
                allowlist,
            )
        )
    return found


def _label_affinity(component: Component, values: Mapping[str, Any]) -> Mapping[str, str]:
    """A required node affinity of one term whose expressions are `In` one value, as the
    labels it asks for: the values' own (Helm replaces the term list) or the chart's default."""
    if component.label_affinity is None:
        return {}
    required = _at(
        values, ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
    )
    if not required:
        return component.label_affinity
    (term,) = required["nodeSelectorTerms"]
    labels = {}
    for expression in term["matchExpressions"]:
        assert expression["operator"] == "In" and len(expression["values"]) == 1, expression
        labels[expression["key"]] = expression["values"][0]
    return labels


def addon_placements(synth: Synth) -> list[Placement]:
    addons = {
        a["Properties"]["AddonName"]: a["Properties"]
        for stack in ("cluster", "workloads")
        for a in synth.resources(stack, "AWS::EKS::Addon").values()
    }
    found = []
    for name, default in CSI_NODE_PLUGINS.items():
        configuration = json.loads(addons[name].get("ConfigurationValues") or "{}")
        everything = configuration.get("node", {}).get("tolerateAllTaints", default)
        found.append(Placement(f"{name} node", {}, (TOLERATE_ALL,) if everything else ()))
    return found


def placements(synth: Synth) -> list[Placement]:
    return [*manifest_placements(synth), *chart_placements(synth), *addon_placements(synth)]


@pytest.fixture(scope="module", params=["dev", "odcr"])  # trn3.48xlarge, trn1.32xlarge
def placed(
    request: pytest.FixtureRequest, synth_variant: Callable[[str], Synth]
) -> tuple[list[Placement], list[NodeGroup]]:
    synth = synth_variant(request.param)
    return placements(synth), node_groups(synth)


def test_the_platform_writes_the_pods_this_test_places(
    placed: tuple[list[Placement], list[NodeGroup]],
) -> None:
    pods, groups = placed
    names = {p.name for p in pods}
    assert names >= TRN_PODS
    assert "kubeflow trainer manager" in names
    # The trn group is tainted; the system group carries no taint.
    assert sorted(len(g.taints) for g in groups) == [0, 1]


def test_every_pod_fits_a_node_group(placed: tuple[list[Placement], list[NodeGroup]]) -> None:
    pods, groups = placed
    homeless = [p.name for p in pods if not any(can_run(p, g) for g in groups)]
    assert homeless == []


def test_the_neuron_taint_admits_exactly_the_trn_pods(
    placed: tuple[list[Placement], list[NodeGroup]],
) -> None:
    pods, groups = placed
    (trn,) = [g for g in groups if g.taints]
    assert {p.name for p in pods if can_run(p, trn)} == TRN_PODS
    # Nothing else tolerates the taint, whatever its selector says today.
    assert {p.name for p in pods if tolerated(p, trn)} == TRN_PODS


def test_system_pods_select_the_system_group(
    placed: tuple[list[Placement], list[NodeGroup]],
) -> None:
    """The Trainer manager and the Neuron scheduler extension (when enabled) name the system
    group's label: a label that no group carries would leave them pending."""
    pods, groups = placed
    (system,) = [g for g in groups if not g.taints]
    selecting = [p for p in pods if p.node_selector and p.name not in TRN_PODS]
    assert "kubeflow trainer manager" in {p.name for p in selecting}
    for pod in selecting:
        assert can_run(pod, system), pod.name


def test_the_runtime_lands_on_the_trn_group_only(
    placed: tuple[list[Placement], list[NodeGroup]],
) -> None:
    pods, groups = placed
    (runtime,) = [p for p in pods if p.name == "TrainingRuntime neuron-torch"]
    assert [g.logical_id for g in groups if can_run(runtime, g)] == [
        g.logical_id for g in groups if g.taints
    ]
    # Both the node type and the instance type must match: the system group carries neither.
    assert set(runtime.node_selector) == {"trn-platform/node-type", INSTANCE_TYPE}


# What must run on the GPU nodes, and so tolerate their taint.
GPU_PODS = {
    "TrainingRuntime cuda-torch",
    "nvidia device plugin",
    "efa device plugin",
    "aws-fsx-csi-driver node",
    "aws-mountpoint-s3-csi-driver node",
}


def _tainted(groups: list[NodeGroup], key: str) -> NodeGroup:
    (group,) = [g for g in groups if any(t["key"] == key for t in g.taints)]
    return group


@pytest.fixture(scope="module")
def placed_gpu(
    synth_variant: Callable[[str], Synth],
) -> tuple[list[Placement], list[NodeGroup]]:
    synth = synth_variant("gpu")
    return placements(synth), node_groups(synth)


def test_with_a_gpu_group_every_pod_fits_a_node_group(
    placed_gpu: tuple[list[Placement], list[NodeGroup]],
) -> None:
    pods, groups = placed_gpu
    assert {p.name for p in pods} >= TRN_PODS | GPU_PODS
    assert sorted(len(g.taints) for g in groups) == [0, 1, 1]
    assert [p.name for p in pods if not any(can_run(p, g) for g in groups)] == []


def test_each_taint_admits_exactly_its_pods(
    placed_gpu: tuple[list[Placement], list[NodeGroup]],
) -> None:
    pods, groups = placed_gpu
    gpu = _tainted(groups, "nvidia.com/gpu")
    trn = _tainted(groups, "aws.amazon.com/neuron")
    assert {p.name for p in pods if can_run(p, gpu)} == GPU_PODS
    # The Neuron node problem detector and device plugin tolerate every taint; their instance
    # allowlist (the trn catalog) keeps them off the GPU nodes.
    assert {p.name for p in pods if tolerated(p, gpu)} == GPU_PODS | {
        "neuron node problem detector",
        "neuron device plugin",
    }
    assert {p.name for p in pods if can_run(p, trn)} == TRN_PODS


def test_the_gpu_runtime_and_plugin_land_on_the_gpu_group_only(
    placed_gpu: tuple[list[Placement], list[NodeGroup]],
) -> None:
    pods, groups = placed_gpu
    gpu = _tainted(groups, "nvidia.com/gpu")
    for name in ("TrainingRuntime cuda-torch", "nvidia device plugin"):
        (pod,) = [p for p in pods if p.name == name]
        assert [g.logical_id for g in groups if can_run(pod, g)] == [gpu.logical_id], name


def test_the_nvidia_chart_default_affinity_would_strand_its_plugin() -> None:
    """Without the platform's affinity the chart asks for node-feature-discovery's label,
    which no group carries (NFD is not installed): the plugin would never start."""
    (component,) = [c for c in CHART_COMPONENTS if c.release == "nvidia-device-plugin"]
    gpu = NodeGroup(
        "Gpu",
        {"trn-platform/node-type": "gpu", INSTANCE_TYPE: "p5.48xlarge"},
        ({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},),
    )
    default = Placement(
        "nvidia device plugin", _label_affinity(component, {}), component.tolerations
    )
    assert not can_run(default, gpu)
