"""A pipeline's time zone is refused where the Kubernetes API server would refuse the CronJob's
``spec.timeZone`` (kubernetes/kubernetes pkg/apis/batch/validation, validateTimeZone): each
``/``-separated part 1 to 14 of ``A-Za-z.-_0-9+``, none ``.``, ``..`` or starting with ``-``; not
``Local`` in any case; a zone the time zone database has. Where Python has no time zone data
(an image without tzdata), the form alone is checked, so that the controller still reads its
pipeline."""

from __future__ import annotations

import re

import pytest

from trn_catalog import pipelines
from trn_catalog.settings import SettingError

# Refused by the form, with or without time zone data.
BAD_FORM = ["", "Local", "LOCAL", "-x/y", "Europe//Berlin", "Europe/./Berlin", "../etc",
            "a" * 15, "Europe/Berlin ", "Etc/GMT+5:30"]  # fmt: skip


@pytest.mark.parametrize("zone", ["Etc/UTC", "UTC", "Europe/Berlin", "Etc/GMT+5",
                                  "America/Argentina/ComodRivadavia"])  # fmt: skip
def test_zones_of_the_database_are_taken(zone: str) -> None:
    assert pipelines.check_time_zone(zone) == zone


@pytest.mark.parametrize("zone", [*BAD_FORM, "Europe/Berlinn", "europe/berlin", "Mars/Olympus"])
def test_a_zone_the_api_server_refuses_is_refused_naming_the_field(zone: str) -> None:
    message = f"time_zone {zone!r} is not an IANA time zone name, e.g. Etc/UTC or Europe/Berlin"

    with pytest.raises(SettingError, match=re.escape(message)):
        pipelines.check_time_zone(zone)


@pytest.mark.parametrize("zone", BAD_FORM)
def test_without_time_zone_data_the_form_is_still_checked(
    zone: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipelines, "_known_time_zones", frozenset)

    with pytest.raises(SettingError, match="is not an IANA time zone name"):
        pipelines.check_time_zone(zone)
    assert pipelines.check_time_zone("Europe/Berlinn") == "Europe/Berlinn"
