"""devices=dra on trn3 (the `dra` variant) and trn2: the Neuron DRA driver instead of the device
plugin, aws-dranet for EFA, no EFA device plugin on trn nodes, the claim templates with their
pairing constraint, and runtimes whose pods claim a whole node."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import trn_catalog
from tests.conftest import Synth, synthesize
from trn_catalog import devices, versions

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trn2_dra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synth]:
    yield synthesize(
        {"devices": "dra", "instance_type": "trn2.48xlarge"},
        Path(tmp_path_factory.mktemp("cdk-dra-trn2")),
    )


@pytest.fixture(params=["trn3", "trn2"])
def dra(request: pytest.FixtureRequest, synth_variant: Callable[[str], Synth]) -> Synth:
    if request.param == "trn3":
        return synth_variant("dra")
    synth: Synth = request.getfixturevalue("trn2_dra")
    return synth


def charts(synth: Synth) -> dict[str, dict[str, Any]]:
    return {
        c["Properties"]["Release"]: c["Properties"]
        for c in synth.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()
    }


def values(synth: Synth, release: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(charts(synth)[release]["Values"])
    return loaded


def workspace_objects(synth: Synth) -> list[dict[str, Any]]:
    # The workspace's manifest (the workloads stack also applies pipelines' ServiceAccount).
    (manifest,) = [
        resource
        for logical_id, resource in synth.resources(
            "workloads", "Custom::AWSCDK-EKS-KubernetesResource"
        ).items()
        if logical_id.startswith("Workspace")
    ]
    text = manifest["Properties"]["Manifest"]
    if not isinstance(text, str):
        # Tokens (bucket names, file system ids) make it an Fn::Join; the objects' shape is all
        # these tests read.
        separator, parts = text["Fn::Join"]
        text = separator.join(p if isinstance(p, str) else "token" for p in parts)
    objects: list[dict[str, Any]] = json.loads(text)
    return objects


def instance_type(synth: Synth) -> str:
    return str(synth.platform.workloads.workspace.props.instance_type)


def test_the_neuron_chart_runs_the_dra_driver_not_the_device_plugin(dra: Synth) -> None:
    neuron = values(dra, "neuron")

    assert neuron["draDriver"]["enabled"] is True
    assert neuron["devicePlugin"] == {"enabled": False}
    assert neuron["scheduler"] == {"enabled": False}
    # Kept under DRA (docs/devices-and-ultraservers.md, "Devices: plugin or DRA").
    assert neuron["npd"]["enabled"] is True and neuron["npd"]["nodeRecovery"]["enabled"] is True
    assert instance_type(dra) in neuron["neuronInstances"]
    assert not [t for t in neuron["neuronInstances"] if t.startswith("trn1")]


def test_aws_dranet_is_pinned_on_the_trn_types_and_creates_the_efa_device_class(
    dra: Synth,
) -> None:
    chart = charts(dra)[versions.DRANET_CHART.release]
    assert (chart["Repository"], chart["Chart"], chart["Version"]) == (
        versions.DRANET_CHART.repository,
        "aws-dranet",
        "1.0.0",
    )
    assert chart["Atomic"] is True
    dranet = values(dra, "aws-dranet")
    assert dranet["supportedInstanceLabels"]["keys"] == ["node.kubernetes.io/instance-type"]
    assert {"trn3.48xlarge", instance_type(dra)} <= set(dranet["supportedInstanceLabels"]["values"])
    assert dranet["deviceClass"] == {"create": True, "name": "efa.networking.k8s.aws"}
    # The deploy region's EKS registry (us-east-2 here), not the chart's us-west-2 default.
    assert dranet["image"] == {
        "repository": "602401143452.dkr.ecr.us-east-2.amazonaws.com/eks/dranet"
    }


def test_no_efa_device_plugin_on_trn_nodes(dra: Synth) -> None:
    allowed = set(values(dra, "efa-device-plugin")["supportedInstanceLabels"]["values"])

    assert allowed.isdisjoint(trn_catalog.CATALOG)
    assert allowed == set(trn_catalog.GPU_CATALOG)


def test_the_plugin_path_installs_no_dra_driver(dev: Synth) -> None:
    assert values(dev, "neuron")["draDriver"] == {"enabled": False}
    assert versions.DRANET_CHART.release not in charts(dev)
    assert set(trn_catalog.CATALOG) <= set(
        values(dev, "efa-device-plugin")["supportedInstanceLabels"]["values"]
    )


def test_claim_templates_pair_neuron_devices_and_efa_by_device_group(dra: Synth) -> None:
    spec = trn_catalog.get(instance_type(dra))
    templates = {
        o["metadata"]["name"]: o["spec"]["spec"]["devices"]
        for o in workspace_objects(dra)
        if o["kind"] == "ResourceClaimTemplate"
    }

    assert sorted(templates) == sorted(
        f"neuron-{size}-lnc{lnc}" for size in ("node", "4", "8") for lnc in (1, 2)
    )
    node = templates["neuron-node-lnc2"]
    assert [(r["exactly"]["deviceClassName"], r["exactly"]["count"]) for r in node["requests"]] == [
        ("neuron.aws.com", spec.chips),
        ("efa.networking.k8s.aws", spec.efa_interfaces),
    ]
    assert node["constraints"] == [
        {"requests": ["neurons", "efas"], "matchAttribute": "resource.aws.com/devicegroup16_id"}
    ]
    for size in (4, 8):
        constraint = templates[f"neuron-{size}-lnc1"]["constraints"][0]
        assert constraint["matchAttribute"] == f"resource.aws.com/devicegroup{size}_id"
    for name, template in templates.items():
        lnc = template["config"][0]["opaque"]["parameters"]["logicalNeuronCore"]
        assert name.endswith(f"-lnc{lnc}")


def test_each_lnc_has_a_runtime_whose_pod_claims_the_whole_node(dra: Synth) -> None:
    runtimes = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["replicatedJobs"][0]["template"][
            "spec"
        ]["template"]["spec"]
        for o in workspace_objects(dra)
        if o["kind"] == "TrainingRuntime"
    }

    assert sorted(runtimes) == ["neuron-torch", "neuron-torch-lnc1"]
    for name, lnc in (("neuron-torch", 2), ("neuron-torch-lnc1", 1)):
        pod = runtimes[name]
        assert pod["resourceClaims"] == [
            {"name": "neuron", "resourceClaimTemplateName": f"neuron-node-lnc{lnc}"}
        ]
        (container,) = pod["containers"]
        assert container["resources"]["claims"] == [{"name": "neuron"}]
        limits = container["resources"]["limits"]
        assert "aws.amazon.com/neuron" not in limits and "vpc.amazonaws.com/efa" not in limits
        assert "hugepages-2Mi" in limits
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env[devices.LNC_ENV] == str(lnc)


def test_the_trn_nodes_are_labelled_dra_with_lnc_per_job(dra: Synth) -> None:
    (group,) = [
        g
        for g in dra.resources("cluster", "AWS::EKS::Nodegroup").values()
        if g["Properties"]["Labels"].get("trn-platform/node-type") == "trainium"
    ]
    labels = group["Properties"]["Labels"]
    assert labels[devices.DEVICES_LABEL] == "dra"
    assert labels[devices.LNC_LABEL] == "per-job"


def test_the_outputs_name_the_mode(dra: Synth) -> None:
    outputs = dra.platform.workloads.outputs
    assert (outputs.devices, outputs.lnc) == ("dra", 0)
