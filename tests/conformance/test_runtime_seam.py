"""The seam between the TrainingRuntime the workspace synthesizes and `trnctl job submit`: the
drift check runs on the runtime as the template applies it, and the trainer job carries the
names the pinned Trainer release's torch runtime requires, which trnctl and the launcher use."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from kube_objects import manifests, problems

import trn_catalog
from tests.conftest import VARIANTS, Synth, sample_outputs
from trn_catalog import crds
from trn_catalog import workspace as ws
from trnctl import jobs

# An environment's outputs; only the namespace, images and types matter to a rendered job.
OUTPUTS_FOR_SEAM = sample_outputs(image_uri="example.com/trainer:1", instance_type="trn3.48xlarge")


def synthesized_runtime(synth: Synth, name: str = ws.RUNTIME_NAME) -> dict[str, Any]:
    """A TrainingRuntime as the workloads template applies it (tokens as placeholders)."""
    (runtime,) = [
        a.obj
        for a in manifests(synth.templates)
        if a.obj["kind"] == "TrainingRuntime" and a.obj["metadata"]["name"] == name
    ]
    return copy.deepcopy(dict(runtime))


def node_instance_type(synth: Synth, catalog: Any = trn_catalog.CATALOG) -> str:
    """The instance type of the synthesized node groups (Trainium, or with ``catalog`` the GPU
    catalog, GPU) from their launch templates (one group, or one per UltraServer block)."""
    (instance_type,) = {
        t["Properties"]["LaunchTemplateData"]["InstanceType"]
        for t in synth.resources("cluster", "AWS::EC2::LaunchTemplate").values()
        if t["Properties"]["LaunchTemplateData"].get("InstanceType") in catalog
    }
    return str(instance_type)


def trainer_job(runtime: dict[str, Any]) -> dict[str, Any]:
    """The replicated job the release's torch runtime treats as the trainer (by its label)."""
    required = crds.trainer_job()
    (job,) = [
        r
        for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]
        if (r["template"].get("metadata") or {}).get("labels", {}).get(required.ancestor_label)
        == required.ancestor
    ]
    return job


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_job_submit_finds_no_drift_in_the_synthesized_runtime(
    synth_variant: Callable[[str], Synth], variant: str
) -> None:
    synth = synth_variant(variant)
    spec = trn_catalog.get(node_instance_type(synth))

    assert jobs.runtime_drift(synthesized_runtime(synth), spec) == []


def _drop_torch(runtime: dict[str, Any]) -> None:
    del runtime["spec"]["mlPolicy"]["torch"]


def _drop_ancestor(runtime: dict[str, Any]) -> None:
    trainer_job(runtime)["template"]["metadata"]["labels"].clear()


def _fewer_efa(runtime: dict[str, Any]) -> None:
    pod = trainer_job(runtime)["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] = 8


def _rename_job(runtime: dict[str, Any]) -> None:
    trainer_job(runtime)["name"] = "trainer"


@pytest.mark.parametrize(
    ("change", "found"),
    [
        (_drop_torch, ["no mlPolicy.torch (Kubeflow would not hand torchrun its rendezvous)"]),
        (
            _drop_ancestor,
            [
                "its 'node' job lacks the label trainer.kubeflow.org/trainjob-ancestor-step=trainer"
                " (a TrainJob's image, nodes and ranks would not reach it)"
            ],
        ),
        (_fewer_efa, ["vpc.amazonaws.com/efa 8 (catalog: 16)"]),
        (_rename_job, ["it has no 'node' replicated job with a 'node' container"]),
    ],
)
def test_the_drift_check_names_a_changed_synthesized_runtime(
    dev: Synth, change: Callable[[dict[str, Any]], None], found: list[str]
) -> None:
    runtime = synthesized_runtime(dev)
    change(runtime)

    assert jobs.runtime_drift(runtime, trn_catalog.get(node_instance_type(dev))) == found


def test_the_drift_check_names_a_runtime_of_another_instance_type(
    synth_variant: Callable[[str], Synth],
) -> None:
    trn1 = synth_variant("odcr")  # trn1.32xlarge: 16 chips, 8 EFA interfaces

    assert jobs.runtime_drift(synthesized_runtime(trn1), trn_catalog.get("trn3.48xlarge")) == [
        "TRN_INSTANCE_TYPE trn1.32xlarge (catalog: trn3.48xlarge)",
        "vpc.amazonaws.com/efa 8 (catalog: 16)",
    ]


def test_the_trainer_job_has_the_names_the_trainer_release_requires(dev: Synth) -> None:
    """Trainer v2.3.0 (pkg/constants Node, AncestorTrainer) fills in the `node` container of the
    job labelled as the trainer and names rank 0's host <trainjob>-node-0-0.<trainjob>: the
    replicated job must be `node`, which trnctl's pod selector and name limit assume too."""
    required = crds.trainer_job()
    job = trainer_job(synthesized_runtime(dev))
    containers = job["template"]["spec"]["template"]["spec"]["containers"]

    assert job["name"] == required.replicated_job
    assert [c["name"] for c in containers] == [required.container]
    # What trnctl and the launcher's environment rely on.
    assert ws.TRAINER_CONTAINER == required.replicated_job == required.container
    assert required.ancestor_label == ws.TRAINER_ANCESTOR_LABEL
    assert required.ancestor == ws.TRAINER_ANCESTOR
    assert f"{jobs.REPLICATED_JOB_LABEL}={required.replicated_job}" in jobs.node_selector("j")
    assert len(f"{'a' * jobs.MAX_NAME}-{required.replicated_job}-0-999") == 63


def test_the_gpu_runtime_runs_on_the_gpu_group_with_the_trainer_jobs_names(
    synth_variant: Callable[[str], Synth],
) -> None:
    """cuda-torch: the names the Trainer release requires, and every GPU and EFA device of the
    synthesized GPU group's type (the GPU catalog's figures, not the trn group's)."""
    synth = synth_variant("gpu")
    gpu_type = node_instance_type(synth, trn_catalog.GPU_CATALOG)
    spec = trn_catalog.get_gpu(gpu_type)
    runtime = synthesized_runtime(synth, ws.GPU_RUNTIME_NAME)
    required = crds.trainer_job()
    job = trainer_job(runtime)
    pod = job["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]

    assert runtime["spec"]["mlPolicy"] == {"numNodes": 2, "torch": {}}
    assert (job["name"], container["name"]) == (required.replicated_job, required.container)
    assert container["resources"]["limits"][ws.GPU_RESOURCE] == spec.gpus == 8
    assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == spec.efa_interfaces == 32
    assert pod["nodeSelector"] == {
        ws.NODE_TYPE_LABEL: ws.GPU_NODE_TYPE,
        "node.kubernetes.io/instance-type": gpu_type,
    }
    assert {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]} == {
        ws.GPU_INSTANCE_TYPE_ENV: gpu_type,
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "TRN_SHUTDOWN_TIMEOUT_S": "270",
        # The trainer's CloudWatch metrics name the environment and the job (its JobSet).
        "TRN_JOB": {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}},
        "TRN_ENVIRONMENT": "trn-dev",
        "AWS_EMF_AGENT_ENDPOINT": "tcp://cloudwatch-agent.amazon-cloudwatch.svc.cluster.local:25888",
        "TRN_CAPACITY": "on-demand",
    }
    # The trn runtime is unchanged beside it.
    assert jobs.runtime_drift(synthesized_runtime(synth), trn_catalog.get("trn3.48xlarge")) == []


def test_job_submit_target_gpu_finds_no_drift_in_the_synthesized_gpu_runtime(
    synth_variant: Callable[[str], Synth],
) -> None:
    synth = synth_variant("gpu")
    spec = trn_catalog.get_gpu(node_instance_type(synth, trn_catalog.GPU_CATALOG))

    assert jobs.runtime_drift(synthesized_runtime(synth, ws.GPU_RUNTIME_NAME), spec) == []
    # The trn runtime is no place for a GPU job: the check says why.
    assert jobs.runtime_drift(synthesized_runtime(synth), spec)[:3] == [
        f"nodeSelector {ws.NODE_TYPE_LABEL}={ws.TRAINIUM_NODE_TYPE} (wanted: {ws.GPU_NODE_TYPE})",
        f"nodeSelector node.kubernetes.io/instance-type=trn3.48xlarge (wanted: {spec.name})",
        f"no toleration of the {ws.GPU_TAINT_KEY} taint of the GPU nodes",
    ]


def test_a_gpu_job_on_the_synthesized_gpu_runtime_makes_a_conforming_gpu_pod(
    synth_variant: Callable[[str], Synth],
) -> None:
    """The pod Kubeflow Trainer builds for a --target gpu job: the runtime's pod with the job's
    image, command, arguments and environment (upserted) in the trainer container. It conforms
    to Kubernetes 1.35 and asks for every GPU and EFA interface of the type, on the GPU nodes."""
    synth = synth_variant("gpu")
    gpu_type = node_instance_type(synth, trn_catalog.GPU_CATALOG)
    spec = trn_catalog.get_gpu(gpu_type)
    runtime = synthesized_runtime(synth, ws.GPU_RUNTIME_NAME)
    outputs = dataclasses.replace(
        OUTPUTS_FOR_SEAM,
        gpu_instance_type=gpu_type,
        gpu_nodes=2,
        gpu_image_uri="example.com/trainer:1-cuda",
        gpu_runtime=ws.GPU_RUNTIME_NAME,
    )
    command = jobs.CommandArgs(("torchrun", "train.py", "--device", "cuda"))
    job = jobs.render_command(
        name="run-p5", outputs=outputs, nodes=2, command=command, target=jobs.GPU
    )
    trainer = job["spec"]["trainer"]
    pod = copy.deepcopy(trainer_job(runtime)["template"]["spec"]["template"]["spec"])
    (container,) = pod["containers"]
    # The job's variables win over the runtime's, as Kubeflow Trainer merges them.
    env = {e["name"]: e for e in container["env"]} | {e["name"]: e for e in trainer["env"]}
    container.update(
        image=trainer["image"],
        command=trainer["command"],
        args=trainer["args"],
        env=[*env.values()],
    )

    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    assert (
        problems({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod}) == []
    )
    limits = container["resources"]["limits"]
    assert limits[ws.GPU_RESOURCE] == spec.gpus == trainer["numProcPerNode"]
    assert limits["vpc.amazonaws.com/efa"] == spec.efa_interfaces
    assert env[ws.GPU_INSTANCE_TYPE_ENV]["value"] == gpu_type
    assert env["TRN_METRICS_FILE"]["value"] == "/fsx/checkpoints/run-p5/metrics.jsonl"
    assert pod["nodeSelector"][ws.NODE_TYPE_LABEL] == ws.GPU_NODE_TYPE
    assert {t["key"] for t in pod["tolerations"]} == {ws.GPU_TAINT_KEY}
