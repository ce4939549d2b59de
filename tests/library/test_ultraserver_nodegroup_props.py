"""NeuronCluster.add_ultraserver_nodegroups refuses what an UltraServer block decides or does not
allow, before building anything (the groups themselves: tests/infra/test_ultraserver_nodegroups)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from constructs_lib import NeuronCluster

A = "cr-0123456789abcdef2"


def add(ultraserver_type: str, ids: list[str], **props: Any) -> Any:
    # The refusals come before the cluster is touched: a stand-in that has nothing.
    return NeuronCluster.add_ultraserver_nodegroups(
        SimpleNamespace(),  # type: ignore[arg-type]
        ultraserver_type,
        ids,
        subnet=SimpleNamespace(),
        **props,
    )


@pytest.mark.parametrize(
    ("kind", "ids", "props", "message"),
    [
        ("u-trn3x64", [A], {}, r"ultraserver_type: UltraServer type 'u-trn3x64' is not confirmed"),
        ("u-trn2x64", [], {}, r"reservation_ids: at least one UltraServer block is needed"),
        (
            "u-trn2x64",
            [A, "cr-1"],
            {},
            r"reservation_ids: \['cr-1'\] are not capacity reservation ids",
        ),
        ("u-trn2x64", [A, A], {}, rf"reservation_ids: \['{A}'\] are listed twice"),
        (
            "u-trn2x64",
            [A],
            {"desired_size": 2, "capacity": "on-demand"},
            r"capacity, desired_size: not allowed; each UltraServer block's node group takes "
            r"the type's instance type and servers \(trn2u\.48xlarge, 4\)",
        ),
        (
            "u-trn2x64",
            [A],
            {"efa_security_group": object()},
            r"efa_security_group: not allowed; .* uses the cluster's shared EFA security group",
        ),
    ],
)
def test_refusals_name_the_argument_and_value(
    kind: str, ids: list[str], props: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        add(kind, ids, **props)
