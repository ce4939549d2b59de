"""Per-instance-type facts for AWS Trainium instances, each with its source.

This module is the single source of truth for chip counts, NeuronCores, device memory, EFA
layout and peak FLOPs. The CDK constructs (EFA interfaces), the ops CLI (preflight, quotas, job
resources) and the trainer inside the container (MFU) all read it, so it imports nothing beyond
the standard library.

A fact that no primary source confirms is listed in ``InstanceSpec.unverified``; a preflight
against the real account (``ec2:DescribeInstanceTypes``) is the way to confirm it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from trn_catalog.hosts import HostSpec

# Sources, cited by key so that each fact names where it came from.
SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "neuron-trn1-arch": (
            "Neuron docs, 'AWS Trn1/Trn1n Architecture' and 'Trainium Architecture' "
            "(awsdocs-neuron, general/arch/neuron-hardware/trn1-arch, trainium)"
        ),
        "neuron-trn1-multinode": (
            "Neuron docs, 'How to prepare trn1.32xlarge for multi-node execution' "
            "(trn1.32xlarge has 8 EFA devices, trn1n.32xlarge has 16)"
        ),
        "neuron-trn2-arch": (
            "Neuron docs, 'Amazon EC2 Trn2 Architecture' and 'Trainium2 Architecture' "
            "(about-neuron/arch/neuron-hardware/trn2-arch, trainium2)"
        ),
        "neuron-eks-samples-trn2": (
            "aws-neuron/aws-neuron-eks-samples trn2 node group template (16 EFA interfaces, "
            "network cards 0-15)"
        ),
        "neuron-trn3-arch": (
            "Neuron docs, 'Trainium3 Architecture' and 'Trn3 Architecture' "
            "(about-neuron/arch/neuron-hardware/trainium3, trn3-arch; date-modified 2025-12-02)"
        ),
        "neuron-driver-trn3": (
            "aws-neuron/aws-neuron-driver instance list (names trn3.48xlarge, trn3p.48xlarge, "
            "trn3e.24xlarge)"
        ),
        "ec2-instance-types": "Amazon EC2 instance type pages (Accelerated computing: Trn1, Trn2)",
        "botocore-ec2": "botocore EC2 service model, InstanceType enum",
        "ec2-describe-instance-types": (
            "EC2 DescribeInstanceTypes, NetworkInfo (MaximumEfaInterfaces, MaximumNetworkCards, "
            "NetworkPerformance), as moto 5.2.5 bundles EC2's answer"
        ),
        "derived": (
            "Derived: a Gen1 Trn3 UltraServer is 4 servers at 3,200 Gbps each "
            "(Neuron trn3-arch docs)"
        ),
        "assumed": "No primary source found; assumed equal to the previous generation's layout",
    }
)


@dataclass(frozen=True, kw_only=True)
class InstanceSpec(HostSpec):
    """Facts about one Trainium instance type.

    ``sources`` maps each field name to a key of :data:`SOURCES`; ``unverified`` names the fields
    that no primary source confirms.
    """

    citations = SOURCES

    generation: int
    chips: int
    neuron_cores_per_chip: int
    device_memory_gib_per_chip: int
    bf16_tflops_per_chip: float
    fp8_tflops_per_chip: float

    @property
    def neuron_cores(self) -> int:
        return self.chips * self.neuron_cores_per_chip

    @property
    def default_lnc(self) -> int:
        """Logical NeuronCore size by default: 2 physical cores per logical one on Trn2/Trn3
        (Neuron LNC docs), 1 on Trn1."""
        return 2 if self.generation >= 2 else 1

    @property
    def logical_neuron_cores(self) -> int:
        """NeuronCores a job sees at the default LNC: one torchrun rank each."""
        return self.neuron_cores // self.default_lnc

    @property
    def device_memory_gib(self) -> int:
        return self.chips * self.device_memory_gib_per_chip

    @property
    def peak_bf16_tflops(self) -> float:
        return self.chips * self.bf16_tflops_per_chip


FACT_FIELDS: tuple[str, ...] = (
    "generation",
    "chips",
    "neuron_cores_per_chip",
    "device_memory_gib_per_chip",
    "vcpus",
    "memory_gib",
    "efa_interfaces",
    "network_cards",
    "efa_gbps",
    "bf16_tflops_per_chip",
    "fp8_tflops_per_chip",
    "instance_store_gb",
)


def _sources(default: str, **overrides: str) -> Mapping[str, str]:
    return MappingProxyType({name: overrides.get(name, default) for name in FACT_FIELDS})


# Trainium (NeuronCore-v2): 2 cores, 32 GiB HBM, 190 TFLOPS BF16/FP16/cFP8 per chip.
_TRN1 = InstanceSpec(
    name="trn1.32xlarge",
    generation=1,
    chips=16,
    neuron_cores_per_chip=2,
    device_memory_gib_per_chip=32,
    vcpus=128,
    memory_gib=512,
    efa_interfaces=8,
    network_cards=8,
    efa_gbps=800,
    bf16_tflops_per_chip=190.0,
    fp8_tflops_per_chip=190.0,
    instance_store_gb=7600,
    sources=_sources(
        "neuron-trn1-arch",
        efa_interfaces="neuron-trn1-multinode",
        network_cards="neuron-trn1-multinode",
        instance_store_gb="ec2-instance-types",
    ),
)

# Trainium2 (NeuronCore-v3): 8 cores, 96 GiB HBM, 667 TFLOPS BF16 and 1,299 TFLOPS FP8 dense.
_TRN2_48 = InstanceSpec(
    name="trn2.48xlarge",
    generation=2,
    chips=16,
    neuron_cores_per_chip=8,
    device_memory_gib_per_chip=96,
    vcpus=192,
    memory_gib=2048,
    efa_interfaces=16,
    network_cards=16,
    efa_gbps=3200,
    bf16_tflops_per_chip=667.0,
    fp8_tflops_per_chip=1299.0,
    instance_store_gb=7600,
    sources=_sources(
        "neuron-trn2-arch",
        vcpus="ec2-instance-types",
        memory_gib="ec2-instance-types",
        efa_interfaces="neuron-eks-samples-trn2",
        network_cards="neuron-eks-samples-trn2",
        instance_store_gb="ec2-instance-types",
    ),
)

_TRN2_3 = replace(
    _TRN2_48,
    name="trn2.3xlarge",
    chips=1,
    vcpus=12,
    memory_gib=128,
    efa_interfaces=1,
    network_cards=1,
    efa_gbps=200,
    instance_store_gb=470,
    sources=_sources(
        "neuron-trn2-arch",
        vcpus="ec2-instance-types",
        memory_gib="ec2-instance-types",
        efa_interfaces="ec2-describe-instance-types",
        network_cards="ec2-describe-instance-types",
        efa_gbps="ec2-describe-instance-types",
        instance_store_gb="ec2-instance-types",
    ),
)

# Trainium3 (NeuronCore-v4): 8 cores, 144 GiB HBM, 671 TFLOPS BF16 and 2,517 TFLOPS MXFP8 dense.
# The name comes from the Neuron driver; the host layout (vCPUs, memory, EFA cards, instance
# store) has no primary source yet and follows trn2.48xlarge.
_TRN3_48 = replace(
    _TRN2_48,
    name="trn3.48xlarge",
    generation=3,
    device_memory_gib_per_chip=144,
    bf16_tflops_per_chip=671.0,
    fp8_tflops_per_chip=2517.0,
    sources=_sources(
        "neuron-trn3-arch",
        vcpus="assumed",
        memory_gib="assumed",
        efa_interfaces="assumed",
        network_cards="assumed",
        efa_gbps="derived",
        instance_store_gb="assumed",
    ),
    unverified=frozenset(
        {
            "name",
            "vcpus",
            "memory_gib",
            "efa_interfaces",
            "network_cards",
            "efa_gbps",
            "instance_store_gb",
        }
    ),
)

CATALOG: Mapping[str, InstanceSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            _TRN1,
            replace(
                _TRN1, name="trn1n.32xlarge", efa_interfaces=16, network_cards=16, efa_gbps=1600
            ),
            _TRN2_3,
            _TRN2_48,
            # One of the four servers of a Trn2 UltraServer; the same host as trn2.48xlarge.
            replace(_TRN2_48, name="trn2u.48xlarge"),
            _TRN3_48,
        )
    }
)

# The platform's default node type, the newest generation. Defaults elsewhere (the app's
# context, the node group construct, the trainer) name this constant: the trn3 name and layout
# are not confirmed, so the literal lives only in this catalog.
DEFAULT_INSTANCE_TYPE = _TRN3_48.name


class UnknownInstanceTypeError(KeyError):
    """Raised for an instance type that the catalog does not list; ``catalog_name`` and the known
    types let the GPU catalog raise the same error about its own table."""

    catalog_name = "instance catalog"

    def __init__(self, instance_type: str, known: Iterable[str] | None = None) -> None:
        self.instance_type = instance_type
        self.known = tuple(CATALOG if known is None else known)
        super().__init__(instance_type)

    def __str__(self) -> str:
        return (
            f"instance type {self.instance_type!r} is not in the {self.catalog_name}; "
            f"known: {', '.join(self.known)}"
        )


def get(instance_type: str) -> InstanceSpec:
    """The catalog entry for ``instance_type``.

    Raises:
        UnknownInstanceTypeError: the type is not in the catalog (the message lists the known ones).
    """
    try:
        return CATALOG[instance_type]
    except KeyError:
        raise UnknownInstanceTypeError(instance_type) from None
