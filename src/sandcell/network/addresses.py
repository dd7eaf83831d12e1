"""Which addresses the egress proxy may connect to, and the one resolution it trusts.

An address is *public* when the IANA special-purpose registries call it globally reachable
(:attr:`ipaddress.IPv4Address.is_global`) and nothing it embeds is special: an IPv4-mapped,
IPv4-compatible, 6to4, Teredo or NAT64 IPv6 address is judged by the IPv4 address inside it,
since a host that routes it may deliver it there. Everything else is refused, with its class in
the reason: loopback, private, link-local, CGNAT (shared address space), multicast,
unspecified, cloud metadata services, and other reserved ranges. A refused address is allowed
only by the profile's ``allow_addresses`` or by an IP rule listing it literally.

A name is resolved exactly once per connection (:func:`resolve_pinned`); every answer must pass,
and the connection goes to one of those checked addresses, never to the name again. A DNS
answer that changes between the check and the connection (rebinding) therefore cannot matter:
there is no second lookup.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from sandcell.network.allowlist import Allowlist, IPAddress, IPNetwork

AddressKind = Literal[
    "public",
    "loopback",
    "private",
    "link-local",
    "cgnat",
    "multicast",
    "unspecified",
    "metadata",
    "reserved",
]

METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean...
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.253",  # AWS VPC DNS
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::253",  # AWS VPC DNS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure wire server: a public-looking address
    )
)
"""Cloud instance metadata and platform services: credentials live behind these."""

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")

Resolver = Callable[[str, int], Sequence[IPAddress]]
"""``(name, port) -> addresses``; raises OSError when the name does not resolve."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AddressClass:
    """What an address is, for the allow decision and the reason shown."""

    kind: AddressKind
    via: IPAddress | None = None
    """The IPv4 address an IPv6 address embeds, when that decided the class."""

    def describe(self, address: IPAddress) -> str:
        """``'127.0.0.1' is a loopback address`` (naming the embedded address when there is one)."""
        what = "an" if self.kind[0] in "aeiou" else "a"
        text = f"{str(address)!r} is {what} {self.kind} address"
        return text if self.via is None else f"{text} (it embeds {str(self.via)!r})"


def classify(address: IPAddress) -> AddressClass:
    """The class of ``address`` (see the module docstring)."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_v4(address)
        if embedded is not None:
            inner = classify(embedded)
            if inner.kind != "public":
                return AddressClass(kind=inner.kind, via=embedded)
            if address.ipv4_mapped is not None or address in _NAT64[0]:
                return inner  # delivered to that public IPv4 address, nowhere else
    return AddressClass(kind=_kind(address))


def _kind(address: IPAddress) -> AddressKind:
    # Order matters: metadata first (169.254.169.254 is link-local too, and the specific class
    # is the useful reason), unspecified before private (Python counts 0.0.0.0 as private).
    if address in METADATA_ADDRESSES:
        return "metadata"
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if isinstance(address, ipaddress.IPv4Address) and address in _CGNAT:
        return "cgnat"
    if isinstance(address, ipaddress.IPv6Address) and any(address in n for n in _NAT64[1:]):
        return "private"  # a local-use translation prefix: reaches the operator's network
    if address.is_reserved:
        return "reserved"
    if address.is_private:
        return "private"
    if not address.is_global:
        return "reserved"
    return "public"


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        server, client = address.teredo
        return client if _kind(client) != "public" else server
    if address in _NAT64[0] or (address in _IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_problem(address: IPAddress, allowlist: Allowlist) -> str | None:
    """Why the proxy may not connect to ``address``, or None when it may.

    Public addresses are allowed; any other only when ``allow_addresses`` covers it or an IP
    rule lists it.
    """
    kind = classify(address)
    if kind.kind == "public" or allowlist.lists_address(address):
        return None
    if any(_covers(net, address) for net in allowlist.allow_addresses):
        return None
    return (
        f"{kind.describe(address)}, which is refused unless the profile lists it in "
        "[network] allow_addresses"
    )


def _covers(network: IPNetwork, address: IPAddress) -> bool:
    return network.version == address.version and address in network


@dataclass(frozen=True, slots=True, kw_only=True)
class Pinned:
    """The outcome of resolving a name once: the checked addresses, or why there are none."""

    addresses: tuple[IPAddress, ...] = ()
    """Every address the name resolved to, each checked, in the resolver's order. The
    connection goes to one of these, never back to the name."""
    problem: str | None = None
    """Why the name may not be reached (it does not resolve, or an answer is refused)."""
    refused: bool = False
    """Whether the name resolved and an answer was refused (not merely unresolvable)."""


def resolve_pinned(name: str, port: int, allowlist: Allowlist, resolver: Resolver) -> Pinned:
    """Resolve ``name`` once and check every answer.

    Fail closed: one refused answer refuses the name, since a name that mixes public and
    internal answers is either misconfigured or probing.
    """
    try:
        answers = tuple(dict.fromkeys(resolver(name, port)))
    except (OSError, UnicodeError) as exc:
        return Pinned(problem=f"{name} does not resolve ({exc})")
    if not answers:
        return Pinned(problem=f"{name} does not resolve (no addresses)")
    for address in answers:
        problem = address_problem(address, allowlist)
        if problem:
            return Pinned(problem=f"{name} resolves to {problem}", refused=True)
    return Pinned(addresses=answers)


def system_resolver(name: str, port: int) -> tuple[IPAddress, ...]:
    """The host's resolver (``getaddrinfo``), TCP answers only, scope ids dropped."""
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    found: list[IPAddress] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            found.append(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]))
    return tuple(found)


class MapResolver:
    """A resolver answering from a fixed table, for hosts whose names are given, not looked up.

    Each value is one answer list, or a sequence of answer lists given out in turn (the last
    one repeats), so that a name can change its answer between lookups. ``calls`` counts the
    lookups of each name.
    """

    def __init__(self, table: Mapping[str, Sequence[str] | Sequence[Sequence[str]]]) -> None:
        self._answers: dict[str, list[tuple[IPAddress, ...]]] = {}
        for name, value in table.items():
            rounds: list[Sequence[str]] = (
                [[str(v) for v in value]]
                if all(isinstance(v, str) for v in value)
                else [list(v) for v in value]
            )
            self._answers[name] = [tuple(ipaddress.ip_address(a) for a in r) for r in rounds]
        self.calls: dict[str, int] = {}

    def __call__(self, name: str, port: int) -> tuple[IPAddress, ...]:
        rounds = self._answers.get(name)
        if rounds is None:
            raise OSError(f"no address for {name!r} in the resolver's table")
        count = self.calls.get(name, 0)
        self.calls[name] = count + 1
        return rounds[min(count, len(rounds) - 1)]


class HostsResolver:
    """A profile's own host entries (``[network] resolve``) first, then ``fallback``: like a
    hosts file for the proxy alone. Its answers are checked like any other (a listed name that
    resolves to loopback is still refused unless ``allow_addresses`` covers it)."""

    def __init__(self, table: Mapping[str, Sequence[IPAddress]], fallback: Resolver) -> None:
        self._table = {name: tuple(addresses) for name, addresses in table.items()}
        self._fallback = fallback

    def __call__(self, name: str, port: int) -> Sequence[IPAddress]:
        found = self._table.get(name)
        return found if found is not None else self._fallback(name, port)
