"""Formats and limits that the config model, the constructs and the ops CLI all check."""

from __future__ import annotations

import re

# One Capacity Block holds at most 64 instances (EC2 Capacity Blocks for ML); a node group is
# kept to one block's size, and a bigger fleet is several node groups.
MAX_BLOCK_INSTANCES = 64
# EC2 capacity reservation ids (On-Demand Capacity Reservations and Capacity Blocks).
RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{17}$")
# A preview's project name goes into stack, cluster, function and budget names.
PREVIEW_NAME_MAX = 20
PREVIEW_NAME = re.compile(rf"^[a-z]([a-z0-9-]{{0,{PREVIEW_NAME_MAX - 2}}}[a-z0-9])?$")
PREVIEW_NAME_RULE = (
    "a DNS-safe project name: lowercase letters, digits and '-', starting with a letter, "
    f"not ending with '-', at most {PREVIEW_NAME_MAX} characters"
)
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")
