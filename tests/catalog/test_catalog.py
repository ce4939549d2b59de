import ast
import gzip
import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

import trn_catalog
from tests.conftest import ROOT
from trn_catalog import (
    CATALOG,
    FACT_FIELDS,
    SOURCES,
    UnknownInstanceTypeError,
    fsx,
    neuron_stacks,
    versions,
)

REQUIRED_TYPES = (
    "trn1.32xlarge",
    "trn1n.32xlarge",
    "trn2.3xlarge",
    "trn2.48xlarge",
    "trn2u.48xlarge",
    "trn3.48xlarge",
)


def test_lists_every_required_type() -> None:
    assert set(REQUIRED_TYPES) <= set(CATALOG)


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_fact_has_a_known_source(name: str) -> None:
    spec = CATALOG[name]
    assert set(spec.sources) == set(FACT_FIELDS)
    for fact in FACT_FIELDS:
        assert spec.sources[fact] in SOURCES, (name, fact)
        assert spec.source_of(fact)


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_unverified_names_real_fields_and_assumed_facts_are_unverified(name: str) -> None:
    spec = CATALOG[name]
    assert spec.unverified <= {*FACT_FIELDS, "name"}
    for fact in FACT_FIELDS:
        if spec.sources[fact] in {"assumed", "derived"}:
            assert fact in spec.unverified, (name, fact)


@pytest.mark.parametrize(
    ("name", "efa", "cores", "device_gib"),
    [
        ("trn1.32xlarge", 8, 32, 512),
        ("trn1n.32xlarge", 16, 32, 512),
        ("trn2.48xlarge", 16, 128, 1536),
        ("trn2u.48xlarge", 16, 128, 1536),
        ("trn3.48xlarge", 16, 128, 2304),
    ],
)
def test_sourced_layouts(name: str, efa: int, cores: int, device_gib: int) -> None:
    spec = trn_catalog.get(name)
    assert (spec.efa_interfaces, spec.neuron_cores, spec.device_memory_gib) == (
        efa,
        cores,
        device_gib,
    )
    assert spec.multi_node_efa


def test_trn3_peak_flops_come_from_the_trainium3_figures() -> None:
    spec = trn_catalog.get("trn3.48xlarge")
    assert spec.bf16_tflops_per_chip == 671.0
    assert spec.fp8_tflops_per_chip == 2517.0
    assert spec.peak_bf16_tflops == 16 * 671.0
    assert "name" in spec.unverified and not spec.verified


def test_efa_interfaces_fit_the_network_cards() -> None:
    for spec in CATALOG.values():
        assert 1 <= spec.efa_interfaces <= spec.network_cards, spec.name


def _ec2_network_info() -> dict[str, dict[str, object]]:
    """EC2's DescribeInstanceTypes NetworkInfo per type, as moto bundles EC2's answer."""
    data = resources.files("moto.ec2.resources") / "instance_types.json.gz"
    types = json.loads(gzip.decompress(data.read_bytes()))
    return {name: spec["NetworkInfo"] for name, spec in types.items()}


def test_efa_counts_and_network_cards_are_ec2s() -> None:
    """Every type of both catalogs that EC2 describes (all but the unconfirmed trn3 names) has
    EC2's EFA interface count, network cards and network bandwidth."""
    ec2 = _ec2_network_info()
    specs = [*CATALOG.values(), *trn_catalog.GPU_CATALOG.values()]
    described = [s for s in specs if s.name in ec2]
    assert {s.name for s in specs} - {s.name for s in described} <= {
        name for name in CATALOG if name.startswith("trn3")
    }
    for spec in described:
        info = ec2[spec.name]
        assert info["EfaInfo"] == {"MaximumEfaInterfaces": spec.efa_interfaces}, spec.name
        assert info["MaximumNetworkCards"] == spec.network_cards, spec.name
        # "3200 Gigabit", or per card: "16x 200 Gigabit".
        performance = re.fullmatch(r"(?:(\d+)x )?(\d+) Gigabit", str(info["NetworkPerformance"]))
        assert performance, (spec.name, info["NetworkPerformance"])
        cards, gbps = performance.groups()
        assert int(cards or 1) * int(gbps) == spec.efa_gbps, spec.name


def test_unknown_type_error_lists_the_known_types() -> None:
    with pytest.raises(UnknownInstanceTypeError, match=r"'trn9\.1xlarge'.*known: trn1\.32xlarge"):
        trn_catalog.get("trn9.1xlarge")


def test_catalog_imports_nothing_beyond_the_standard_library() -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import trn_catalog\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'trn_catalog'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_fsx_rules() -> None:
    allowed = trn_catalog.fsx.storage_allowed
    assert allowed(1200) and allowed(2400) and allowed(4800)
    assert not allowed(0) and not allowed(1300) and not allowed(3600)
    assert trn_catalog.fsx.throughput_allowed(250)
    assert not trn_catalog.fsx.throughput_allowed(200)


def test_addon_lookup_names_what_is_pinned() -> None:
    assert versions.service_account("vpc-cni") == ("kube-system", "aws-node")
    with pytest.raises(KeyError, match="no pinned EKS add-on 'vpc_cni'; pinned: vpc-cni, "):
        versions.addon("vpc_cni")
    with pytest.raises(KeyError, match="'coredns' has no Pod Identity service account"):
        versions.service_account("coredns")


def test_fsx_efa_rules() -> None:
    assert fsx.efa_storage_allowed(9600, 500) and not fsx.efa_storage_allowed(4800, 500)
    assert not fsx.efa_storage_allowed(38400, 200)
    assert "multiple of 38400 GiB" in fsx.efa_storage_rule(125)
    assert [t for t in CATALOG if not fsx.efa_client_allowed(t)] == [
        t for t in CATALOG if t.startswith("trn2")
    ]


def test_neuron_stack_per_generation() -> None:
    assert neuron_stacks.default_stack("trn3.48xlarge") == "native"
    assert neuron_stacks.default_stack("trn1.32xlarge") == "xla"
    assert neuron_stacks.stack_problem("xla", "trn1.32xlarge") is None
    assert neuron_stacks.stack_problem("native", "trn2.48xlarge") is None
    problem = neuron_stacks.stack_problem("native", "trn1n.32xlarge")
    assert problem is not None and "Trainium1" in problem and "NEURON_STACK=xla" in problem
    assert "unknown" in (neuron_stacks.stack_problem("jax", "trn2.48xlarge") or "")


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant in ``path`` that is not a docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    ]


def test_trn3_names_live_in_the_catalog_only() -> None:
    """The trn3 names and layouts are not confirmed (platform-facts): code outside the catalog
    names them through it (``trn_catalog.DEFAULT_INSTANCE_TYPE``, ``trn_catalog.get``), so a
    rename is one edit there."""
    roots = ["app.py", "constructs_lib", "stacks", "platform_config", "trnctl", "training_image"]
    files = [ROOT / "app.py"] + [p for r in roots[1:] for p in sorted((ROOT / r).rglob("*.py"))]
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for path in files
        for line, text in _code_strings(path)
        if re.search(r"\btrn3[a-z]*\.[0-9]*x?large", text)
    ]
    assert found == []
    assert trn_catalog.DEFAULT_INSTANCE_TYPE in trn_catalog.CATALOG
