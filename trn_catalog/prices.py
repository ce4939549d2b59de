"""Hourly prices of the catalog's Trainium and GPU instances, each with its source and the date
the source showed it.

Standard library only, like the rest of the catalog. Prices change: AWS revises Capacity Block
rates regularly and On-Demand rates occasionally, so every entry carries ``as_of`` and a
``source`` key, and ``verified`` is False unless the figure was read on an AWS pricing page
itself. For a current On-Demand figure, ``trnctl cost --live`` asks the AWS Pricing API; for a
current Capacity Block figure, ``trnctl capacity find`` shows the offered upfront fee.

No source was found for trn1n, trn2, trn2u or trn3 prices, nor for p6-b200.48xlarge or
g6e.48xlarge, so they are absent rather than guessed. p5.48xlarge has no On-Demand entry: the
third-party figures found disagree (AWS cut P5 On-Demand rates in June 2025; pages from 2026 still
quote the rate from before the cut), so ``trnctl cost --live`` or ``--price`` gives it.
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
            "instance-hour ($0.968 per accelerator-hour); p5.48xlarge, US East (N. Virginia) "
            "and US East (Ohio): effective $39.33 per instance-hour ($4.916 per GPU-hour)."
        ),
        "dstack-pr-4110-2026-08": (
            "dstackai/dstack pull request 4110 (2026-08-06), output of `dstack offer -b aws "
            "--instance-type p5en.48xlarge`, whose prices come from dstack's gpuhunt catalog of "
            "AWS rates: p5en.48xlarge On-Demand $63.296/hr in us-east-1, us-east-2 and "
            "us-west-2. Third-party, not an AWS page."
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
    *(
        Price(
            instance_type="p5.48xlarge",
            region=region,
            market="capacity-block",
            usd_per_hour=39.33,
            as_of="2024-12",
            source="aws-capacity-blocks-pricing-2024-12",
        )
        for region in ("us-east-1", "us-east-2")
    ),
    *(
        Price(
            instance_type="p5en.48xlarge",
            region=region,
            market="on-demand",
            usd_per_hour=63.296,
            as_of="2026-08-06",
            source="dstack-pr-4110-2026-08",
        )
        for region in ("us-east-1", "us-east-2", "us-west-2")
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
