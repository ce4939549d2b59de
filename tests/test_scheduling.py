"""The suite's own distribution over xdist workers (tests/scheduling.py), checked from inside a
run: under `make test` a grouped test carries its group where xdist reads it, and the workers
collect the slow tests first."""

from __future__ import annotations

import pytest

from tests.scheduling import early


def _loadgroup_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput") and bool(config.getvalue("loadgroup"))


@pytest.mark.xdist_group("scheduling")
def test_a_grouped_test_carries_its_group_in_its_node_id(request: pytest.FixtureRequest) -> None:
    """xdist's LoadGroupScheduling groups by the ``@GROUP`` suffix of the node id; without it
    each worker would run a group's shared launch again."""
    grouped = request.node.nodeid.endswith("@scheduling")
    assert grouped == _loadgroup_worker(request.config), request.node.nodeid


def test_workers_collect_the_slow_tests_first(request: pytest.FixtureRequest) -> None:
    """Under xdist, without reordering, the work goes out in the workers' collection order."""
    first = early(request.session.items)
    if hasattr(request.config, "workerinput"):
        assert first == sorted(first, reverse=True), first
