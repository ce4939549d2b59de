"""Names of versioned datasets and models in the datasets bucket: ``AREA/NAME`` (the newest
version, or for models the one in service) and ``AREA/NAME@vN``. trnctl's versioning turns them
into references it reads and writes; a pipeline checks them here. Standard library only."""

from __future__ import annotations

import re

from trn_catalog import hf_models as hf
from trn_catalog.settings import Name, SettingError

DATASETS = "datasets"
MODELS = hf.MODELS_PREFIX
_VERSION = re.compile(r"^v([1-9][0-9]{0,8})$")


def parse_version(text: str) -> int | None:
    """3 for ``v3``; None for anything else."""
    found = _VERSION.match(text)
    return int(found.group(1)) if found else None


def split(text: str, area: str, setting: str) -> tuple[str, int | None] | None:
    """NAME and version (None without ``@vN``) of ``text`` when it is ``AREA/NAME`` or
    ``AREA/NAME@vN`` (a trailing ``/`` ignored); None when it names something outside ``area``
    (a plain prefix, staged before versions existed).

    Raises:
        SettingError: naming ``setting``, for a bad NAME or version.
    """
    head, slash, rest = text.strip().rstrip("/").partition("/")
    if head != area or not slash:
        return None
    name, at, version = rest.partition("@")
    if not hf.MODEL_NAME.match(name):
        raise SettingError(
            Name(setting),
            f" {text!r}: {name!r} cannot name a versioned {area[:-1]}: use {hf.MODEL_NAME_RULE}",
        )
    if not at:
        return name, None
    number = parse_version(version)
    if number is None:
        raise SettingError(Name(setting), f" {text!r}: the version is vN, e.g. {area}/{name}@v3")
    return name, number


def split_model(text: str, setting: str, *, bare: bool = True) -> tuple[str, int | None]:
    """NAME and version of the model ``text`` names: ``models/NAME``, ``models/NAME@vN``, or
    with ``bare`` (default True) a plain ``NAME``.

    Raises:
        SettingError: naming ``setting``, for anything else.
    """
    plain = text.strip().rstrip("/")
    if bare and "/" not in plain:
        plain = f"{MODELS}/{plain}"
    found = split(plain, MODELS, setting)
    if found is None:
        raise SettingError(
            Name(setting),
            f" {text!r} is not models/NAME or models/NAME@vN (a model staged with "
            "trnctl model stage DIR NAME --env E)",
        )
    return found
