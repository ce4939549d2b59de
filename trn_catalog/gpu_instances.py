"""Per-instance-type facts for the NVIDIA GPU instances of the side-by-side GPU node group.

A table of its own, separate from :data:`trn_catalog.CATALOG`: the Trainium code (preflight,
capacity, MFU, the Neuron charts) iterates that catalog and must never meet a GPU type. The GPU
node group's launch template (EFA interfaces per network card), the ``cuda-torch`` runtime (GPUs
and EFA per pod) and the ops CLI read this one. Standard library only.

Each fact names its source; a fact that no primary source confirms is listed in
``GpuInstanceSpec.unverified``. No region list is claimed for any type: no source read for this
table lists the regions per type, so a preflight (``ec2:DescribeInstanceTypeOfferings``) is the
way to know.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from trn_catalog.hosts import HostSpec
from trn_catalog.instances import UnknownInstanceTypeError

InterfaceType = Literal["interface", "efa", "efa-only"]

GPU_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "ec2-accelerated-specs": (
            "Amazon EC2 User Guide, 'Specifications for Amazon EC2 accelerated computing "
            "instances' (performance, network and instance store tables)"
        ),
        "ec2-efa-multicard": (
            "Amazon EC2 User Guide, 'Maximize network bandwidth on Amazon EC2 instances with "
            "multiple network cards' (the P5/P5e 'use case 1' layout, and the general rule: one "
            "EFA device per network card)"
        ),
        "ec2-efa-rdma": (
            "Amazon EC2 User Guide, 'Elastic Fabric Adapter for AI/ML and HPC workloads', "
            "supported instance types with RDMA read and write support"
        ),
        "nvidia-h100": (
            "NVIDIA H100 Tensor Core GPU datasheet, SXM: BF16 Tensor Core 1,979 TFLOPS with "
            "sparsity, so 989.5 dense"
        ),
        "nvidia-h200": (
            "NVIDIA H200 Tensor Core GPU datasheet, SXM: BF16 Tensor Core 1,979 TFLOPS with "
            "sparsity, so 989.5 dense"
        ),
        "nvidia-b200": (
            "NVIDIA HGX B200 specifications, per GPU: FP16/BF16 Tensor Core 4.5 PFLOPS with "
            "sparsity, so 2,250 TFLOPS dense"
        ),
        "nvidia-l40s": (
            "NVIDIA L40S datasheet: BF16 Tensor Core 362.05 TFLOPS dense (733 with sparsity)"
        ),
        "ec2-describe-instance-types": (
            "EC2 DescribeInstanceTypes, NetworkInfo (MaximumEfaInterfaces, MaximumNetworkCards, "
            "NetworkPerformance), as moto 5.2.5 bundles EC2's answer"
        ),
    }
)


@dataclass(frozen=True, kw_only=True)
class GpuInstanceSpec(HostSpec):
    """Facts about one NVIDIA GPU instance type.

    ``sources`` maps each fact field to a key of :data:`GPU_SOURCES`; ``unverified`` names the
    fields that no primary source confirms.
    """

    citations = GPU_SOURCES

    gpu: str
    gpus: int
    gpu_memory_gib_per_gpu: int
    max_network_interfaces: int
    efa_rdma: bool
    bf16_tflops_per_gpu: float

    @property
    def gpu_memory_gib(self) -> int:
        return self.gpus * self.gpu_memory_gib_per_gpu

    @property
    def peak_bf16_tflops(self) -> float:
        return self.gpus * self.bf16_tflops_per_gpu

    @property
    def interfaces_per_card(self) -> int:
        """Network interfaces one network card takes (the type's maximum over its cards)."""
        return self.max_network_interfaces // self.network_cards

    def efa_layout(self) -> tuple[tuple[int, int, InterfaceType], ...]:
        """(network card, device index, interface type) of every interface, as EC2 documents
        them to save IP addresses ('use case 1'): an ENA primary on card 0 device 0, an
        EFA-only interface on card 0 device 1, and an EFA-only interface on device 0 of every
        other card. One EFA device per card, one IP address per instance."""
        return (
            (0, 0, "interface"),
            (0, 1, "efa-only"),
            *((card, 0, "efa-only") for card in range(1, self.efa_interfaces)),
        )


GPU_FACT_FIELDS: tuple[str, ...] = (
    "gpu",
    "gpus",
    "gpu_memory_gib_per_gpu",
    "vcpus",
    "memory_gib",
    "network_cards",
    "max_network_interfaces",
    "efa_interfaces",
    "efa_gbps",
    "efa_rdma",
    "bf16_tflops_per_gpu",
    "instance_store_gb",
)


def _sources(flops: str, **overrides: str) -> Mapping[str, str]:
    defaults = {name: "ec2-accelerated-specs" for name in GPU_FACT_FIELDS}
    defaults |= {
        "efa_interfaces": "ec2-efa-multicard",
        "efa_rdma": "ec2-efa-rdma",
        "bf16_tflops_per_gpu": flops,
    }
    return MappingProxyType(defaults | overrides)


# 8 x H100 SXM (80 GiB), 32 network cards and 64 interfaces, 3,200 Gbps; 8 x 3,800 GB NVMe.
_P5 = GpuInstanceSpec(
    name="p5.48xlarge",
    gpu="H100",
    gpus=8,
    gpu_memory_gib_per_gpu=80,
    vcpus=192,
    memory_gib=2048,
    network_cards=32,
    max_network_interfaces=64,
    efa_interfaces=32,
    efa_gbps=3200,
    efa_rdma=True,
    bf16_tflops_per_gpu=989.5,
    instance_store_gb=30400,
    sources=_sources("nvidia-h100"),
)

# 8 x H200 (141 GiB), 16 network cards and 64 interfaces, 3,200 Gbps; 16 EFA interfaces, one
# per card (EC2's DescribeInstanceTypes).
_P5EN = GpuInstanceSpec(
    name="p5en.48xlarge",
    gpu="H200",
    gpus=8,
    gpu_memory_gib_per_gpu=141,
    vcpus=192,
    memory_gib=2048,
    network_cards=16,
    max_network_interfaces=64,
    efa_interfaces=16,
    efa_gbps=3200,
    efa_rdma=True,
    bf16_tflops_per_gpu=989.5,
    instance_store_gb=30400,
    sources=_sources("nvidia-h200", efa_interfaces="ec2-describe-instance-types"),
)

# 8 x B200 (179 GiB), 8 network cards and 32 interfaces, 3,200 Gbps; 8 EFA interfaces, one per
# card (EC2's DescribeInstanceTypes, which gives each card 200 Gbps of the 3,200: the cards'
# figures and the total disagree there, and the catalog keeps the total).
_P6_B200 = GpuInstanceSpec(
    name="p6-b200.48xlarge",
    gpu="B200",
    gpus=8,
    gpu_memory_gib_per_gpu=179,
    vcpus=192,
    memory_gib=2048,
    network_cards=8,
    max_network_interfaces=32,
    efa_interfaces=8,
    efa_gbps=3200,
    efa_rdma=True,
    bf16_tflops_per_gpu=2250.0,
    instance_store_gb=30400,
    sources=_sources("nvidia-b200", efa_interfaces="ec2-describe-instance-types"),
)

# 8 x L40S (44 GiB as EC2 lists it), 4 network cards and 40 interfaces, 400 Gbps; 4 EFA
# interfaces, one per card (EC2's DescribeInstanceTypes).
_G6E = GpuInstanceSpec(
    name="g6e.48xlarge",
    gpu="L40S",
    gpus=8,
    gpu_memory_gib_per_gpu=44,
    vcpus=192,
    memory_gib=1536,
    network_cards=4,
    max_network_interfaces=40,
    efa_interfaces=4,
    efa_gbps=400,
    # No AWS page found lists g6e among the types with EFA RDMA read/write: False leaves
    # FI_EFA_USE_DEVICE_RDMA unset, and libfabric finds out from the device itself.
    efa_rdma=False,
    bf16_tflops_per_gpu=362.05,
    instance_store_gb=7600,
    sources=_sources("nvidia-l40s", efa_interfaces="ec2-describe-instance-types"),
    unverified=frozenset({"efa_rdma"}),
)

GPU_CATALOG: Mapping[str, GpuInstanceSpec] = MappingProxyType(
    {spec.name: spec for spec in (_P5, _P5EN, _P6_B200, _G6E)}
)


class UnknownGpuInstanceTypeError(UnknownInstanceTypeError):
    """Raised for a GPU instance type that the GPU catalog does not list."""

    catalog_name = "GPU instance catalog"


def get_gpu(instance_type: str) -> GpuInstanceSpec:
    """The GPU catalog entry for ``instance_type``.

    Raises:
        UnknownGpuInstanceTypeError: the type is not in the GPU catalog (the message lists the
            known ones).
    """
    try:
        return GPU_CATALOG[instance_type]
    except KeyError:
        raise UnknownGpuInstanceTypeError(instance_type, GPU_CATALOG) from None
