"""What every instance type of the catalogs shares, Trainium or GPU: the host, its network
cards and EFA interfaces, and where each fact came from. Standard library only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar


@dataclass(frozen=True, kw_only=True)
class HostSpec:
    """Host facts of one instance type.

    ``sources`` maps each fact field to a key of the subclass's ``citations`` table;
    ``unverified`` names the fields that no primary source confirms.
    """

    citations: ClassVar[Mapping[str, str]]

    name: str
    vcpus: int
    memory_gib: int
    network_cards: int
    efa_interfaces: int
    efa_gbps: int
    instance_store_gb: int
    sources: Mapping[str, str] = field(repr=False)
    unverified: frozenset[str] = frozenset()

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def multi_node_efa(self) -> bool:
        """True when the type has more than one EFA interface (a multi-node training size)."""
        return self.efa_interfaces > 1

    @property
    def verified(self) -> bool:
        return not self.unverified

    def source_of(self, fact: str) -> str:
        """The citation for one field, for example ``source_of("efa_interfaces")``."""
        return self.citations[self.sources[fact]]
