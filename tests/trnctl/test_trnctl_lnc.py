"""`trnctl job submit --lnc`, and the device mode and LNC in preflight and validate: the runtime
and rank count follow the LNC under DRA; on the device-plugin path --lnc must be the nodes'."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import boto3
import pytest
import yaml
from fake_kube import training_runtime

from tests.conftest import sample_outputs
from trnctl import jobs, kube, preflight, validation
from trnctl.errors import TrnctlError

DRA = sample_outputs(devices="dra", lnc=0)  # trn2.48xlarge
PLUGIN = sample_outputs()  # trn2.48xlarge, outputs written before `lnc`: the type's default
ARGS = jobs.TrainingArgs("125m", "tales", max_steps=10).argv("run-1")


def render(outputs: Any, lnc: int | None, **kwargs: Any) -> dict[str, Any]:
    return jobs.render(name="run-1", outputs=outputs, nodes=2, args=ARGS, lnc=lnc, **kwargs)


@pytest.mark.parametrize(
    ("lnc", "runtime", "ranks"),
    [(None, "neuron-torch", 64), (2, "neuron-torch", 64), (1, "neuron-torch-lnc1", 128)],
)
def test_under_dra_the_lnc_picks_the_runtime_and_the_rank_count(
    lnc: int | None, runtime: str, ranks: int
) -> None:
    job = render(DRA, lnc)

    assert job["spec"]["runtimeRef"]["name"] == runtime
    assert job["spec"]["trainer"]["numProcPerNode"] == ranks


def test_on_the_plugin_path_the_nodes_lnc_sets_the_ranks() -> None:
    lnc1_nodes = replace(PLUGIN, lnc=1)

    assert render(lnc1_nodes, None)["spec"]["trainer"]["numProcPerNode"] == 128
    assert render(lnc1_nodes, 1)["spec"]["runtimeRef"]["name"] == "neuron-torch"
    assert render(PLUGIN, 2)["spec"]["trainer"]["numProcPerNode"] == 64


def test_on_the_plugin_path_another_lnc_than_the_nodes_is_refused() -> None:
    with pytest.raises(
        TrnctlError, match=r"--lnc 1: the trn nodes of trn-dev run LNC 2 \(devices 'plugin'"
    ):
        render(PLUGIN, 1)


def test_lnc_on_trn1_is_refused_naming_the_option() -> None:
    trn1 = sample_outputs(instance_type="trn1.32xlarge")
    with pytest.raises(TrnctlError, match=r"--lnc 1: trn1\.32xlarge has no logical NeuronCore"):
        render(trn1, 1)
    with pytest.raises(TrnctlError, match=r"--lnc 3: 3 is not an LNC; use 1 or 2"):
        render(DRA, 3)


def test_lnc_with_a_gpu_target_is_refused() -> None:
    gpu = replace(
        DRA,
        gpu_instance_type="p5.48xlarge",
        gpu_nodes=1,
        gpu_image_uri="example.com/cuda:1",
        gpu_nodegroup="g",
        gpu_runtime="cuda-torch",
    )
    with pytest.raises(TrnctlError, match=r"--lnc 1: LNC is a Trainium setting"):
        render(gpu, 1, target=jobs.GPU)


@pytest.fixture
def deployed_dra(moto: None) -> None:
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=DRA.to_json(), Type="String"
    )


def test_submit_lnc_1_dry_run_prints_the_lnc1_job(
    deployed_dra: None, monkeypatch: pytest.MonkeyPatch, trnctl: Any
) -> None:
    monkeypatch.setattr(kube, "connect", lambda *a, **k: pytest.fail("dry run reached Kubernetes"))

    run = trnctl(
        "job", "submit", "--env", "trn-dev", "--preset", "125m", "--data", "tales",
        "--lnc", "1", "--name", "run-1", "--dry-run",
    )  # fmt: skip

    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    assert job["spec"]["runtimeRef"]["name"] == "neuron-torch-lnc1"
    assert job["spec"]["trainer"]["numProcPerNode"] == 128


def test_submit_lnc_with_target_gpu_is_refused(deployed_dra: None, trnctl: Any) -> None:
    run = trnctl(
        "job", "submit", "--env", "trn-dev", "--preset", "125m", "--data", "tales",
        "--lnc", "1", "--target", "gpu", "--dry-run",
    )  # fmt: skip

    assert run.exit_code == 2
    assert "--lnc only applies to Trainium and cannot go with --target gpu" in run.stderr


def test_preflight_reports_dra_and_lnc_per_job() -> None:
    mode, lnc = preflight.check_devices(DRA)

    assert (mode.name, mode.status) == ("device management", preflight.Status.PASS)
    assert mode.detail.startswith("dra: Neuron DRA driver and aws-dranet")
    assert "beta" in mode.detail
    assert lnc.name == "LNC"
    assert "1 (128 ranks per node, runtime neuron-torch-lnc1)" in lnc.detail
    assert "2 (64 ranks per node, runtime neuron-torch)" in lnc.detail


def test_preflight_reports_the_plugin_nodes_lnc() -> None:
    mode, lnc = preflight.check_devices(replace(PLUGIN, lnc=1))

    assert mode.detail.startswith("plugin: Neuron and EFA device plugins")
    assert lnc.detail == "1 on every node (node group setting): 128 ranks per node"


def test_preflight_fails_a_mode_the_type_cannot_run() -> None:
    (mode,) = preflight.check_devices(sample_outputs(devices="dra", instance_type="trn1.32xlarge"))
    assert mode.status is preflight.Status.FAIL
    assert "does not serve trn1.32xlarge" in mode.detail
    (unknown,) = preflight.check_devices(sample_outputs(devices="cdi"))
    assert unknown.status is preflight.Status.FAIL


def test_preflight_with_env_adds_the_device_rows(deployed_dra: None, trnctl: Any, aws: Any) -> None:
    """Quota and reservations answered by Stubbers (moto lacks them), the outputs from moto's
    SSM."""
    aws()
    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn2.48xlarge", "--count", "1",
        "--env", "trn-dev",
    )  # fmt: skip

    assert "device management" in run.stdout and "dra: Neuron DRA driver" in run.stdout
    assert "per job (trnctl job submit --lnc)" in run.stdout


def test_validate_names_the_mode_and_lnc() -> None:
    assert validation.device_note(DRA) == "devices dra, LNC 2 (per job)"
    assert validation.device_note(replace(PLUGIN, lnc=1)) == "devices plugin, LNC 1 (node setting)"


def dra_runtime() -> dict[str, Any]:
    pod = {
        "resourceClaims": [{"name": "neuron", "resourceClaimTemplateName": "neuron-node-lnc2"}],
        "containers": [
            {
                "name": "node",
                "env": [{"name": "TRN_INSTANCE_TYPE", "value": "trn2.48xlarge"}],
                "resources": {
                    "limits": {"hugepages-2Mi": "5120Mi"},
                    "claims": [{"name": "neuron"}],
                },
            }
        ],
    }
    return training_runtime(pod)


def test_a_dra_runtime_is_not_drift_and_a_container_without_the_claim_is() -> None:
    import trn_catalog

    spec = trn_catalog.get("trn2.48xlarge")
    runtime = dra_runtime()
    assert jobs.runtime_drift(runtime, spec) == []

    broken = copy.deepcopy(runtime)
    pod = broken["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    del pod["spec"]["containers"][0]["resources"]["claims"]
    assert jobs.runtime_drift(broken, spec) == [
        "its 'node' container uses none of the pod's resource claims"
    ]
