"""How `make test` spreads the suite over its xdist workers (pytest-xdist, ``--dist loadgroup
--no-loadscope-reorder``): tests that share one expensive launch run on one worker, and the
expensive tests start first, so that no worker ends the run alone on a long test.

- ``pytest.mark.xdist_group(NAME)``: every test of NAME runs on one worker, which then runs the
  group's session or module fixtures once. pytest 9.2 keeps node ids in a structure that
  pytest-xdist 3.8 no longer rewrites (pytest-dev/pytest-xdist#1386: the group is silently
  ignored, each worker runs the shared launch again); :func:`group` does the rewrite itself.
- ``pytest.mark.slow``: a test that costs seconds of CPU (a training process, a torchrun launch,
  a scanner). Workers collect these first; without reordering, xdist hands out work in
  collection order.
"""

from __future__ import annotations

import pytest

try:  # pytest >= 9.2
    from _pytest.nodeid import NodeId
except ImportError:  # older pytest: pytest-xdist's own rewrite works
    NodeId = None  # type: ignore[assignment,misc]


def group_of(item: pytest.Item) -> str | None:
    """The xdist group name pytest-xdist gives ``item`` (names joined, sorted), or None."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) if names else None


def group(items: list[pytest.Item]) -> None:
    """Appends ``@GROUP`` to the node id of each grouped item where pytest-xdist could not:
    LoadGroupScheduling reads the group from that suffix."""
    for item in items:
        name = group_of(item)
        if name is None or item.nodeid.endswith(f"@{name}") or NodeId is None:
            continue
        item._id = NodeId.parse(f"{item.nodeid}@{name}")


def early(items: list[pytest.Item]) -> list[bool]:
    """For each item: whether it is slow or in a group with a slow test."""
    slow_groups = {group_of(i) for i in items if i.get_closest_marker("slow")} - {None}
    return [bool(i.get_closest_marker("slow")) or group_of(i) in slow_groups for i in items]


def slow_first(items: list[pytest.Item]) -> None:
    """Slow tests, and every test of a group that has one, before the rest; otherwise the
    collection order."""
    order = {id(item): not first for item, first in zip(items, early(items), strict=True)}
    items.sort(key=lambda item: order[id(item)])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Only on xdist workers: in one process, moving tests between modules would set their
    # module fixtures up again.
    if not hasattr(config, "workerinput"):
        return
    if config.getvalue("loadgroup"):
        group(items)
    slow_first(items)
