"""Every Kubernetes object the platform applies (every manifest of every synthesized variant) and
every object trnctl creates conforms, strictly, to Kubernetes 1.35 and the pinned Trainer
release; the check fails on a field that is invented or that the release removed."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kube_objects import Applied, domain_prefixed_path, manifests, patch_problems, problems

from tests.conftest import VARIANTS, Synth, sample_outputs
from trn_catalog import crds, ultraservers, versions
from trn_catalog import workspace as ws
from trnctl import jobs, validation

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def trnctl_objects(synth: Synth) -> list[Applied]:
    """The TrainJobs `trnctl job submit` (from a preset; from a staged model with LoRA; running
    a command after --; with a GPU group, both on --target gpu), `trnctl job export` and
    `trnctl validate` create in this environment."""
    workspace = synth.platform.workloads.workspace.props
    outputs = sample_outputs(
        namespace=workspace.namespace,
        service_account=workspace.service_account,
        instance_type=workspace.instance_type,
        trn_nodes=workspace.nodes,
        devices=synth.platform.workloads.outputs.devices,
        lnc=synth.platform.workloads.outputs.lnc,
        ultraserver_type=synth.platform.workloads.outputs.ultraserver_type,
        ultraserver_ids=synth.platform.workloads.outputs.ultraserver_ids,
        **gpu_outputs(workspace),
    )
    name = jobs.generated_name("train", "125m", NOW)
    train = jobs.render(
        name=name,
        outputs=outputs,
        nodes=workspace.nodes,
        args=jobs.TrainingArgs("125m", "corpus", max_steps=100, seed=1).argv(name),
        labels={jobs.PRESET_LABEL: "125m"},
    )
    model_name = jobs.generated_name("train", "llama-3.2-1b", NOW)
    fine_tune = jobs.render(
        name=model_name,
        outputs=outputs,
        nodes=workspace.nodes,
        args=jobs.TrainingArgs(
            None, "chats", max_steps=100, model="llama-3.2-1b", lora_rank=16, lora_alpha=32.0
        ).argv(model_name),
        labels={jobs.MODEL_LABEL: "llama-3.2-1b"},
    )
    export = jobs.render_export(
        job_name=model_name, export=jobs.export_name(model_name, NOW), outputs=outputs
    )
    command = jobs.CommandArgs(("torchrun", "train.py", "--device", "neuron"), "/datasets/code/x")
    run_name = jobs.generated_name("run", "torchrun", NOW)
    own_code = jobs.render_command(
        name=run_name, outputs=outputs, nodes=workspace.nodes, command=command
    )
    objects = [
        *lnc_objects(outputs, name),
        *ultraserver_objects(outputs, name),
        Applied("trnctl job submit", train),
        Applied("trnctl job submit --model --lora-rank", fine_tune),
        Applied("trnctl job submit -- COMMAND", own_code),
        Applied("trnctl job export", export),
        Applied("trnctl validate", validation.render(outputs, now=NOW)),
    ]
    if outputs.has_gpu:
        gpu_train = jobs.render(
            name=name,
            outputs=outputs,
            nodes=outputs.gpu_nodes,
            args=jobs.TrainingArgs("125m", "corpus", max_steps=100).argv(name),
            labels={jobs.PRESET_LABEL: "125m"},
            target=jobs.GPU,
        )
        cuda = jobs.CommandArgs(("torchrun", "train.py", "--device", "cuda"), "/datasets/code/x")
        gpu_code = jobs.render_command(
            name=run_name, outputs=outputs, nodes=outputs.gpu_nodes, command=cuda, target=jobs.GPU
        )
        objects += [
            Applied("trnctl job submit --target gpu", gpu_train),
            Applied("trnctl job submit --target gpu -- COMMAND", gpu_code),
        ]
    return objects


def lnc_objects(outputs: Any, name: str) -> list[Applied]:
    """Under DRA, the job `trnctl job submit --lnc 1` creates (on the neuron-torch-lnc1
    runtime)."""
    if outputs.devices != "dra":
        return []
    job = jobs.render(
        name=name,
        outputs=outputs,
        nodes=outputs.trn_nodes,
        args=jobs.TrainingArgs("125m", "corpus", max_steps=100).argv(name),
        labels={jobs.PRESET_LABEL: "125m"},
        lnc=1,
    )
    return [Applied("trnctl job submit --lnc 1", job)]


def ultraserver_objects(outputs: Any, name: str) -> list[Applied]:
    """With UltraServer blocks, the job `trnctl job submit --ultraserver` creates (its pods
    placed by the runtime patch's affinity), from a preset and with a command after --."""
    if not outputs.ultraserver_type:
        return []
    servers = ultraservers.get(outputs.ultraserver_type).servers
    job = jobs.render(
        name=name,
        outputs=outputs,
        nodes=servers,
        args=jobs.TrainingArgs("125m", "corpus", max_steps=100).argv(name),
        ultraserver=True,
    )
    command = jobs.CommandArgs(("torchrun", "train.py"), None)
    run = jobs.render_command(
        name=name, outputs=outputs, nodes=servers, command=command, ultraserver=True
    )
    return [
        Applied("trnctl job submit --ultraserver", job),
        Applied("trnctl job submit --ultraserver -- COMMAND", run),
    ]


def gpu_outputs(workspace: Any) -> dict[str, Any]:
    """The GPU fields of the environment's outputs, as the workloads stack writes them for a
    workspace with a GPU type (none without)."""
    if workspace.gpu_instance_type is None:
        return {}
    return {
        "gpu_nodegroup": "trn-dev-gpu-0a1b2c3d",
        "gpu_instance_type": workspace.gpu_instance_type,
        "gpu_nodes": workspace.gpu_nodes,
        "gpu_image_uri": "123456789012.dkr.ecr.us-east-2.amazonaws.com/trainer:1-cuda",
        "gpu_runtime": ws.GPU_RUNTIME_NAME,
    }


def applied(synth: Synth) -> list[Applied]:
    return [*manifests(synth.templates), *trnctl_objects(synth)]


def the(synth: Synth, kind: str) -> dict[str, Any]:
    """The first object of ``kind`` the platform creates, as a copy to change."""
    return copy.deepcopy(dict(next(a.obj for a in applied(synth) if a.obj["kind"] == kind)))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_object_conforms_to_the_pinned_apis(
    synth_variant: Callable[[str], Synth], variant: str
) -> None:
    objects = applied(synth_variant(variant))
    kinds = {a.obj["kind"] for a in objects}
    # The collection reaches every kind the platform creates, in every variant.
    assert {
        "Namespace",
        "ServiceAccount",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "TrainingRuntime",
        "TrainJob",
    } <= kinds
    gpu = {"trnctl job submit --target gpu", "trnctl job submit --target gpu -- COMMAND"}
    ultra = {"trnctl job submit --ultraserver", "trnctl job submit --ultraserver -- COMMAND"}
    assert {a.origin for a in objects if a.origin.startswith("trnctl")} == {
        "trnctl job submit",
        "trnctl job submit --model --lora-rank",
        "trnctl job submit -- COMMAND",
        "trnctl job export",
        "trnctl validate",
        *(gpu if "gpu_instance_type" in VARIANTS[variant] else ()),
        *(["trnctl job submit --lnc 1"] if VARIANTS[variant].get("devices") == "dra" else ()),
        *(ultra if "ultraserver_reservation_ids" in VARIANTS[variant] else ()),
    }
    if VARIANTS[variant].get("devices") == "dra":
        assert "ResourceClaimTemplate" in kinds
    failures = {a.name: problems(a.obj) for a in objects}
    assert {name: found for name, found in failures.items() if found} == {}


def _set(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node: Any = obj
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[last] = value


POD = "spec.template.spec.replicatedJobs.0.template.spec.template.spec"


@pytest.mark.parametrize(
    ("kind", "path", "value", "message"),
    [
        # Removed by Trainer 2.2.0 ("Remove numProcPerNode from Torch API").
        (
            "TrainingRuntime",
            "spec.mlPolicy.torch.numProcPerNode",
            64,
            r"spec\.mlPolicy\.torch: Additional properties .*'numProcPerNode' was unexpected",
        ),
        # Replaced by runtimePatches in 2.2.0.
        (
            "TrainJob",
            "spec.podTemplateOverrides",
            [],
            r"spec: Additional properties .*'podTemplateOverrides' was unexpected",
        ),
        ("TrainJob", "spec.labels", {}, r"spec: Additional properties .*'labels' was unexpected"),
        # An integer since 2.2.0; `auto` is what the runtime derives, not a value a job sets.
        ("TrainJob", "spec.trainer.numProcPerNode", "auto", r"'auto' is not of type 'integer'"),
        ("TrainJob", "spec.trainer.numNodes", 2**31, r"greater than the maximum"),
        ("TrainJob", "spec.trainer.gpus", 8, r"'gpus' was unexpected"),
        ("TrainJob", "metadata.name", "Train", r"metadata\.name: 'Train' does not match"),
        ("TrainingRuntime", f"{POD}.containers.0.neuronCores", 8, r"'neuronCores' was unexpected"),
        # Below the levels the Trainer schema data lists, Kubernetes' own schema catches it.
        (
            "TrainingRuntime",
            f"{POD}.containers.0.resources.neuron",
            {},
            r"replicatedJobs\.0\.template: spec\.template\.spec\.containers\.0\.resources: "
            r"Additional properties",
        ),
        ("TrainingRuntime", "metadata.uuid", "x", r"metadata: .*'uuid' was unexpected"),
        ("PersistentVolume", "spec.csi.fsxMountName", "x", r"'fsxMountName' was unexpected"),
        ("Namespace", "spec", {"finalize": []}, r"'finalize' was unexpected"),
    ],
)
def test_an_invented_or_removed_field_fails(
    dev: Synth, kind: str, path: str, value: Any, message: str
) -> None:
    obj = the(dev, kind)
    assert problems(obj) == []

    _set(obj, path, value)

    found = problems(obj)
    assert any(re.search(message, line) for line in found), found


@pytest.mark.parametrize(
    ("manager", "accepted"),
    [
        ("trnctl.trn-platform/ultraserver", True),
        ("acme.io/foo/BAR", True),
        ("10.0.0.1/foo", True),
        ("a" * 241 + ".example.com/x", True),
        ("a" * 242 + ".example.com/x", False),
        ("trnctl", False),
        ("trnctl.trn-platform/", False),
        ("/ultraserver", False),
        ("Trnctl.trn-platform/ultraserver", False),
        ("trn_ctl.trn-platform/ultraserver", False),
        ("trnctl.trn-platform/ultra server", False),
        ("trnctl.trn-platform/ultraserver?x=1", False),
    ],
)
def test_the_webhook_rule_on_a_runtime_patch_manager(manager: str, accepted: bool) -> None:
    """Trainer's TrainJob webhook rule, apimachinery's IsDomainPrefixedPath at v0.36.2: a
    lowercase DNS-1123 subdomain of at most 253 characters, "/", a non-empty HTTP path."""
    assert domain_prefixed_path(manager) is accepted


def test_a_manager_the_webhook_refuses_fails(synth_variant: Callable[[str], Synth]) -> None:
    job = the(synth_variant("ultraserver"), "TrainJob")
    assert job["spec"]["runtimePatches"] and problems(job) == []

    job["spec"]["runtimePatches"][0]["manager"] = "trnctl"

    assert problems(job) == [
        "spec.runtimePatches.0.manager: 'trnctl' is not a domain-prefixed path (such as "
        '"acme.io/foo"); the TrainJob webhook refuses it'
    ]


def patched_jobs(synth: Synth) -> list[tuple[Applied, dict[str, Any]]]:
    """Each TrainJob with runtime patches, with the TrainingRuntime the app applies that it
    names."""
    runtimes = {
        a.obj["metadata"]["name"]: dict(a.obj)
        for a in manifests(synth.templates)
        if a.obj["kind"] == "TrainingRuntime"
    }
    return [
        (a, runtimes[a.obj["spec"]["runtimeRef"]["name"]])
        for a in trnctl_objects(synth)
        if a.obj["kind"] == "TrainJob" and a.obj["spec"].get("runtimePatches")
    ]


def test_runtime_patches_name_what_their_runtime_has(
    synth_variant: Callable[[str], Synth],
) -> None:
    found = patched_jobs(synth_variant("ultraserver"))
    assert [a.origin for a, _ in found] == [
        "trnctl job submit --ultraserver",
        "trnctl job submit --ultraserver -- COMMAND",
    ]
    assert [(a.origin, patch_problems(a.obj, runtime)) for a, runtime in found] == [
        (a.origin, []) for a, _ in found
    ]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("name", "trainer", "replicated job 'trainer' is not in the runtime"),
        (
            "template.spec.template.spec.containers",
            [{"name": "sidecar"}],
            "containers 'sidecar' is not in the runtime's 'node' job",
        ),
        # A container of the runtime's job is not one of its init containers.
        (
            "template.spec.template.spec.initContainers",
            [{"name": "node"}],
            "initContainers 'node' is not in the runtime's 'node' job",
        ),
        (
            "template.spec.template.spec.containers",
            [{"name": "node", "env": [{"name": "X", "value": "1"}]}],
            "env on the 'node' container",
        ),
    ],
)
def test_a_patch_off_its_runtime_fails(
    synth_variant: Callable[[str], Synth], path: str, value: Any, message: str
) -> None:
    ((applied, runtime), *_) = patched_jobs(synth_variant("ultraserver"))
    job = copy.deepcopy(dict(applied.obj))
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    _set(patch["replicatedJobs"][0], path, value)

    assert patch_problems(job, runtime) == [f"spec.runtimePatches.0: {message}"]


def test_a_kind_the_release_does_not_have_fails() -> None:
    legacy = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "PyTorchJob",
        "metadata": {"name": "old"},
        "spec": {},
    }
    unknown = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "x"}}

    assert problems(legacy) == [
        f"PyTorchJob is not a trainer.kubeflow.org/v1alpha1 kind of Trainer {crds.release_tag()}"
    ]
    assert problems(unknown)[0].startswith("no Kubernetes 1.35.0 schema")


def stale_schema_data(pins: tuple[versions.ChartPin, ...]) -> list[str]:
    """Pins whose schema data in the catalog was read from another release."""
    (trainer,) = [p for p in pins if p.chart == versions.TRAINER_CHART.chart]
    if crds.release_tag() != f"v{trainer.version}":
        return [f"{trainer.chart} {trainer.version}: CRD schema data is of {crds.release_tag()}"]
    return []


def test_the_schema_data_is_of_the_pinned_trainer_release() -> None:
    assert stale_schema_data(versions.CHARTS) == []
    # The JobSet spec a runtime embeds is that of the JobSet release the chart installs.
    assert f"JobSet {crds.jobset_tag().removeprefix('v')}" in versions.TRAINER_CHART.source


def test_a_trainer_pin_bump_without_new_schema_data_fails() -> None:
    bumped = dataclasses.replace(versions.TRAINER_CHART, version="2.4.0")
    pins = tuple(bumped if p is versions.TRAINER_CHART else p for p in versions.CHARTS)

    assert stale_schema_data(pins) == [
        f"kubeflow-trainer 2.4.0: CRD schema data is of {crds.release_tag()}"
    ]
