"""trn-platform-ops' build hook: the wheel takes trnctl, the trainer and the trainer's sample
corpus from the checkout, where they stay (the training image copies them from there), or from
the sdist, which carries them under their wheel names."""

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

# Wheel path -> where it is in the checkout, relative to ops/.
SOURCES = {
    "trnctl": "../trnctl",
    "trainer": "../training_image/trainer",
    "trainer/corpus/workshop_tales.txt": "../training_image/corpus/workshop_tales.txt",
}


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        # A built wheel carries copies; an editable install (make setup) carries none, its .pth
        # puts the checkout on sys.path instead, so the environment never runs stale copies.
        if version != "standard":
            return
        root = Path(self.root)
        for name, in_checkout in SOURCES.items():
            found = root / in_checkout
            # Built from an unpacked sdist: the files sit at their wheel paths.
            source = found if found.exists() else root / name
            build_data["force_include"][str(source)] = name
