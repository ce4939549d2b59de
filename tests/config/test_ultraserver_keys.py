"""The `ultraserver_reservation_ids` context key: UltraServer Capacity Blocks, one node group
each; refusals name the key, the value and what is allowed."""

from __future__ import annotations

from typing import Any

import pytest

from platform_config import ConfigError, parse_config

A, B = "cr-0123456789abcdef2", "cr-0123456789abcdef3"


def parse(**context: Any) -> Any:
    return parse_config({"instance_type": "trn2u.48xlarge", **context})


@pytest.mark.parametrize("ids", [f"{A},{B}", f" {A} , {B} ", [A, B]])
def test_blocks_from_the_command_line_or_cdk_json(ids: Any) -> None:
    trn = parse(ultraserver_reservation_ids=ids).trn

    assert trn.ultraserver_reservation_ids == (A, B)
    assert trn.ultraserver is not None and trn.ultraserver.name == "u-trn2x64"
    # Each UltraServer's four servers, launched into its block.
    assert (trn.nodes, trn.capacity, trn.capacity_reservation_id) == (8, "capacity-block", None)


def test_without_the_key_there_are_no_ultraservers() -> None:
    trn = parse_config({}).trn

    assert trn.ultraserver_reservation_ids == ()
    assert trn.ultraserver is None


@pytest.mark.parametrize(
    ("context", "message"),
    [
        (
            {"ultraserver_reservation_ids": f"{A},cr-123"},
            r"ultraserver_reservation_ids: \['cr-123'\] is not allowed; each must be a capacity "
            r"reservation id: 'cr-' and 17 hexadecimal digits",
        ),
        (
            {"ultraserver_reservation_ids": f"{A},{A}"},
            rf"ultraserver_reservation_ids: \['{A}'\] is not allowed; each UltraServer block is "
            "listed once",
        ),
        (
            {"ultraserver_reservation_ids": " , "},
            r"ultraserver_reservation_ids: ' , ' is not allowed; expected 1 to 64 UltraServer "
            r"blocks \(Capacity Blocks hold at most 256 instances in all\)",
        ),
        (
            {"ultraserver_reservation_ids": ",".join(f"cr-{n:017x}" for n in range(65))},
            r"ultraserver_reservation_ids: .* expected 1 to 64 UltraServer blocks",
        ),
        (
            {"ultraserver_reservation_ids": {"a": 1}},
            r"ultraserver_reservation_ids: \{'a': 1\} is not allowed; expected reservation ids "
            r"separated by commas, or a JSON list",
        ),
        (
            {"ultraserver_reservation_ids": A, "instance_type": "trn2.48xlarge"},
            r"instance_type: 'trn2.48xlarge' is not allowed; UltraServer blocks "
            r"\(ultraserver_reservation_ids\) need the member type of a confirmed UltraServer: "
            r"trn2u.48xlarge \(u-trn2x64\)",
        ),
        (
            {"ultraserver_reservation_ids": A, "instance_type": "trn3.48xlarge"},
            r"instance_type: 'trn3.48xlarge' is not allowed; UltraServer blocks",
        ),
        (
            {"ultraserver_reservation_ids": A, "trn_nodes": "4"},
            r"trn_nodes: '4' is not allowed; not used with ultraserver_reservation_ids: each "
            r"UltraServer block is its own node group",
        ),
        (
            {
                "ultraserver_reservation_ids": A,
                "capacity": "capacity-block",
                "capacity_reservation_id": B,
            },
            r"capacity: 'capacity-block' is not allowed; not used with ultraserver_reservation_ids"
            r"(.|\n)*capacity_reservation_id: '.*' is not allowed; not used with "
            r"ultraserver_reservation_ids",
        ),
    ],
)
def test_bad_blocks_are_refused_naming_the_key_and_value(
    context: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(**context)
