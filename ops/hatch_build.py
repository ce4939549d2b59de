"""trn-platform-ops' build hook: the wheel takes trnctl and the trainer from the checkout, where
they stay (the training image copies the trainer from there)."""

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCES = {"../trnctl": "trnctl", "../training_image/trainer": "trainer"}


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        # A built wheel carries copies; an editable install (make setup) carries none, its .pth
        # puts the checkout on sys.path instead, so the environment never runs stale copies.
        if version == "standard":
            build_data["force_include"].update(SOURCES)
