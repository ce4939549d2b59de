"""Cost allocation tags: every instance and volume the platform launches (trn, GPU and system
node groups, through their launch templates) carries the environment's tag and, where set, the
project's, which the environment's budget and the Cost and Usage Report group by."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import Synth
from tests.template_parts import of_type
from trn_catalog.outputs import TAG_ENVIRONMENT, TAG_PREVIEW, TAG_PROJECT


def _instance_tags(synth: Synth) -> list[dict[str, str]]:
    found = []
    for template in synth.templates.values():
        for resource in of_type(template, "AWS::EC2::LaunchTemplate"):
            specs = resource["Properties"]["LaunchTemplateData"]["TagSpecifications"]
            by_type = {s["ResourceType"]: {t["Key"]: t["Value"] for t in s["Tags"]} for s in specs}
            assert by_type["instance"] == by_type["volume"]
            found.append(by_type["instance"])
    return found


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        ("dev", {TAG_ENVIRONMENT: "trn-dev"}),
        ("prod", {TAG_ENVIRONMENT: "trn-prod", TAG_PROJECT: "nlp"}),
        ("preview", {TAG_ENVIRONMENT: "trn-pv-alpha", TAG_PREVIEW: "alpha"}),
        ("gpu", {TAG_ENVIRONMENT: "trn-dev"}),
    ],
)
def test_every_instance_carries_the_cost_allocation_tags(
    synth_variant: Callable[[str], Synth], variant: str, expected: dict[str, str]
) -> None:
    tags = _instance_tags(synth_variant(variant))
    assert len(tags) >= 2  # the system group and the trn group (and the GPU group)
    for instance in tags:
        assert {k: instance.get(k) for k in expected} == expected
    if variant != "prod":
        assert all(TAG_PROJECT not in t for t in tags)
