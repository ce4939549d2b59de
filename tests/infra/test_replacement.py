"""Redeploys that replace the Trainium node group: a new name each time, found by trnctl."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import VARIANTS, Synth, synthesize
from trn_catalog.outputs import EnvironmentOutputs


def trn_nodegroup(synth: Synth) -> dict[str, Any]:
    (group,) = [
        g["Properties"]
        for g in synth.resources("cluster", "AWS::EKS::Nodegroup").values()
        if g["Properties"]["AmiType"] == "AL2023_x86_64_NEURON"
    ]
    return group


def published_outputs(synth: Synth) -> EnvironmentOutputs:
    """The outputs parameter trnctl reads, as the workloads template writes it."""
    (parameter,) = synth.resources("workloads", "AWS::SSM::Parameter").values()
    value = parameter["Properties"]["Value"]
    parts = value["Fn::Join"][1] if isinstance(value, dict) else [value]
    # References (bucket names, the cluster name) sit inside JSON strings: stand-ins will do.
    return EnvironmentOutputs.from_json("".join(p if isinstance(p, str) else "X" for p in parts))


def test_trnctl_finds_the_node_group_by_a_name_known_at_synth(dev: Synth) -> None:
    name = trn_nodegroup(dev)["NodegroupName"]
    assert published_outputs(dev).trn_nodegroup == name
    # No export carries it: an export in use would block the replacement of the node group.
    exports = json.dumps(dev.template("cluster").get("Outputs", {}))
    assert name not in exports and "Nodegroup" not in exports


def test_a_new_capacity_block_makes_a_new_node_group(
    synth_variant: Callable[[str], Synth], tmp_path: Path
) -> None:
    """EKS updates a Capacity Block group only at desired size 0; the next block gets a new
    group instead, which launches its nodes when that block starts."""
    first = synth_variant("capacity-block")
    next_block = {**VARIANTS["capacity-block"], "capacity_reservation_id": "cr-0123456789abcdef9"}
    second = synthesize(next_block, tmp_path)
    old, new = trn_nodegroup(first), trn_nodegroup(second)
    assert old["NodegroupName"] != new["NodegroupName"]
    assert published_outputs(second).trn_nodegroup == new["NodegroupName"]
    # Same logical ids: CloudFormation replaces the group (create, then delete the old one).
    assert set(first.template("cluster")["Resources"]) == set(
        second.template("cluster")["Resources"]
    )


def test_moving_the_trn_subnet_replaces_the_node_group_under_a_new_name(
    dev: Synth, tmp_path: Path
) -> None:
    """The trn subnet keeps its logical id in another zone: CloudFormation replaces the subnet,
    then the node group, which must not keep its name."""
    moved = synthesize({"availability_zone": "us-east-2b"}, tmp_path)
    assert trn_nodegroup(moved)["Subnets"] == trn_nodegroup(dev)["Subnets"]
    assert moved.platform.network.network.trn_subnet.availability_zone == "us-east-2b"
    assert trn_nodegroup(moved)["NodegroupName"] != trn_nodegroup(dev)["NodegroupName"]
