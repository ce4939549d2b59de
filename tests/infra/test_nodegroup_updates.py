"""Redeploys CloudFormation accepts: no node group update changes its launch template version
together with any other property.

CloudFormation refuses such an AWS::EKS::Nodegroup update: "Version and ReleaseVersion updates
cannot be combined with other updates" (aws/containers-roadmap#1258); a change of the stack's
tags counts as another change (aws/aws-cdk#16644, eksctl-io/eksctl#2565 and its fix #2708). Each
test synthesizes an environment twice with different context and checks every node group the
two templates share: either CloudFormation replaces it (a create-only property, its name among
them, changed) or, when its launch template changed, nothing else of it and no stack tag did.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from constructs_lib.trainium_nodegroup import REPLACING_PROPERTIES
from tests.conftest import VARIANTS, Synth, context_with, synthesize

RESERVATION = "cr-0123456789abcdef7"
# Context changes that touch a node group, beside the shared variants (tests/conftest.py): LNC
# with a new size (labels, user data and scaling at once), another type, GPU groups changed
# together with the trn group's LNC or with their own reservation, and a project added later
# (its tag goes on every node group, on the stacks and into each launch template's instance
# and volume tags).
CHANGED: dict[str, dict[str, str]] = {
    "lnc-and-size": {"lnc": "1", "trn_nodes": "4"},
    "project": {"project": "nlp"},
    "trn2": {"instance_type": "trn2.48xlarge"},
    "gpu-and-lnc": {"gpu_instance_type": "p5.48xlarge", "gpu_nodes": "1", "lnc": "1"},
    "gpu-odcr": {
        "gpu_instance_type": "p5.48xlarge",
        "gpu_nodes": "2",
        "gpu_capacity": "odcr",
        "gpu_capacity_reservation_id": RESERVATION,
    },
}
# The shared variants of the same environment (trn-dev) in the trn AZ us-east-2a: going from one
# to another changes each key either sets, several node-group keys at once (instance type,
# capacity mode and reservation, LNC, devices, GPU group, size).
SHARED = ("dev", "efa-fsx", "capacity-block", "odcr", "gpu", "dra")
PAIRS = list(itertools.combinations([*SHARED, *CHANGED], 2))


def refused_updates(before: Synth, after: Synth) -> list[str]:
    """The node groups of the cluster stack that CloudFormation would update with a new launch
    template version and another change at once, each with what else changed."""
    return _refused(
        before.template("cluster"),
        after.template("cluster"),
        tags_changed=_stack_tags(before) != _stack_tags(after),
    )


def _refused(old: dict[str, Any], new: dict[str, Any], *, tags_changed: bool) -> list[str]:
    found = []
    for logical_id in sorted(_nodegroups(old).keys() & _nodegroups(new).keys()):
        was, now = _nodegroups(old)[logical_id], _nodegroups(new)[logical_id]
        if any(was.get(p) != now.get(p) for p in (*REPLACING_PROPERTIES, "NodegroupName")):
            continue  # replaced: a new resource, nothing updated
        if _launch_data(old, was) == _launch_data(new, now):
            continue  # same version: a config or tag update, which CloudFormation takes
        others = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
        if others or tags_changed:
            found.append(f"{logical_id}: {others + (['stack tags'] if tags_changed else [])}")
    return found


def _nodegroups(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        logical_id: resource["Properties"]
        for logical_id, resource in template["Resources"].items()
        if resource["Type"] == "AWS::EKS::Nodegroup"
    }


def _launch_data(template: dict[str, Any], group: dict[str, Any]) -> Any:
    resource = template["Resources"][group["LaunchTemplate"]["Id"]["Ref"]]
    return resource["Properties"]["LaunchTemplateData"]


def _stack_tags(synth: Synth) -> Any:
    (name,) = [n for n in synth.templates if n.endswith("-cluster")]
    return synth.manifest()["artifacts"][name]["properties"].get("tags")


@pytest.fixture(scope="module")
def variant(
    synth_variant: Callable[[str], Synth], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Synth]]:
    made: dict[str, Synth] = {}

    def get(name: str) -> Synth:
        if name in VARIANTS:
            return synth_variant(name)
        if name not in made:
            made[name] = synthesize(CHANGED[name], tmp_path_factory.mktemp(f"cdk-{name}"))
        return made[name]

    yield get


@pytest.mark.parametrize(("before", "after"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_no_redeploy_updates_a_launch_template_version_with_anything_else(
    variant: Callable[[str], Synth], before: str, after: str
) -> None:
    assert refused_updates(variant(before), variant(after)) == []
    assert refused_updates(variant(after), variant(before)) == []


def test_a_preview_redeployed_later_with_a_new_lnc_replaces_its_group(
    synth_variant: Callable[[str], Synth], tmp_path: Path
) -> None:
    """A preview's expiry tag moves at every deploy, so each of its launch template changes
    comes with a stack-tag change."""
    from app import build_app

    first = synth_variant("preview")
    later = datetime.now(UTC) + timedelta(hours=2)
    app, platform = build_app(
        context_with({**VARIANTS["preview"], "lnc": "1"}), str(tmp_path), now=later
    )
    app.synth()
    second = Synth(outdir=tmp_path, app=app, platform=platform)
    for path in sorted(tmp_path.glob("*.template.json")):
        second.templates[path.name.removesuffix(".template.json")] = json.loads(path.read_text())

    assert _stack_tags(first) != _stack_tags(second)
    assert refused_updates(first, second) == []
    groups = _nodegroups(second.template("cluster")).values()
    (trn,) = [g for g in groups if g["AmiType"].endswith("NEURON")]
    assert trn["NodegroupName"] not in json.dumps(first.template("cluster"))


def test_the_rule_finds_what_cloudformation_refuses(variant: Callable[[str], Synth]) -> None:
    """The check itself: a group whose launch template and labels change under one name."""
    old = json.loads(json.dumps(variant("dev").template("cluster")))
    new = variant("lnc-and-size").template("cluster")
    (logical_id,) = [i for i, g in _nodegroups(new).items() if g["AmiType"].endswith("NEURON")]
    old["Resources"][logical_id]["Properties"]["NodegroupName"] = _nodegroups(new)[logical_id][
        "NodegroupName"
    ]

    (refused,) = _refused(old, new, tags_changed=False)
    assert refused == f"{logical_id}: ['Labels']"
    assert _refused(new, new, tags_changed=True) == []
