"""The DRA objects (ResourceClaimTemplates, runtimes whose pods claim devices) conform strictly to
Kubernetes 1.35's resource.k8s.io/v1, and the older request shape fails there."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
from kube_objects import manifests, problems

from tests.conftest import Synth


def claim_templates(synth: Synth) -> list[dict[str, Any]]:
    return [
        dict(a.obj) for a in manifests(synth.templates) if a.obj["kind"] == "ResourceClaimTemplate"
    ]


def test_the_claim_templates_conform_to_resource_k8s_io_v1(
    synth_variant: Callable[[str], Synth],
) -> None:
    templates = claim_templates(synth_variant("dra"))

    assert len(templates) == 6
    assert {t["apiVersion"] for t in templates} == {"resource.k8s.io/v1"}
    assert [problems(t) for t in templates] == [[]] * 6


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # v1beta1's shape: the device class directly on the request, not under `exactly`.
        (
            lambda d: d["requests"][0].update(deviceClassName="neuron.aws.com"),
            r"'deviceClassName' was unexpected",
        ),
        # An invented constraint field beside matchAttribute.
        (
            lambda d: d["constraints"][0].update(matchGroup="x"),
            r"'matchGroup' was unexpected",
        ),
        (lambda d: d["requests"][0]["exactly"].update(count="16"), r"'16' is not of type"),
    ],
)
def test_an_invented_or_older_field_fails(
    synth_variant: Callable[[str], Synth], change: Callable[[dict[str, Any]], None], message: str
) -> None:
    template = copy.deepcopy(claim_templates(synth_variant("dra"))[0])
    change(template["spec"]["spec"]["devices"])

    found = problems(template)
    assert any(re.search(message, line) for line in found), found
