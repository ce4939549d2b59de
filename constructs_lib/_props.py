"""Keyword arguments or a props dataclass: how every construct takes its props."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

P = TypeVar("P")


def props_from(cls: type[P], props: P | None, kwargs: dict[str, Any]) -> P:
    """``props`` as given, or ``cls(**kwargs)``: constructs take their props either way, as
    keyword arguments (aws-cdk-lib's style) or as one frozen dataclass.

    Raises:
        TypeError: both or neither given where ``cls`` has required fields, an unknown keyword
            or a missing required one; the message names the construct and the keywords.
    """
    construct = cls.__name__.removesuffix("Props")
    if props is not None:
        if kwargs:
            raise TypeError(
                f"{construct}: pass props= or keyword arguments, not both "
                f"(got props= and {', '.join(sorted(kwargs))})"
            )
        return props
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    known = {f.name for f in fields}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(
            f"{construct} got unknown keyword argument(s) {', '.join(unknown)}; "
            f"it takes {', '.join(sorted(known))}"
        )
    missing = [
        f.name
        for f in fields
        if f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise TypeError(f"{construct} is missing required keyword argument(s) {', '.join(missing)}")
    return cls(**kwargs)
