"""trn_catalog.devices: the claim templates DRA jobs use, the LNC rules and the Kubernetes floor."""

from __future__ import annotations

import dataclasses

import pytest

import trn_catalog
from trn_catalog import devices

TRN2 = trn_catalog.get("trn2.48xlarge")
TRN3 = trn_catalog.get("trn3.48xlarge")
TRN1 = trn_catalog.get("trn1.32xlarge")


def test_the_whole_node_claim_pairs_every_neuron_device_with_every_efa_interface() -> None:
    template = devices.claim_template(TRN2, 16, 1, "training")

    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert template["metadata"] == {"name": "neuron-node-lnc1", "namespace": "training"}
    spec = template["spec"]["spec"]["devices"]
    assert spec["requests"] == [
        {
            "name": "neurons",
            "exactly": {
                "deviceClassName": "neuron.aws.com",
                "allocationMode": "ExactCount",
                "count": 16,
                # Devices of this type, never the UltraServer node the driver also publishes.
                "selectors": [
                    {
                        "cel": {
                            "expression": "device.attributes['neuron.aws.com'].instanceType == "
                            "'trn2.48xlarge' && device.attributes['neuron.aws.com'].resourceType "
                            "== 'neuron_device'"
                        }
                    }
                ],
            },
        },
        {
            "name": "efas",
            "exactly": {
                "deviceClassName": "efa.networking.k8s.aws",
                "allocationMode": "ExactCount",
                "count": 16,
            },
        },
    ]
    assert spec["constraints"] == [
        {"requests": ["neurons", "efas"], "matchAttribute": "resource.aws.com/devicegroup16_id"}
    ]
    assert spec["config"] == [
        {
            "requests": ["neurons"],
            "opaque": {
                "driver": "neuron.aws.com",
                "parameters": {
                    "apiVersion": "neuron.aws.com/v1",
                    "kind": "NeuronConfig",
                    "logicalNeuronCore": 1,
                },
            },
        }
    ]


@pytest.mark.parametrize(("count", "efa"), [(4, 4), (8, 8)])
def test_connected_subsets_take_their_share_of_efa_on_their_device_group(
    count: int, efa: int
) -> None:
    spec = devices.claim_template(TRN3, count, 2, "training")["spec"]["spec"]["devices"]

    assert [r["exactly"]["count"] for r in spec["requests"]] == [count, efa]
    assert spec["constraints"][0]["matchAttribute"] == f"resource.aws.com/devicegroup{count}_id"


def test_a_type_without_device_groups_is_claimed_whole_and_unpaired() -> None:
    """trn2.3xlarge is not in the connected-device map both drivers read: its devices carry no
    devicegroup attribute, and a constraint on it would never be met."""
    small = trn_catalog.get("trn2.3xlarge")
    spec = devices.claim_template(small, 1, 2, "training")["spec"]["spec"]["devices"]

    assert "constraints" not in spec
    assert [(r["name"], r["exactly"]["count"]) for r in spec["requests"]] == [
        ("neurons", 1),
        ("efas", 1),
    ]
    assert devices.has_device_groups(TRN2) and not devices.has_device_groups(small)
    unmapped = dataclasses.replace(TRN2, name="trn2.unmapped")
    assert devices.claim_sizes(unmapped) == (16,)
    with pytest.raises(
        ValueError,
        match=r"devices: trn2\.unmapped publishes no device groups, so only its whole node "
        r"\(16\) can be claimed, not 4 connected devices",
    ):
        devices.claim_template(unmapped, 4, 2, "training")


def test_a_claim_over_kubernetes_32_devices_is_refused() -> None:
    wider = dataclasses.replace(TRN2, efa_interfaces=32)
    with pytest.raises(
        ValueError,
        match=r"devices: 16 Neuron devices and 32 EFA interfaces exceed the 32 devices one "
        "ResourceClaim can allocate",
    ):
        devices.claim_template(wider, 16, 2, "training")


def test_claim_sizes_and_runtime_names_follow_the_type() -> None:
    assert devices.claim_sizes(TRN2) == (4, 8, 16)
    assert devices.claim_sizes(trn_catalog.get("trn2.3xlarge")) == (1,)
    assert devices.runtime_name(TRN2, 2) == "neuron-torch"
    assert devices.runtime_name(TRN2, 1) == "neuron-torch-lnc1"
    assert devices.logical_cores(TRN2, 1) == 128
    assert devices.logical_cores(TRN3, 2) == 64


def test_lnc_is_refused_on_trn1_and_outside_one_and_two() -> None:
    assert "trn1.32xlarge has no logical NeuronCore setting" in str(devices.lnc_problem(TRN1, 1))
    assert devices.lnc_problem(TRN2, 3) == "3 is not an LNC; use 1 or 2"
    assert devices.lnc_problem(TRN2, 1) is None
    with pytest.raises(ValueError, match=r"lnc: trn1\.32xlarge has no logical NeuronCore"):
        devices.claim_template(TRN1, 16, 1, "training")


def test_a_device_group_the_drivers_do_not_publish_is_refused() -> None:
    with pytest.raises(ValueError, match=r"device group size 2 is not published"):
        devices.device_group_attribute(2)
    with pytest.raises(ValueError, match=r"devices: trn2\.48xlarge has 16 Neuron devices, not 32"):
        devices.claim_template(TRN2, 32, 2, "training")


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        ("1.35", None),
        ("1.34", None),
        ("1.33", "DRA needs Kubernetes 1.34 or later (resource.k8s.io/v1); the cluster runs 1.33"),
        ("one", "Kubernetes version 'one' is not of the form 1.NN"),
    ],
)
def test_dra_needs_kubernetes_1_34(version: str, problem: str | None) -> None:
    assert devices.kubernetes_problem(version) == problem
