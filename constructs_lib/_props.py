"""The record of what a construct was built with (its ``props``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

P = TypeVar("P")


def props_of(cls: type[P], given: Mapping[str, Any]) -> P:
    """``cls``, a props dataclass, with each field taken by name from ``given``: a constructor's
    ``locals()`` before it makes any other name, so that the record holds exactly its keyword
    arguments (tests/library/test_typed_props.py checks that each constructor's keyword-only
    parameters are its record's fields, with the same types)."""
    return cls(**{f.name: given[f.name] for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


# The default of a mapping prop: empty, and immutable so that no construct shares a changed one.
EMPTY_LABELS: Mapping[str, str] = MappingProxyType({})
