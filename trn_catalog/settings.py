"""Refusals of a setting that each caller names its own way: the ops CLI by its option
(``--eval-data``), a construct by its prop (``eval_data``). Standard library only."""

from __future__ import annotations

from collections.abc import Callable


class Name(str):
    """A setting's name inside a :class:`SettingError`'s message."""


class SettingError(ValueError):
    """A setting refused, with its message in ``parts``: text and the :class:`Name` of each
    setting it speaks of, which :meth:`render` shows as the caller calls it. ``str()`` shows
    the names as they are."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts
        super().__init__(self.render())

    def render(self, name: Callable[[str], str] = str) -> str:
        """The message, each setting shown as ``name(setting)``."""
        return "".join(name(p) if isinstance(p, Name) else p for p in self.parts)
