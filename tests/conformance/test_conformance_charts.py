"""Every value the platform sets for the Neuron, EFA and Trainer charts is a key of that chart
version's own values file (the key lists in tests/conformance/chart_values.py), and every pod
those charts start asks for CPU and memory, in every variant."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from kube_objects import helm_values

from constructs_lib.cluster import neuron_values, nvidia_device_plugin_values
from constructs_lib.plugins import dranet_values, efa_values
from tests.conformance import chart_values
from tests.conftest import VARIANTS, Synth
from trn_catalog import registries, versions


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_chart_value_is_a_key_of_the_pinned_chart(
    synth_variant: Callable[[str], Synth], variant: str
) -> None:
    installed = list(helm_values(synth_variant(variant).templates))
    pins = (
        versions.CHARTS
        + (versions.GPU_CHARTS if "gpu_instance_type" in VARIANTS[variant] else ())
        + (versions.DRA_CHARTS if VARIANTS[variant].get("devices") == "dra" else ())
    )
    assert sorted(chart for chart, _, _ in installed) == sorted(p.chart for p in pins)
    for chart, version, values in installed:
        known = chart_values.CHARTS[chart]
        assert version == known.version, chart
        assert known.problems(values) == [], chart


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_pod_a_chart_starts_asks_for_cpu_and_memory(
    synth_variant: Callable[[str], Synth], variant: str
) -> None:
    """Where the pinned chart states no request (the Neuron device plugin, Kubeflow Trainer's
    manager, the NVIDIA device plugin), the platform's values give one."""
    for chart, _, values in helm_values(synth_variant(variant).templates):
        assert chart_values.CHARTS[chart].unrequested(values) == [], chart


def test_a_pod_left_without_requests_is_named() -> None:
    values = neuron_values("v1.35.2-eks-1-35-7")
    del values["devicePlugin"]["resources"]
    values["scheduler"]["customScheduler"]["resources"] = {}  # the chart's own 0.1 CPU stays

    assert chart_values.NEURON.unrequested(values) == [
        "devicePlugin.resources: no cpu or memory request",
        "scheduler.customScheduler.resources: no memory request",
    ]
    # Off, a pod needs none; with node recovery on, the chart's own requests count.
    values["devicePlugin"]["enabled"] = False
    values["npd"]["nodeRecovery"] = {"enabled": True}
    assert chart_values.NEURON.unrequested(values) == [
        "scheduler.customScheduler.resources: no memory request"
    ]


def stale_value_lists(pins: tuple[versions.ChartPin, ...]) -> list[str]:
    """Pins whose key list in the catalog was read from another chart version."""
    return [
        f"{pin.chart} {pin.version}: value keys are of {chart_values.CHARTS[pin.chart].version}"
        for pin in pins
        if chart_values.CHARTS[pin.chart].version != pin.version
    ]


def test_the_key_lists_are_of_the_pinned_chart_versions() -> None:
    assert stale_value_lists(versions.CHARTS + versions.GPU_CHARTS + versions.DRA_CHARTS) == []


def test_the_nvidia_device_plugin_values_are_chart_keys_and_a_wrong_key_fails() -> None:
    values = nvidia_device_plugin_values()
    assert chart_values.NVIDIA_DEVICE_PLUGIN.problems(values) == []
    # Keys of other device plugins, or the chart's commented-out hostNetwork switch.
    assert chart_values.NVIDIA_DEVICE_PLUGIN.problems(
        {"supportedInstanceLabels": {}, "devicePlugin": {"enableHostNetwork": True}}
    ) == [
        "supportedInstanceLabels: not a value of nvidia-device-plugin 0.20.0",
        "devicePlugin.enableHostNetwork: not a value of nvidia-device-plugin 0.20.0",
    ]
    assert chart_values.NVIDIA_DEVICE_PLUGIN.problems({"tolerations": {"key": "x"}}) == [
        "tolerations: list in nvidia-device-plugin 0.20.0, given {'key': 'x'}"
    ]


def test_a_chart_pin_bump_without_new_key_lists_fails() -> None:
    bumped = dataclasses.replace(versions.NEURON_CHART, version="1.10.0")
    pins = tuple(bumped if p is versions.NEURON_CHART else p for p in versions.CHARTS)

    assert stale_value_lists(pins) == ["neuron-helm-chart 1.10.0: value keys are of 1.9.0"]


@pytest.mark.parametrize(
    ("values", "found"),
    [
        # Invented keys, at the top and inside a map of chart keys.
        (
            {"npd": {"tolerateAll": True}},
            ["npd.tolerateAll: not a value of neuron-helm-chart 1.9.0"],
        ),
        ({"efa": {"enabled": True}}, ["efa: not a value of neuron-helm-chart 1.9.0"]),
        # A near miss of the real key (scheduler.customScheduler.image.tag).
        (
            {"scheduler": {"customScheduler": {"imageTag": "v1.35.0"}}},
            ["scheduler.customScheduler.imageTag: not a value of neuron-helm-chart 1.9.0"],
        ),
        # The right key with the wrong kind of value.
        (
            {"devicePlugin": {"tolerations": {"key": "x"}}},
            ["devicePlugin.tolerations: list in neuron-helm-chart 1.9.0, given {'key': 'x'}"],
        ),
        (
            {"npd": {"enabled": "true"}},
            ["npd.enabled: bool in neuron-helm-chart 1.9.0, given 'true'"],
        ),
        # Inside a free map (a Kubernetes object), any key is the user's.
        ({"npd": {"nodeSelector": {"any/label": "x"}}}, []),
    ],
)
def test_the_key_check_names_what_the_chart_does_not_have(
    values: dict[str, object], found: list[str]
) -> None:
    assert chart_values.NEURON.problems(values) == found


def test_trainer_and_efa_keys_are_checked_too() -> None:
    assert chart_values.TRAINER.problems({"runtimes": {"torch": {"enabled": False}}}) == [
        "runtimes.torch: not a value of kubeflow-trainer 2.3.0"
    ]
    assert chart_values.EFA.problems({"supportedInstanceTypes": []}) == [
        "supportedInstanceTypes: not a value of aws-efa-k8s-device-plugin v0.5.30"
    ]


def test_the_dra_values_are_chart_keys_and_the_charts_own_keys_are_checked() -> None:
    assert chart_values.NEURON.problems(neuron_values(devices="dra")) == []
    registry = registries.eks_registry("us-east-2")
    assert chart_values.DRANET.problems(dranet_values(registry)) == []
    assert chart_values.EFA.problems(efa_values(registry, "dra")) == []
    # The EFA device plugin's name for the allowlist is not aws-dranet's, and its DeviceClass
    # switch is deviceClass.create.
    assert chart_values.DRANET.problems(
        {"supportedInstanceTypes": [], "deviceClass": {"enabled": True}}
    ) == [
        "supportedInstanceTypes: not a value of aws-dranet 1.0.0",
        "deviceClass.enabled: not a value of aws-dranet 1.0.0",
    ]


def test_the_neuron_scheduler_extension_point_sets_only_chart_keys() -> None:
    values = neuron_values("v1.35.2-eks-1-35-7")

    assert chart_values.NEURON.problems(values) == []
    assert values["scheduler"]["customScheduler"]["image"]["tag"] == "v1.35.2-eks-1-35-7"
