"""The pods that train: every TrainingRuntime the platform writes, and the pods of every TrainJob
trnctl creates on them (submit, -- COMMAND, export, validate), run with the tightest security
context Neuron and EFA allow and ask for CPU and memory a node of each catalog type can give."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import aws_cdk as cdk
import pytest
from kube_objects import manifests
from test_conformance_objects import trnctl_objects

import trn_catalog
from constructs_lib import TrainingWorkspace
from constructs_lib.workspace import training_pod_resources
from tests.conftest import ROOT, VARIANTS, Synth, construct_app
from trn_catalog import allocatable
from trn_catalog import workspace as ws

RUNTIME_DEFAULT = {"seccompProfile": {"type": "RuntimeDefault"}}
# EFA pins its buffers (constructs_lib.workspace.TRAINING_CAPABILITIES says why and where from).
CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
}
DEVICES = ("aws.amazon.com/neuron", ws.GPU_RESOURCE)


def runtime_pods(synth: Synth) -> Iterator[tuple[str, dict[str, Any]]]:
    """(runtime name, pod spec of its node job) of every TrainingRuntime of ``synth``."""
    for applied in manifests(synth.templates):
        if applied.obj["kind"] == "TrainingRuntime":
            (job,) = applied.obj["spec"]["template"]["spec"]["replicatedJobs"]
            yield applied.obj["metadata"]["name"], job["template"]["spec"]["template"]["spec"]


def _keys(node: Any) -> Iterator[str]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield str(key)
            yield from _keys(value)
    elif isinstance(node, list):
        for item in node:
            yield from _keys(item)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_training_pod_runs_without_privileges_but_ipc_lock(
    synth_variant: Callable[[str], Synth], variant: str
) -> None:
    synth = synth_variant(variant)
    pods = dict(runtime_pods(synth))
    assert ws.RUNTIME_NAME in pods
    for name, pod in pods.items():
        (container,) = pod["containers"]
        assert pod["securityContext"] == RUNTIME_DEFAULT, name
        assert container["securityContext"] == CONTAINER, name
        assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod), name
        # The devices still reach the container: extended resources, or the node's claim (DRA).
        limits = container["resources"]["limits"]
        assert any(limits.get(d) for d in DEVICES) or container["resources"]["claims"], name
    # Every job trnctl creates runs one of these pods, and overrides none of their context.
    for applied in trnctl_objects(synth):
        assert applied.obj["spec"]["runtimeRef"]["name"] in pods, applied.origin
        assert "securityContext" not in set(_keys(applied.obj["spec"])), applied.origin


def test_a_context_with_a_misspelled_field_is_refused_by_the_strict_check(dev: Synth) -> None:
    """The conformance check (kubernetes-validate, strict) reads the context, not only its
    presence: a field Kubernetes 1.35 does not have fails it."""
    from kube_objects import problems

    runtime = next(a.obj for a in manifests(dev.templates) if a.obj["kind"] == "TrainingRuntime")
    assert problems(runtime) == []
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    pod = job["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["securityContext"]["capabilites"] = {"add": ["SYS_ADMIN"]}
    (problem,) = problems(runtime)
    assert "capabilites" in problem


def _cpu_millis(value: str) -> int:
    return int(value.removesuffix("m")) if value.endswith("m") else int(value) * 1000


def _mib(value: str) -> int:
    assert value.endswith("Gi"), value
    return int(value.removesuffix("Gi")) * 1024


TYPES = sorted(trn_catalog.CATALOG) + sorted(trn_catalog.GPU_CATALOG)


def _spec(name: str) -> trn_catalog.InstanceSpec | trn_catalog.GpuInstanceSpec:
    return trn_catalog.CATALOG.get(name) or trn_catalog.get_gpu(name)


@pytest.mark.parametrize("instance_type", TYPES)
def test_the_training_pod_fits_a_node_of_every_catalog_type(instance_type: str) -> None:
    """Its CPU and memory requests, plus the node's agents' share, within the node's
    allocatable (:mod:`trn_catalog.allocatable`); the requests are its limits."""
    spec = _spec(instance_type)
    resources = training_pod_resources(spec)
    node = allocatable.node_allocatable(spec)

    cpu, memory = _cpu_millis(resources["cpu"]), _mib(resources["memory"])
    assert cpu + allocatable.AGENTS_MILLICPU <= node.millicpu
    assert memory + allocatable.AGENTS_MIB <= node.memory_mib
    assert resources["hugepages-2Mi"] == "5120Mi"
    assert allocatable.EFA_HUGEPAGES * allocatable.HUGEPAGE_MIB >= 5120


# Worked by hand from nodeadm's figures (trn_catalog/allocatable.py): CPU less 6% of a core, 1%,
# 0.5% twice and 0.25% of each further core; memory 92.5% of EC2's, less 5128 x 2 MiB of huge
# pages, 11 MiB x max pods + 255 MiB and the 100 MiB eviction threshold.
@pytest.mark.parametrize(
    ("instance_type", "millicpu", "memory_mib"),
    [
        # 192 cores: 60 + 10 + 10 + 188 x 2.5 = 550m. 2048 GiB x 0.925 = 1,939,865 MiB; 250 pods.
        ("trn2.48xlarge", 192_000 - 550, 1_939_865 - 10_256 - 3_005 - 100),
        # 128 cores: 80 + 124 x 2.5 = 390m. 512 GiB x 0.925 = 484,966 MiB; 250 pods (nodeadm: 247).
        ("trn1.32xlarge", 128_000 - 390, 484_966 - 10_256 - 3_005 - 100),
        # 12 cores: 80 + 8 x 2.5 = 100m. 128 GiB x 0.925 = 121,241 MiB; 110 pods: 1,465 MiB.
        ("trn2.3xlarge", 12_000 - 100, 121_241 - 10_256 - 1_465 - 100),
        # nodeadm's default for g6e.48xlarge, 10 ENIs x 49 + 2 = 492 pods, is above EKS's 250.
        ("g6e.48xlarge", 192_000 - 550, 1_454_899 - 10_256 - 5_667 - 100),
    ],
)
def test_allocatable_is_what_nodeadm_leaves(
    instance_type: str, millicpu: int, memory_mib: int
) -> None:
    assert allocatable.node_allocatable(_spec(instance_type)) == allocatable.Allocatable(
        millicpu, memory_mib
    )


def test_a_type_whose_training_pod_would_stay_pending_is_refused(dev: Synth) -> None:
    """A node of 16 GiB gives pods less than the three quarters the training pod asks for."""
    small = dataclasses.replace(trn_catalog.get("trn2.3xlarge"), memory_gib=16)
    with pytest.raises(
        ValueError,
        match=r"instance type trn2\.3xlarge: the training pod's requests \(6 CPUs, 12Gi\) exceed "
        r"what a node leaves it \(9900m CPU, -\d+Mi\): it would never be scheduled",
    ):
        training_pod_resources(small)
    props = {**vars(dev.platform.workloads.workspace.props), "instance_type": "trn2.3xlarge"}
    workspace = TrainingWorkspace(cdk.Stack(construct_app(), "W"), "W", **props)
    (container,) = workspace.pod_spec()["containers"]
    assert (
        container["resources"]["requests"]["cpu"],
        container["resources"]["requests"]["memory"],
    ) == ("6", "96Gi")


def test_the_documented_sizes_are_the_catalogs() -> None:
    """docs/training-pods.md's table: each type's allocatable CPU and memory and the pod's ask."""
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in (ROOT / "docs" / "training-pods.md").read_text().splitlines()
        if line.startswith("| trn")
    ]
    assert {t for row in rows for t in row[0].split(", ")} == set(trn_catalog.CATALOG)
    for names, cpu, memory, ask in rows:
        for name in names.split(", "):
            spec = trn_catalog.get(name)
            node = allocatable.node_allocatable(spec)
            resources = training_pod_resources(spec)
            assert cpu == f"{node.millicpu / 1000:g}", name
            assert memory == f"{node.memory_mib // 1024:,} GiB", name
            gib = int(resources["memory"].removesuffix("Gi"))
            assert ask == f"{resources['cpu']} CPUs, {gib:,} GiB", name
