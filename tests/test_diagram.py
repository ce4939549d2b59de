"""docs/diagram.py: the architecture picture drawn from the synthesized assembly."""

import importlib.util
import re
import sys

from tests.conftest import ROOT, Synth

spec = importlib.util.spec_from_file_location("diagram", ROOT / "docs" / "diagram.py")
assert spec and spec.loader
diagram = importlib.util.module_from_spec(spec)
sys.modules["diagram"] = diagram
spec.loader.exec_module(diagram)


def edges(dot: str) -> set[tuple[str, str]]:
    return set(re.findall(r'"([^"]+)" -> "([^"]+)"', dot))


def test_every_stack_is_a_box_and_the_key_parts_are_drawn(dev: Synth) -> None:
    dot = diagram.graph(diagram.load(dev.outdir))
    for stack in dev.templates:
        assert f'label="{stack}"' in dot
    assert "trn3.48xlarge, 16 EFA" in dot
    assert "FSx for Lustre" in dot and "EKS cluster\\ntrn-dev" in dot
    assert "Helm chart\\nneuron 1.9.0" in dot
    assert "VPC endpoint\\necr.api" in dot and "VPC endpoint\\ns3" in dot


def test_references_become_edges_across_stacks(dev: Synth) -> None:
    found = edges(diagram.graph(diagram.load(dev.outdir)))
    stacks = {(s.split(".")[0], t.split(".")[0]) for s, t in found}
    assert ("trn-dev-data", "trn-dev-network") in stacks  # FSx through its subnet to the VPC
    assert ("trn-dev-cluster", "trn-dev-network") in stacks
    assert ("trn-dev-workloads", "trn-dev-data") in stacks
    assert not {("trn-dev-data", "trn-dev-cluster"), ("trn-dev-cluster", "trn-dev-data")} & stacks
    trn_template = next(s for s, t in found if "TrainiumLaunchTemplate" in s)
    assert any(
        t.endswith("PlacementGroup6D7622BF") or "PlacementGroup" in t
        for s, t in found
        if s == trn_template
    )
