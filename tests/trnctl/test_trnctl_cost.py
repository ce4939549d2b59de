"""trnctl cost and the catalog's price table; a Stubber for the Pricing API (moto lacks it)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from trn_catalog import prices
from trnctl import cost
from trnctl.errors import TrnctlError


def test_every_price_names_a_known_source_and_a_date() -> None:
    for price in prices.PRICES:
        assert price.source in prices.PRICE_SOURCES
        assert re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", price.as_of), price
        assert price.market in prices.MARKETS
        assert price.usd_per_hour > 0


def test_price_table_has_one_price_per_type_region_and_market() -> None:
    keys = [(p.instance_type, p.region, p.market) for p in prices.PRICES]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(
    ("args", "hours"),
    [((10.0, None, None), 10.0), ((None, 7.2e9, 100_000.0), 20.0)],
)
def test_run_hours(args: tuple[Any, Any, Any], hours: float) -> None:
    assert cost.run_hours(*args) == pytest.approx(hours)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((None, None, None), "give either --hours, or both --tokens and --tokens-per-s"),
        ((1.0, 1e9, None), "give either --hours, or both --tokens and --tokens-per-s"),
        ((None, 1e9, None), "give either --hours, or both --tokens and --tokens-per-s"),
        ((0.0, None, None), "--hours 0 must be above 0"),
        ((None, 1e9, 0.0), "--tokens and --tokens-per-s must be above 0"),
    ],
)
def test_run_hours_refuses_incomplete_or_empty_runs(
    args: tuple[Any, Any, Any], message: str
) -> None:
    with pytest.raises(TrnctlError, match=re.escape(message)):
        cost.run_hours(*args)


def test_cost_from_the_table_for_tokens(trnctl: Any) -> None:
    # 7.2e9 tokens at 100k tokens/s are 20 h; 4 nodes make 80 instance-hours at $21.50.
    run = trnctl(
        "cost",
        "--instance-type",
        "trn1.32xlarge",
        "--nodes",
        "4",
        "--tokens",
        "7.2e9",
        "--tokens-per-s",
        "100000",
        "--region",
        "us-east-1",
    )

    assert run.exit_code == 0, run.stderr
    on_demand = next(line for line in run.stdout.splitlines() if "│ on-demand " in line)
    assert "21.50" in on_demand and "80.00" in on_demand and "1,720.00" in on_demand
    assert "as of 2026-06-25, unverified" in on_demand
    block = next(line for line in run.stdout.splitlines() if "│ capacity-block " in line)
    assert "no sourced price (table has ap-southeast-4)" in block


def test_cost_without_any_price_exits_1_and_suggests_live(trnctl: Any) -> None:
    run = trnctl("cost", "--instance-type", "trn3.48xlarge", "--nodes", "2", "--hours", "5")

    assert run.exit_code == 1
    assert run.stderr == (
        "trnctl: no price for trn3.48xlarge in us-east-2 in the catalog; try --live\n"
    )


def product(usd: str) -> str:
    return json.dumps(
        {
            "product": {"attributes": {"instanceType": "trn2.48xlarge", "regionCode": "us-east-2"}},
            "terms": {
                "OnDemand": {
                    "X.JRTCKXETXF": {
                        "priceDimensions": {
                            "X.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "pricePerUnit": {"USD": usd},
                            }
                        }
                    }
                }
            },
        }
    )


EXPECTED_FILTERS = {
    "ServiceCode": "AmazonEC2",
    "Filters": [
        {"Type": "TERM_MATCH", "Field": "instanceType", "Value": "trn2.48xlarge"},
        {"Type": "TERM_MATCH", "Field": "regionCode", "Value": "us-east-2"},
        {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
        {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
        {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
        {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"},
        {"Type": "TERM_MATCH", "Field": "licenseModel", "Value": "No License required"},
        # Capacity Block products would otherwise add their rates to the same query.
        {"Type": "TERM_MATCH", "Field": "marketoption", "Value": "OnDemand"},
        {"Type": "TERM_MATCH", "Field": "operation", "Value": "RunInstances"},
    ],
}


def test_live_adds_the_pricing_api_rate(trnctl: Any, clients: Any, stub: Any) -> None:
    pricing = stub(clients("pricing", "us-east-1"))
    pricing.add_response(
        "get_products",
        {"PriceList": [product("44.0000000000")], "FormatVersion": "aws_v1"},
        EXPECTED_FILTERS,
    )

    run = trnctl(
        "cost", "--instance-type", "trn2.48xlarge", "--nodes", "2", "--hours", "10", "--live"
    )

    assert run.exit_code == 0, run.stderr
    live = next(line for line in run.stdout.splitlines() if "on-demand (live)" in line)
    assert "44.00" in live and "20.00" in live and "880.00" in live
    pricing.assert_no_pending_responses()


def test_live_with_no_listing_still_exits_1(trnctl: Any, clients: Any, stub: Any) -> None:
    stub(clients("pricing", "us-east-1")).add_response("get_products", {"PriceList": []})

    run = trnctl(
        "cost", "--instance-type", "trn2.48xlarge", "--nodes", "2", "--hours", "10", "--live"
    )

    assert run.exit_code == 1
    assert "the Pricing API lists no rate" in run.stdout
    assert run.stderr == "trnctl: no price for trn2.48xlarge in us-east-2 in the catalog\n"


def test_live_with_conflicting_rates_is_an_error(clients: Any, stub: Any) -> None:
    stub(clients("pricing", "us-east-1")).add_response(
        "get_products", {"PriceList": [product("44.0"), product("46.5")]}
    )

    with pytest.raises(
        TrnctlError,
        match=re.escape("several On-Demand rates for trn2.48xlarge in us-east-2: 44, 46.5"),
    ):
        cost.live_on_demand(clients("pricing", "us-east-1"), "trn2.48xlarge", "us-east-2")


def test_pricing_access_denied_is_one_line(trnctl: Any, clients: Any, stub: Any) -> None:
    stub(clients("pricing", "us-east-1")).add_client_error(
        "get_products", "AccessDeniedException", "not allowed: pricing:GetProducts", 400
    )

    run = trnctl(
        "cost", "--instance-type", "trn2.48xlarge", "--nodes", "1", "--hours", "1", "--live"
    )

    assert run.exit_code == 3
    assert run.stderr.startswith(
        "trnctl: access denied calling GetProducts (AccessDeniedException): not allowed: "
        "pricing:GetProducts;"
    )
    assert run.stderr.count("\n") == 1
