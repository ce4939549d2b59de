"""trn_catalog.ultraservers: only confirmed UltraServer types, each fact with its source."""

from __future__ import annotations

import pytest

import trn_catalog
from trn_catalog import ultraservers


def test_the_trn2_ultraserver_is_four_trn2u_servers_of_sixteen_chips() -> None:
    spec = ultraservers.get("u-trn2x64")

    assert (spec.instance_type, spec.servers, spec.chips) == ("trn2u.48xlarge", 4, 64)
    member = trn_catalog.get(spec.instance_type)
    assert spec.chips_per_server == member.chips == 16
    assert "four trn2u.48xlarge instances, 64 Trainium2 chips" in spec.source_of("servers")


def test_every_entry_cites_a_source_for_each_fact_and_its_members_are_catalog_types() -> None:
    for spec in ultraservers.ULTRASERVERS.values():
        assert set(spec.sources) == {"name", "instance_type", "servers", "chips"}
        assert all(key in ultraservers.SOURCES for key in spec.sources.values())
        assert spec.servers * trn_catalog.get(spec.instance_type).chips == spec.chips


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "u-trn3x64",
            r"UltraServer type 'u-trn3x64' is not confirmed: Trn3 UltraServers \(Gen1: 4 servers "
            r"x 16 chips; Gen2: 36 servers x 4 chips\) have no EC2 UltraserverType name.*"
            r"trn3p\.48xlarge\); confirmed: u-trn2x64",
        ),
        ("trn3.48xlarge", r"'trn3.48xlarge' is not confirmed: Trn3 UltraServers"),
        (
            "u-trn2x128",
            r"UltraServer type 'u-trn2x128' is not one a source confirms \(its EC2 name, member "
            r"instance type, servers and chips\); confirmed: u-trn2x64",
        ),
    ],
)
def test_unconfirmed_types_are_refused_with_the_reason(name: str, message: str) -> None:
    with pytest.raises(ultraservers.UnconfirmedUltraServerError, match=message):
        ultraservers.get(name)


def test_member_lookup() -> None:
    assert ultraservers.for_instance_type("trn2u.48xlarge") == ultraservers.get("u-trn2x64")
    assert ultraservers.for_instance_type("trn2.48xlarge") is None
