"""What an experiment costs: nodes x hours at the catalog's dated prices, or the Pricing API's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trn_catalog import prices
from trnctl.errors import ExitCode, TrnctlError

# The Pricing API has endpoints in us-east-1, eu-central-1 and ap-south-1 only (botocore's
# endpoint data); us-east-1 is the one AWS documents first.
PRICING_REGION = "us-east-1"
SECONDS_PER_HOUR = 3600


def run_hours(hours: float | None, tokens: float | None, tokens_per_s: float | None) -> float:
    """Wall-clock hours of the run: ``hours``, or ``tokens / tokens_per_s`` (cluster throughput).

    Raises:
        TrnctlError: neither or both forms given, or a value not above zero (USAGE).
    """
    if hours is not None and tokens is None and tokens_per_s is None:
        if hours <= 0:
            raise TrnctlError(f"--hours {hours:g} must be above 0")
        return hours
    if hours is None and tokens is not None and tokens_per_s is not None:
        if tokens <= 0 or tokens_per_s <= 0:
            raise TrnctlError("--tokens and --tokens-per-s must be above 0")
        return tokens / tokens_per_s / SECONDS_PER_HOUR
    raise TrnctlError("give either --hours, or both --tokens and --tokens-per-s")


@dataclass(frozen=True)
class Line:
    """One way to pay: ``usd_per_hour`` is None when no source prices it."""

    market: str
    usd_per_hour: float | None
    instance_hours: float
    note: str

    @property
    def total(self) -> float | None:
        return None if self.usd_per_hour is None else self.usd_per_hour * self.instance_hours


def from_table(instance_type: str, region: str, nodes: int, hours: float) -> list[Line]:
    """On-Demand and Capacity Block lines from :mod:`trn_catalog.prices`."""
    lines = []
    for market in prices.MARKETS:
        price = prices.lookup(instance_type, region, market)
        if price is None:
            elsewhere = prices.priced_regions(instance_type, market)
            note = "no sourced price" + (
                f" (table has {', '.join(elsewhere)})" if elsewhere else ""
            )
            lines.append(Line(market, None, nodes * hours, note))
            continue
        status = "verified" if price.verified else "unverified"
        note = f"as of {price.as_of}, {status}: {price.source_text()}"
        lines.append(Line(market, price.usd_per_hour, nodes * hours, note))
    return lines


# Capacity Block products share the instance type and region; marketoption and operation keep
# the On-Demand Linux rate alone (Karpenter's pricing query filters the same way).
PRICING_FILTERS = (
    ("operatingSystem", "Linux"),
    ("tenancy", "Shared"),
    ("preInstalledSw", "NA"),
    ("capacitystatus", "Used"),
    ("licenseModel", "No License required"),
    ("marketoption", "OnDemand"),
    ("operation", "RunInstances"),
)


def live_on_demand(pricing: Any, instance_type: str, region: str) -> float | None:
    """The Pricing API's On-Demand Linux rate in USD per hour, or None when it lists none.

    Raises:
        TrnctlError: the API lists several different rates for the same filters (FAILED).
        botocore.exceptions.ClientError: the Pricing API refused the call.
    """
    terms = (("instanceType", instance_type), ("regionCode", region), *PRICING_FILTERS)
    filters = [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in terms]
    rates = set()
    pages = pricing.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=filters)
    for page in pages:
        for item in page["PriceList"]:
            product = json.loads(item) if isinstance(item, str) else item
            for offer in product.get("terms", {}).get("OnDemand", {}).values():
                for dimension in offer.get("priceDimensions", {}).values():
                    if dimension.get("unit") == "Hrs":
                        rates.add(float(dimension["pricePerUnit"]["USD"]))
    if len(rates) > 1:
        raise TrnctlError(
            f"the Pricing API lists several On-Demand rates for {instance_type} in {region}: "
            f"{', '.join(f'{r:g}' for r in sorted(rates))}",
            ExitCode.FAILED,
        )
    return rates.pop() if rates else None
