"""`trnctl job submit --ultraserver`: every pod of a job inside one UltraServer, through what a
Trainer v2.3.0 TrainJob allows (runtimePatches down to the pod's affinity)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import boto3
import pytest
import yaml

from tests.conftest import sample_outputs
from trnctl import jobs, kube, placement
from trnctl.errors import TrnctlError

BLOCKS = "cr-0123456789abcdef2,cr-0123456789abcdef3"
ULTRA = sample_outputs(
    instance_type="trn2u.48xlarge",
    trn_nodes=8,
    lnc=2,
    ultraserver_type="u-trn2x64",
    ultraserver_ids=BLOCKS,
)
ARGS = jobs.TrainingArgs("125m", "tales", max_steps=10).argv("run-1")


def render(outputs: Any = ULTRA, nodes: int = 4, **kwargs: Any) -> dict[str, Any]:
    return jobs.render(
        name="run-1", outputs=outputs, nodes=nodes, args=ARGS, ultraserver=True, **kwargs
    )


def affinity(job: dict[str, Any]) -> dict[str, Any]:
    (patch,) = job["spec"]["runtimePatches"]
    assert patch["manager"] == placement.PATCH_MANAGER
    (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert replicated["name"] == "node"
    result: dict[str, Any] = replicated["template"]["spec"]["template"]["spec"]["affinity"]
    return result


def test_the_job_requires_its_pods_together_on_one_ultraserver_and_others_away() -> None:
    found = affinity(render())

    (together,) = found["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert together == {
        "labelSelector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "run-1"}},
        "topologyKey": "trn-platform/ultraserver-id",
    }
    ours, elsewhere = found["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    # Other jobs of the job's namespace (no namespaceSelector: the pod's own namespace)...
    assert ours == {
        "labelSelector": {
            "matchExpressions": [
                {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"},
                {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "NotIn", "values": ["run-1"]},
            ]
        },
        "topologyKey": "trn-platform/ultraserver-id",
    }
    # ...and every job of every other namespace, a job named run-1 there included.
    assert elsewhere == {
        "labelSelector": {
            "matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]
        },
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["training"]}
            ]
        },
        "topologyKey": "trn-platform/ultraserver-id",
    }
    terms = found["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "trn-platform/ultraserver-id", "operator": "Exists"}
    ]


def test_a_command_job_carries_the_same_placement() -> None:
    command = jobs.CommandArgs(("torchrun", "train.py"), None)
    job = jobs.render_command(
        name="run-1", outputs=ULTRA, nodes=2, command=command, ultraserver=True
    )
    assert affinity(job) == affinity(render())


def test_without_ultraserver_there_is_no_patch() -> None:
    job = jobs.render(name="run-1", outputs=ULTRA, nodes=8, args=ARGS)
    assert "runtimePatches" not in job["spec"]


def test_a_field_trainer_2_3_0_does_not_patch_breaks_the_schema() -> None:
    job = render()
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    broken = copy.deepcopy(job)
    broken_pod = broken["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    broken_pod["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["priority"] = 1
    assert pod != broken_pod
    with pytest.raises(TrnctlError, match=r"breaks the .* schema at spec\.runtimePatches\.0\."):
        jobs.check_schema(broken)


@pytest.mark.parametrize(
    ("outputs", "nodes", "message"),
    [
        (
            sample_outputs(),
            1,
            r"--ultraserver: trn-dev has no UltraServer capacity; deploy it with "
            r"-c ultraserver_reservation_ids=",
        ),
        (
            replace(ULTRA, devices="dra", lnc=0),
            4,
            r"--ultraserver: trn-dev runs devices 'dra', where the Neuron UltraServer operator "
            r"places UltraServer jobs; it serves Trn3 UltraServer \(Trn3pds\) types only "
            r"\(Neuron docs\) and u-trn2x64 is not one; deploy with -c devices=plugin",
        ),
        (
            ULTRA,
            5,
            r"--ultraserver: --nodes 5 is more than one u-trn2x64 UltraServer has \(4 servers\)",
        ),
    ],
)
def test_jobs_that_cannot_be_placed_are_refused(outputs: Any, nodes: int, message: str) -> None:
    with pytest.raises(TrnctlError, match=message):
        render(outputs, nodes)


def test_a_gpu_job_is_refused() -> None:
    with pytest.raises(TrnctlError, match=r"--ultraserver places Trainium jobs"):
        placement.check(ULTRA, 1, "gpu")


@pytest.fixture
def deployed(moto: None) -> None:
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=ULTRA.to_json(), Type="String"
    )


def test_submit_defaults_to_one_ultraserver_of_nodes(
    deployed: None, monkeypatch: pytest.MonkeyPatch, trnctl: Any
) -> None:
    monkeypatch.setattr(kube, "connect", lambda *a, **k: pytest.fail("dry run reached Kubernetes"))

    run = trnctl(
        "job", "submit", "--env", "trn-dev", "--preset", "125m", "--data", "tales",
        "--ultraserver", "--name", "run-1", "--dry-run",
    )  # fmt: skip

    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    assert job["spec"]["trainer"]["numNodes"] == 4
    assert affinity(job) == affinity(render())


def test_submit_ultraserver_with_target_gpu_is_refused(deployed: None, trnctl: Any) -> None:
    run = trnctl(
        "job", "submit", "--env", "trn-dev", "--preset", "125m", "--data", "tales",
        "--ultraserver", "--target", "gpu", "--dry-run",
    )  # fmt: skip

    assert run.exit_code == 2
    assert "--ultraserver only applies to Trainium and cannot go with --target gpu" in run.stderr
