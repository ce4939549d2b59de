"""trnctl addons: pins checked against eks:DescribeAddonVersions (Stubber; moto lacks it)."""

from __future__ import annotations

from typing import Any

import pytest

from trn_catalog import versions
from trnctl import addons
from trnctl.preflight import Status


def answer(name: str, offered: list[str], default: str | None) -> dict[str, Any]:
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


@pytest.fixture
def eks(clients: Any, stub: Any) -> Any:
    def setup(overrides: dict[str, list[str]] | None = None) -> Any:
        stubber = stub(clients("eks"))
        for pin in versions.ADDONS:
            offered = (overrides or {}).get(pin.name) or [pin.version or "v9.9.9-eksbuild.1"]
            stubber.add_response(
                "describe_addon_versions",
                answer(pin.name, offered, offered[-1]),
                {"addonName": pin.name, "kubernetesVersion": "1.35"},
            )
        return stubber

    return setup


def test_pinned_versions_pass_and_unpinned_ones_warn_with_the_line_to_paste(
    trnctl: Any, eks: Any
) -> None:
    eks()
    result = trnctl("addons")
    assert result.exit_code == 0, result.output
    for pin in versions.ADDONS:
        line = next(line for line in result.stdout.splitlines() if f" {pin.name} " in line)
        if pin.version:
            assert "PASS" in line
        else:
            assert "WARN" in line and f'AddonPin("{pin.name}", "v9.9.9-eksbuild.1"' in line


def test_a_pin_eks_does_not_offer_fails(trnctl: Any, eks: Any) -> None:
    eks({"vpc-cni": ["v1.22.0-eksbuild.1"]})
    result = trnctl("addons")
    assert result.exit_code == 1
    line = next(line for line in result.stdout.splitlines() if " vpc-cni " in line)
    assert "FAIL" in line and "v1.21.1-eksbuild.1 is not offered" in line


def test_check_rules() -> None:
    pin = versions.AddonPin("coredns", "v1.13.2-eksbuild.3", "test")
    offer = addons.Offered(("v1.13.2-eksbuild.3", "v1.13.3-eksbuild.1"), "v1.13.3-eksbuild.1")
    result = addons.check(pin, offer, "1.35")
    assert result.status is Status.PASS and "EKS default: v1.13.3-eksbuild.1" in result.detail
    empty = addons.check(pin, addons.Offered((), None), "1.35")
    assert empty.status is Status.FAIL and "offers no version" in empty.detail


def test_access_denied_is_one_line(trnctl: Any, clients: Any, stub: Any) -> None:
    stub(clients("eks")).add_client_error(
        "describe_addon_versions", service_error_code="AccessDeniedException", http_status_code=403
    )
    result = trnctl("addons")
    assert result.exit_code == 3
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
