"""How Neuron devices reach pods: device plugins, or Dynamic Resource Allocation (DRA).

Both the CDK side (chart values, the claim templates and runtimes of the workspace) and the ops
CLI (``trnctl job submit --lnc``, preflight) read these names and rules, so this module imports
nothing beyond the standard library. Each fact names its source:

- [N-DRA] Neuron docs ``deploy/eks/dra.rst`` (aws-neuron/aws-neuron-sdk, 2026-08): the
  ``neuron.aws.com`` driver and DeviceClass, the ``NeuronConfig`` opaque parameters
  (``apiVersion: neuron.aws.com/v1``, field ``logicalNeuronCore``), control plane 1.34+.
- [E1] EKS user guide ``device-management-neuron``: DRA from Kubernetes 1.34, managed and
  self-managed node groups only, never beside the device plugin on a node.
- [E2] EKS user guide ``device-management-efa``: the EFA DRA driver (aws-dranet), its DeviceClass
  ``efa.networking.k8s.aws``, and Neuron/EFA pairing by ``resource.aws.com/devicegroup<N>_id``.
- [N-LNC] Neuron docs ``about-neuron/arch/neuron-features/logical-neuroncore-config.rst``: LNC is
  1 or 2 on Trn2/Trn3 (2 by default); ``NEURON_LOGICAL_NC_CONFIG`` and the compiler's
  ``--logical-nc-config`` / ``-lnc`` must agree. Trn1 supports LNC 1 only (compiler error
  NCC_EARG001).
- [L] aws-neuron/connected-device-maps-over-efa-for-neuron v1.1.0
  (``lookup/config/efa-enabled-instances.json``): the types whose devices get the device group
  attributes; both drivers take them from this library. trn2.3xlarge is not among them.
- [K] Kubernetes v1.35 ``resource.k8s.io/v1`` types: a claim allocates at most 32 devices
  (``AllocationResultsMaxSize``).
- [N-PRE] Neuron docs ``deploy/eks/prerequisites.rst`` (aws-neuron/aws-neuron-sdk@3afa0fdf):
  on the device-plugin path a node's LNC is the line ``NEURON_LOGICAL_NC_CONFIG=<n>`` in
  ``/opt/aws/neuron/logical_nc_config``, written by the launch template's user data.
"""

from __future__ import annotations

from typing import Any, Literal

from trn_catalog.instances import InstanceSpec
from trn_catalog.workspace import RUNTIME_NAME

DeviceMode = Literal["plugin", "dra"]
# Device plugins stay the default until the Neuron DRA driver leaves beta.
DEVICE_MODES: tuple[DeviceMode, ...] = ("plugin", "dra")
DEFAULT_DEVICE_MODE: DeviceMode = "plugin"
# DRA's resource.k8s.io/v1 is GA from Kubernetes 1.34 [E1, N-DRA].
DRA_MIN_KUBERNETES = (1, 34)

NEURON_DRIVER = "neuron.aws.com"
NEURON_DEVICE_CLASS = "neuron.aws.com"
EFA_DEVICE_CLASS = "efa.networking.k8s.aws"
NEURON_CONFIG_API_VERSION = "neuron.aws.com/v1"
NEURON_CONFIG_KIND = "NeuronConfig"
# The attribute both drivers publish on each device: devices of one group of N connected Neuron
# devices, and the EFA interfaces wired to them, share its value [E2].
DEVICE_GROUP_SIZES = (1, 4, 8, 16)
# Catalog types whose devices carry that attribute [L]; on the others a claim cannot pair
# devices, so the workspace offers the whole node only, unconstrained.
DEVICE_GROUP_TYPES = frozenset(
    {"trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge", "trn2u.48xlarge", "trn3.48xlarge"}
)
# The Neuron driver also publishes UltraServer nodes as devices of the same class [N-DRA].
NEURON_DEVICE_TYPE = "neuron_device"
MAX_DEVICES_PER_CLAIM = 32
CLAIM_API_VERSION = "resource.k8s.io/v1"
# The name a runtime's pods and their trainer container give the claim.
POD_CLAIM = "neuron"
NEURON_REQUEST = "neurons"
EFA_REQUEST = "efas"

LNC_VALUES = (1, 2)
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
LNC_CONFIG_FILE = "/opt/aws/neuron/logical_nc_config"
# Node labels the platform's Trainium node group carries: how its devices are managed and its
# LNC (the node's on the plugin path; "per-job" under DRA). trnctl preflight reads them back.
DEVICES_LABEL = "trn-platform/devices"
LNC_LABEL = "trn-platform/lnc"
LNC_PER_JOB = "per-job"


def device_group_attribute(size: int) -> str:
    """``resource.aws.com/devicegroup<size>_id``: the attribute that pairs ``size`` connected
    Neuron devices with their EFA interfaces.

    Raises:
        ValueError: ``size`` is not a group size the drivers publish (1, 4, 8 or 16).
    """
    if size not in DEVICE_GROUP_SIZES:
        raise ValueError(
            f"device group size {size} is not published; use one of "
            f"{', '.join(map(str, DEVICE_GROUP_SIZES))}"
        )
    return f"resource.aws.com/devicegroup{size}_id"


def supports_lnc(spec: InstanceSpec) -> bool:
    """Whether the type has a logical NeuronCore setting: Trn2 and Trn3 only [N-LNC]."""
    return spec.generation >= 2


def supports_dra(spec: InstanceSpec) -> bool:
    """Whether the Neuron DRA driver serves the type: Trn2 and Trn3 [N-DRA, E1]."""
    return spec.generation >= 2


def lnc_problem(spec: InstanceSpec, lnc: int) -> str | None:
    """Why ``lnc`` cannot be used on ``spec`` (None when it can)."""
    if not supports_lnc(spec):
        return (
            f"{spec.name} has no logical NeuronCore setting (LNC 1 or 2 is for trn2 and trn3 "
            "types; trn1 always runs one rank per physical NeuronCore)"
        )
    if lnc not in LNC_VALUES:
        return f"{lnc!r} is not an LNC; use 1 or 2"
    return None


def logical_cores(spec: InstanceSpec, lnc: int) -> int:
    """Logical NeuronCores of one node at ``lnc``: one torchrun rank each."""
    return spec.neuron_cores // lnc


def runtime_name(spec: InstanceSpec, lnc: int) -> str:
    """The TrainingRuntime a job at ``lnc`` references under DRA: ``neuron-torch`` at the type's
    default LNC, ``neuron-torch-lnc<lnc>`` otherwise."""
    return RUNTIME_NAME if lnc == spec.default_lnc else f"{RUNTIME_NAME}-lnc{lnc}"


def has_device_groups(spec: InstanceSpec) -> bool:
    """Whether the drivers publish ``resource.aws.com/devicegroup<N>_id`` on the type [L]."""
    return spec.name in DEVICE_GROUP_TYPES


def claim_sizes(spec: InstanceSpec) -> tuple[int, ...]:
    """Device counts the workspace offers claim templates for: the whole node, and 4 and 8
    connected devices where the node has more and publishes device groups."""
    if not has_device_groups(spec):
        return (spec.chips,)
    return (*(n for n in (4, 8) if n < spec.chips), spec.chips)


def claim_template_name(spec: InstanceSpec, devices: int, lnc: int) -> str:
    """``neuron-node-lnc<lnc>`` for the whole node, ``neuron-<n>-lnc<lnc>`` for ``n`` connected
    devices."""
    size = "node" if devices == spec.chips else str(devices)
    return f"neuron-{size}-lnc{lnc}"


def claim_template(spec: InstanceSpec, devices: int, lnc: int, namespace: str) -> dict[str, Any]:
    """A ``resource.k8s.io/v1`` ResourceClaimTemplate: ``devices`` Neuron devices of ``spec``
    (devices, not UltraServer nodes, of that instance type) and the EFA interfaces wired to them,
    with the NeuronConfig that sets ``lnc``. Where the type publishes device groups, one
    ``matchAttribute`` constraint on their group over both requests keeps them connected.

    Raises:
        ValueError: ``devices`` is not a published group size within the node (or, on a type
            without device groups, not the whole node), the claim would exceed Kubernetes' 32
            devices, or ``lnc`` cannot be used on the type.
    """
    problem = lnc_problem(spec, lnc)
    if problem:
        raise ValueError(f"lnc: {problem}")
    if devices > spec.chips:
        raise ValueError(f"devices: {spec.name} has {spec.chips} Neuron devices, not {devices}")
    efa = spec.efa_interfaces * devices // spec.chips
    if devices + efa > MAX_DEVICES_PER_CLAIM:
        raise ValueError(
            f"devices: {devices} Neuron devices and {efa} EFA interfaces exceed the "
            f"{MAX_DEVICES_PER_CLAIM} devices one ResourceClaim can allocate"
        )
    requests = [_request(NEURON_REQUEST, NEURON_DEVICE_CLASS, devices, _neuron_selector(spec))]
    if efa:
        requests.append(_request(EFA_REQUEST, EFA_DEVICE_CLASS, efa))
    claim: dict[str, Any] = {"requests": requests}
    if has_device_groups(spec):
        attribute = device_group_attribute(devices)
        claim["constraints"] = [
            {"requests": [r["name"] for r in requests], "matchAttribute": attribute}
        ]
    elif devices != spec.chips:
        raise ValueError(
            f"devices: {spec.name} publishes no device groups, so only its whole node "
            f"({spec.chips}) can be claimed, not {devices} connected devices"
        )
    claim["config"] = [_neuron_config(lnc)]
    return {
        "apiVersion": CLAIM_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": claim_template_name(spec, devices, lnc), "namespace": namespace},
        "spec": {"spec": {"devices": claim}},
    }


def _neuron_selector(spec: InstanceSpec) -> str:
    attributes = f"device.attributes['{NEURON_DRIVER}']"
    return (
        f"{attributes}.instanceType == '{spec.name}' && "
        f"{attributes}.resourceType == '{NEURON_DEVICE_TYPE}'"
    )


def _neuron_config(lnc: int) -> dict[str, Any]:
    return {
        "requests": [NEURON_REQUEST],
        "opaque": {
            "driver": NEURON_DRIVER,
            "parameters": {
                "apiVersion": NEURON_CONFIG_API_VERSION,
                "kind": NEURON_CONFIG_KIND,
                "logicalNeuronCore": lnc,
            },
        },
    }


def _request(
    name: str, device_class: str, count: int, selector: str | None = None
) -> dict[str, Any]:
    exactly: dict[str, Any] = {
        "deviceClassName": device_class,
        "allocationMode": "ExactCount",
        "count": count,
    }
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": exactly}


def kubernetes_problem(version: str) -> str | None:
    """Why DRA cannot run on a control plane of Kubernetes ``version`` (``1.35``; None: it can)."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return f"Kubernetes version {version!r} is not of the form 1.NN"
    if (major, minor) < DRA_MIN_KUBERNETES:
        low = ".".join(map(str, DRA_MIN_KUBERNETES))
        return (
            f"DRA needs Kubernetes {low} or later (resource.k8s.io/v1); the cluster runs {version}"
        )
    return None
