"""Hourly prices of Trainium instances, each with its source and the date the source showed it.

Standard library only, like the rest of the catalog. Prices change: AWS revises Capacity Block
rates regularly and On-Demand rates occasionally, so every entry carries ``as_of`` and a
``source`` key, and ``verified`` is False unless the figure was read on an AWS pricing page
itself. For a current On-Demand figure, ``trnctl cost --live`` asks the AWS Pricing API; for a
current Capacity Block figure, ``trnctl capacity find`` shows the offered upfront fee.

No source was found for trn1n, trn2, trn2u or trn3 prices, so they are absent rather than guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Market = Literal["on-demand", "capacity-block"]
MARKETS: tuple[Market, ...] = ("on-demand", "capacity-block")

PRICE_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "usage-ai-2026-06": (
            "usage.ai, 'AWS Trainium vs GPU Instances: What Actually Costs Less for AI Training' "
            "(updated 2026-06-25): trn1.32xlarge On-Demand $21.50/hr; consistent with "
            "cloudexpat.com's ~$1.34 per Trainium chip-hour (x16). Third-party, not an AWS page."
        ),
        "aws-capacity-blocks-pricing-2024-12": (
            "Amazon EC2 Capacity Blocks for ML Pricing page (aws.amazon.com/ec2/capacityblocks/"
            "pricing), read through a mirror; it said the rates were next due for update on "
            "2025-01-01. trn1.32xlarge, Asia Pacific (Melbourne): effective $15.49 per "
            "instance-hour ($0.968 per accelerator-hour)."
        ),
    }
)


@dataclass(frozen=True)
class Price:
    """USD per instance-hour for one type, region and market (Linux, shared tenancy)."""

    instance_type: str
    region: str
    market: Market
    usd_per_hour: float
    as_of: str
    source: str
    verified: bool = False

    def source_text(self) -> str:
        return PRICE_SOURCES[self.source]


PRICES: tuple[Price, ...] = (
    Price(
        instance_type="trn1.32xlarge",
        region="us-east-1",
        market="on-demand",
        usd_per_hour=21.50,
        as_of="2026-06-25",
        source="usage-ai-2026-06",
    ),
    Price(
        instance_type="trn1.32xlarge",
        region="ap-southeast-4",
        market="capacity-block",
        usd_per_hour=15.49,
        as_of="2024-12",
        source="aws-capacity-blocks-pricing-2024-12",
    ),
)


def lookup(instance_type: str, region: str, market: Market) -> Price | None:
    """The table's price for the type in the region and market, or None when none is sourced."""
    for price in PRICES:
        if (price.instance_type, price.region, price.market) == (instance_type, region, market):
            return price
    return None


def priced_regions(instance_type: str, market: Market) -> tuple[str, ...]:
    """The regions the table has a price for, for messages that suggest where to look."""
    return tuple(
        p.region for p in PRICES if p.instance_type == instance_type and p.market == market
    )
