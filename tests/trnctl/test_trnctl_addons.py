"""trnctl addons: pins, configuration and Pod Identity checked against eks:DescribeAddonVersions
and eks:DescribeAddonConfiguration (Stubber; moto implements neither)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trn_catalog import versions
from trnctl import addons
from trnctl.preflight import Status

# A schema in the shape EKS returns for the CSI drivers and the node monitoring agent: a closed
# object per component.
NODE_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "node": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"tolerateAllTaints": {"type": "boolean"}},
        },
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "dcgmAgent": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "tolerations": {"type": "array", "items": {"type": "object"}},
                "resources": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"requests": {"type": "object"}, "limits": {"type": "object"}},
                },
            },
        },
        # The CloudWatch observability add-on's keys the platform sets (the chart's values).
        "agent": {"type": "object", "properties": {"config": {"type": "object"}}},
        "neuronMonitor": {"type": "object", "properties": {"affinity": {"type": "object"}}},
    },
}


def versions_answer(name: str, offered: list[str], default: str | None) -> dict[str, Any]:
    return {
        "addons": [
            {
                "addonName": name,
                "addonVersions": [
                    {
                        "addonVersion": version,
                        "compatibilities": [
                            {"clusterVersion": "1.35", "defaultVersion": version == default}
                        ],
                    }
                    for version in offered
                ],
            }
        ]
        if offered
        else []
    }


def configuration_answer(
    pin: versions.AddonPin, schema: dict[str, Any], account: str | None
) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "addonName": pin.name,
        "addonVersion": pin.version,
        "configurationSchema": json.dumps(schema),
    }
    if account:
        answer["podIdentityConfiguration"] = [
            {"serviceAccount": account, "recommendedManagedPolicies": []}
        ]
    return answer


@pytest.fixture
def eks(clients: Any, stub: Any) -> Any:
    """Answers both calls for every pin; ``offered`` and ``accounts`` override per add-on."""

    def setup(
        offered: dict[str, list[str]] | None = None,
        accounts: dict[str, str] | None = None,
        schema: dict[str, Any] | None = None,
    ) -> Any:
        stubber = stub(clients("eks"))
        for pin in versions.ADDONS:
            versions_offered = (offered or {}).get(pin.name) or [pin.version]
            stubber.add_response(
                "describe_addon_versions",
                versions_answer(pin.name, versions_offered, versions_offered[-1]),
                {"addonName": pin.name, "kubernetesVersion": "1.35"},
            )
            if pin.version not in versions_offered:
                continue
            account = (accounts or {}).get(pin.name) or (
                pin.service_account[1] if pin.service_account else None
            )
            stubber.add_response(
                "describe_addon_configuration",
                configuration_answer(pin, schema or NODE_SCHEMA, account),
                {"addonName": pin.name, "addonVersion": pin.version},
            )
        return stubber

    return setup


def line_of(output: str, addon: str) -> str:
    return next(line for line in output.splitlines() if f" {addon} " in line)


def test_every_pin_passes_when_eks_agrees(trnctl: Any, eks: Any) -> None:
    stubber = eks()
    result = trnctl("addons")
    assert result.exit_code == 0, result.output
    for pin in versions.ADDONS:
        line = line_of(result.stdout, pin.name)
        assert "PASS" in line and pin.version in line and "configuration valid" in line
    stubber.assert_no_pending_responses()


def test_a_pin_eks_does_not_offer_fails_with_the_line_to_paste(trnctl: Any, eks: Any) -> None:
    eks(offered={"vpc-cni": ["v1.22.0-eksbuild.1"]})
    result = trnctl("addons")
    assert result.exit_code == 1
    line = line_of(result.stdout, "vpc-cni")
    assert "FAIL" in line and "v1.21.1-eksbuild.1 is not offered" in line
    assert 'AddonPin("vpc-cni", "v1.22.0-eksbuild.1"' in line


def test_configuration_the_schema_refuses_fails_naming_the_path(trnctl: Any, eks: Any) -> None:
    closed = {**NODE_SCHEMA, "properties": {"env": NODE_SCHEMA["properties"]["env"]}}
    eks(schema=closed)
    result = trnctl("addons")
    assert result.exit_code == 1
    line = line_of(result.stdout, "aws-mountpoint-s3-csi-driver")
    assert "FAIL" in line and "configuration at (root)" in line and "'node'" in line
    assert "PASS" in line_of(result.stdout, "coredns")


def test_a_service_account_eks_does_not_name_fails(trnctl: Any, eks: Any) -> None:
    eks(accounts={"aws-mountpoint-s3-csi-driver": "s3-csi-driver-controller-sa"})
    result = trnctl("addons")
    assert result.exit_code == 1
    line = line_of(result.stdout, "aws-mountpoint-s3-csi-driver")
    assert "Pod Identity goes on s3-csi-driver-sa" in line
    assert "s3-csi-driver-controller-sa" in line


def test_check_rules() -> None:
    pin = versions.AddonPin("coredns", "v1.13.2-eksbuild.3", "test")
    offer = addons.Offered(("v1.13.2-eksbuild.3", "v1.13.3-eksbuild.1"), "v1.13.3-eksbuild.1")
    config = addons.Configuration({}, ())
    result = addons.check(pin, offer, config, "1.35")
    assert result.status is Status.PASS and "EKS default: v1.13.3-eksbuild.1" in result.detail
    empty = addons.check(pin, addons.Offered((), None), None, "1.35")
    assert empty.status is Status.FAIL and "offers no version" in empty.detail
    typed = versions.AddonPin("x", "v1.0.0-eksbuild.1", "test", {"node": {"tolerateAllTaints": 1}})
    problems = addons.configuration_problems(typed, addons.Configuration(NODE_SCHEMA, ()))
    assert problems == ["configuration at node.tolerateAllTaints: 1 is not of type 'boolean'"]


def test_access_denied_is_one_line(trnctl: Any, clients: Any, stub: Any) -> None:
    stub(clients("eks")).add_client_error(
        "describe_addon_versions", service_error_code="AccessDeniedException", http_status_code=403
    )
    result = trnctl("addons")
    assert result.exit_code == 3
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
