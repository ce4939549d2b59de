"""UltraServer Capacity Blocks (the `ultraserver` variant): one managed node group per block,
launched into it, labelled with the block's reservation id as its UltraServer's id."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import VARIANTS, Synth, synthesize
from tests.template_parts import scaling
from trn_catalog import ultraservers

pytestmark = pytest.mark.slow

BLOCKS = ("cr-0123456789abcdef2", "cr-0123456789abcdef3")


@pytest.fixture
def ultra(synth_variant: Callable[[str], Synth]) -> Synth:
    return synth_variant("ultraserver")


def trn_groups(synth: Synth) -> list[dict[str, Any]]:
    groups = synth.resources("cluster", "AWS::EKS::Nodegroup").values()
    return [
        g["Properties"]
        for g in groups
        if g["Properties"]["Labels"]["trn-platform/node-type"] == "trainium"
    ]


def launch_data(synth: Synth, reservation_id: str) -> dict[str, Any]:
    (data,) = [
        t["Properties"]["LaunchTemplateData"]
        for t in synth.resources("cluster", "AWS::EC2::LaunchTemplate").values()
        if t["Properties"]["LaunchTemplateData"]
        .get("CapacityReservationSpecification", {})
        .get("CapacityReservationTarget", {})
        .get("CapacityReservationId")
        == reservation_id
    ]
    return data


def test_each_block_is_a_capacity_block_group_of_one_ultraserver(ultra: Synth) -> None:
    groups = trn_groups(ultra)

    assert [g["Labels"][ultraservers.ULTRASERVER_ID_LABEL] for g in groups] == list(BLOCKS)
    ids = {
        g["Properties"]["Labels"][ultraservers.ULTRASERVER_ID_LABEL]: i
        for i, g in ultra.resources("cluster", "AWS::EKS::Nodegroup").items()
        if ultraservers.ULTRASERVER_ID_LABEL in g["Properties"]["Labels"]
    }
    for group in groups:
        assert group["CapacityType"] == "CAPACITY_BLOCK"
        block = group["Labels"][ultraservers.ULTRASERVER_ID_LABEL]
        assert scaling(ultra.template("cluster"), ids[block]) == {
            "desiredSize": 4,
            "maxSize": 4,
            "minSize": 0,
        }
        assert group["Labels"][ultraservers.ULTRASERVER_TYPE_LABEL] == "u-trn2x64"
        assert group["Labels"]["trn-platform/devices"] == "plugin"
    for block in BLOCKS:
        data = launch_data(ultra, block)
        assert data["InstanceType"] == "trn2u.48xlarge"
        assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
        assert "Placement" not in data


def test_the_groups_share_one_node_role_and_one_efa_security_group_of_the_cluster(
    ultra: Synth,
) -> None:
    first, second = trn_groups(ultra)
    assert first["NodeRole"] == second["NodeRole"]
    assert "UltraServerNodeRole" in first["NodeRole"]["Fn::GetAtt"][0]
    (shared,) = [
        key
        for key in ultra.resources("cluster", "AWS::EC2::SecurityGroup")
        if "UltraServerEfaSecurityGroup" in key
    ]
    for block in BLOCKS:
        for interface in launch_data(ultra, block)["NetworkInterfaces"]:
            assert {"Fn::GetAtt": [shared, "GroupId"]} in interface["Groups"]
            # Instead of a group of each block's own: the shared EFA group, the cluster's and
            # the Lustre clients', within EC2's default of 5 groups per interface.
            assert len(interface["Groups"]) == 3
    # No EFA group of a block's own is made at all.
    efa_groups = [
        key for key in ultra.resources("cluster", "AWS::EC2::SecurityGroup") if "Efa" in key
    ]
    assert efa_groups == [shared]


def block_resources(synth: Synth, reservation_id: str) -> dict[str, Any]:
    """The node group and launch template of one block's group, by logical id."""
    resources = synth.template("cluster")["Resources"]
    block = reservation_id.replace("-", "")
    return {key: value for key, value in resources.items() if f"UltraServer{block}" in key}


def test_dropping_a_block_leaves_the_other_blocks_group_as_it_was(
    ultra: Synth, tmp_path: Path
) -> None:
    """A block that ended comes off the list; the group of a block still running must not be
    replaced (its nodes would be recycled) because of it."""
    second_only = {**VARIANTS["ultraserver"], "ultraserver_reservation_ids": BLOCKS[1]}
    after = synthesize(second_only, tmp_path)

    kept = block_resources(after, BLOCKS[1])
    assert {t["Type"] for t in kept.values()} >= {"AWS::EKS::Nodegroup", "AWS::EC2::LaunchTemplate"}
    assert kept == block_resources(ultra, BLOCKS[1])
    assert block_resources(after, BLOCKS[0]) == {}


def test_the_outputs_name_the_ultraservers(ultra: Synth) -> None:
    (parameter,) = ultra.resources("workloads", "AWS::SSM::Parameter").values()
    text = json.dumps(parameter["Properties"]["Value"])

    assert '\\"ultraserver_type\\":\\"u-trn2x64\\"' in text
    assert f'\\"ultraserver_ids\\":\\"{",".join(BLOCKS)}\\"' in text
    assert '\\"trn_nodes\\":8' in text
    outputs = ultra.template("workloads")["Outputs"]
    assert outputs["UltraserverIds"]["Value"] == ",".join(BLOCKS)


def test_an_environment_without_blocks_writes_no_ultraserver_keys(dev: Synth) -> None:
    text = json.dumps(dev.template("workloads"))

    assert "ultraserver" not in text.lower()
    assert len(trn_groups(dev)) == 1
    assert ultraservers.ULTRASERVER_ID_LABEL not in trn_groups(dev)[0]["Labels"]
