"""The GPU catalog: its own table, each fact sourced, the EFA layout EC2 documents per type."""

import pytest

import trn_catalog
from trn_catalog import CATALOG, GPU_CATALOG, UnknownGpuInstanceTypeError, get_gpu
from trn_catalog.gpu_instances import GPU_FACT_FIELDS, GPU_SOURCES

REQUIRED_TYPES = ("p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "g6e.48xlarge")


def test_lists_every_required_type_and_stays_apart_from_the_trainium_catalog() -> None:
    assert set(REQUIRED_TYPES) <= set(GPU_CATALOG)
    assert not set(GPU_CATALOG) & set(CATALOG)
    assert all(name.startswith("trn") for name in CATALOG)


@pytest.mark.parametrize("name", sorted(GPU_CATALOG))
def test_every_fact_has_a_known_source(name: str) -> None:
    spec = GPU_CATALOG[name]
    assert set(spec.sources) == set(GPU_FACT_FIELDS)
    for fact in GPU_FACT_FIELDS:
        assert spec.sources[fact] in GPU_SOURCES, (name, fact)
    assert spec.unverified <= set(GPU_FACT_FIELDS)


@pytest.mark.parametrize(
    ("name", "gpus", "gpu_gib", "cards", "interfaces", "efa", "tflops"),
    [
        # EC2 accelerated computing specifications; NVIDIA datasheets, BF16 dense.
        ("p5.48xlarge", 8, 640, 32, 64, 32, 989.5),
        ("p5en.48xlarge", 8, 1128, 16, 64, 16, 989.5),
        ("p6-b200.48xlarge", 8, 1432, 8, 32, 8, 2250.0),
        ("g6e.48xlarge", 8, 352, 4, 40, 4, 362.05),
    ],
)
def test_sourced_facts(
    name: str, gpus: int, gpu_gib: int, cards: int, interfaces: int, efa: int, tflops: float
) -> None:
    spec = get_gpu(name)
    assert (spec.gpus, spec.gpu_memory_gib, spec.network_cards) == (gpus, gpu_gib, cards)
    assert (spec.max_network_interfaces, spec.efa_interfaces) == (interfaces, efa)
    assert spec.bf16_tflops_per_gpu == tflops
    assert spec.peak_bf16_tflops == gpus * tflops
    assert spec.multi_node_efa
    # RDMA read/write as the EC2 EFA guide lists it; unlisted types (g6e) leave it to libfabric.
    assert spec.efa_rdma == (name != "g6e.48xlarge")


@pytest.mark.parametrize("name", sorted(GPU_CATALOG))
def test_efa_layout_is_ec2s_use_case_1(name: str) -> None:
    spec = get_gpu(name)
    layout = spec.efa_layout()
    # The ENA primary, then one EFA device per network card.
    assert layout[0] == (0, 0, "interface")
    efa = [entry for entry in layout if entry[2] == "efa-only"]
    assert len(efa) == spec.efa_interfaces
    assert sorted(card for card, _, _ in efa) == list(range(spec.network_cards))
    assert (0, 1, "efa-only") in efa
    assert all(device == 0 for card, device, _ in efa if card > 0)
    # No card takes more interfaces than it has.
    assert spec.interfaces_per_card >= 2


def test_p6_b200_layout_as_documented() -> None:
    assert get_gpu("p6-b200.48xlarge").efa_layout() == (
        (0, 0, "interface"),
        (0, 1, "efa-only"),
        *((card, 0, "efa-only") for card in range(1, 8)),
    )


def test_unknown_gpu_type_error_lists_the_known_types() -> None:
    with pytest.raises(UnknownGpuInstanceTypeError, match=r"'p4d\.24xlarge'.*known: p5\.48xlarge"):
        trn_catalog.get_gpu("p4d.24xlarge")
    with pytest.raises(UnknownGpuInstanceTypeError, match="GPU instance catalog"):
        trn_catalog.get_gpu("trn2.48xlarge")


def test_one_except_clause_catches_an_unknown_type_of_either_catalog() -> None:
    with pytest.raises(trn_catalog.UnknownInstanceTypeError, match="not in the GPU instance"):
        trn_catalog.get_gpu("trn2.48xlarge")
    with pytest.raises(trn_catalog.UnknownInstanceTypeError, match="not in the instance catalog"):
        trn_catalog.get("p5.48xlarge")
