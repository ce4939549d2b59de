"""EC2 UltraServers of Trainium: the types a source confirms, and the node labels that place a
job inside one.

An UltraServer is several instances on one NeuronLink domain, bought as one UltraServer Capacity
Block (``DescribeCapacityBlockOfferings`` with ``UltraserverType`` and ``UltraserverCount``).
Only a type whose EC2 name, member instance type, server count and chip count a source states
becomes an entry; any other name is refused with the reason (:func:`get`). Standard library
only: the ops CLI and the constructs both read it. Each fact cites a key of :data:`SOURCES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "neuron-trn2-arch": (
            "Neuron docs, 'Amazon EC2 Trn2 Architecture' and 'Trainium2 Architecture' "
            "(about-neuron/arch/neuron-hardware/trn2-arch, trainium2): the Trn2 UltraServer "
            "('u-trn2x64' in earlier revisions, and the file name of their figure) is four "
            "trn2u.48xlarge instances, 64 Trainium2 chips, over NeuronLink-v3"
        ),
        "ec2-capacity-blocks-api": (
            "botocore EC2 service model 2016-11-15 (DescribeCapacityBlockOfferings: "
            "UltraserverType, UltraserverCount; CapacityBlockOffering returns both)"
        ),
    }
)

# Why a Trn3 UltraServer is not an entry: the sources disagree on the member instance names, and
# none gives the EC2 UltraserverType value (platform-facts.md, dra-ultraserver-facts.md).
TRN3_UNCONFIRMED = (
    "Trn3 UltraServers (Gen1: 4 servers x 16 chips; Gen2: 36 servers x 4 chips) have no EC2 "
    "UltraserverType name that a source confirms, and their member instance type is unsettled "
    "(the Neuron chart lists trn3.48xlarge and trn3e.24xlarge, the Neuron driver trn3p.48xlarge)"
)

# Node labels. Each node group of an UltraServer Capacity Block carries the block's reservation
# id as the UltraServer's id: one block is one UltraServer, so the id is known at synth, and
# jobs place by it.
ULTRASERVER_ID_LABEL = "trn-platform/ultraserver-id"
ULTRASERVER_TYPE_LABEL = "trn-platform/ultraserver-type"
# The Neuron docs' own labels for an UltraServer of N servers (aws-neuron-sdk
# deploy/eks/ultraserver.rst: the worker affinity's topologyKey and the node listing of its
# "Confirm your work"; N is 2 or 4): one server id shared by the N nodes and each node's
# position 0..N-1, which a managed node group's labels cannot set per node. The guide's
# prerequisite is the Neuron device plugin 2.30.0.0 or later; which component sets them is not
# stated, so preflight reads them where they are and checks them against the blocks.
NEURON_SERVER_ID_LABEL = "neuron.amazonaws.com/ultraserver-server-id-{servers}"
NEURON_NODE_ID_LABEL = "neuron.amazonaws.com/ultraserver-node-id-{servers}"


@dataclass(frozen=True)
class UltraServerSpec:
    """One UltraServer type.

    ``name`` is the value of EC2's ``UltraserverType``; ``sources`` maps each fact to a key of
    :data:`SOURCES`; ``unverified`` maps a fact whose source is indirect to what is missing
    (default: none).
    """

    name: str
    instance_type: str
    servers: int
    chips: int
    sources: Mapping[str, str] = field(repr=False)
    unverified: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False)

    @property
    def chips_per_server(self) -> int:
        return self.chips // self.servers

    def source_of(self, fact: str) -> str:
        return SOURCES[self.sources[fact]]


ULTRASERVERS: Mapping[str, UltraServerSpec] = MappingProxyType(
    {
        "u-trn2x64": UltraServerSpec(
            name="u-trn2x64",
            instance_type="trn2u.48xlarge",
            servers=4,
            chips=64,
            sources=MappingProxyType(
                {
                    "name": "neuron-trn2-arch",
                    "instance_type": "neuron-trn2-arch",
                    "servers": "neuron-trn2-arch",
                    "chips": "neuron-trn2-arch",
                }
            ),
            unverified=MappingProxyType(
                {
                    "name": (
                        "earlier Neuron docs called the Trn2 UltraServer 'u-trn2x64'; no EC2 "
                        "document or API model lists the values of UltraserverType, so this is "
                        "EC2's value only once an offering returns it"
                    )
                }
            ),
        ),
    }
)


class UnconfirmedUltraServerError(ValueError):
    """Raised for an UltraServer type that no source confirms; the message says why."""


def unconfirmed_reason(name: str) -> str:
    """Why ``name`` is not an UltraServer type this catalog uses."""
    confirmed = ", ".join(ULTRASERVERS)
    if name.startswith(("u-trn3", "trn3")):
        return (
            f"UltraServer type {name!r} is not confirmed: {TRN3_UNCONFIRMED}; "
            f"confirmed: {confirmed}"
        )
    return (
        f"UltraServer type {name!r} is not one a source confirms (its EC2 name, member instance "
        f"type, servers and chips); confirmed: {confirmed}"
    )


def get(name: str) -> UltraServerSpec:
    """The entry for the UltraServer type ``name`` (EC2's ``UltraserverType`` value).

    Raises:
        UnconfirmedUltraServerError: no source confirms ``name``; the message says why.
    """
    try:
        return ULTRASERVERS[name]
    except KeyError:
        raise UnconfirmedUltraServerError(unconfirmed_reason(name)) from None


def for_instance_type(instance_type: str) -> UltraServerSpec | None:
    """The UltraServer type whose servers are ``instance_type`` (None when it is no member)."""
    return next((u for u in ULTRASERVERS.values() if u.instance_type == instance_type), None)
