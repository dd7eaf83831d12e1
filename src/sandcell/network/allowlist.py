"""The egress allowlist of a profile: ``host:port`` rules, parsed once into frozen objects.

A rule is written as one string in ``[network] hosts``:

- ``api.example.com``: that name on the default ports, 443 and 80;
- ``api.example.com:8443`` or ``api.example.com:443,8443``: that name on exactly those ports;
- ``*.example.com``: every name *strictly under* ``example.com``, at any depth
  (``a.example.com``, ``a.b.example.com``), but **not** ``example.com`` itself: a wildcard grants
  the subdomains a service hands out, and the apex is often a different service; list it too when
  it is meant. The wildcard must be the whole first label, under a registrable domain;
- ``203.0.113.7:443`` or ``[2001:db8::7]:443``: that address literally. An IP literal is the
  only way a program may connect to an address instead of a name, and listing one also allows
  that address when it is loopback, private or link-local (the listing is explicit).

Names are compared as lower-case A-labels (IDNA, the standard library's codec), without a
trailing dot, so ``Bücher.Example`` in a profile and ``xn--bcher-kva.example`` on the wire are
the same host. A client that spells a name differently is refused, never let through.

``[network] allow_addresses`` lists addresses or networks (``10.20.0.0/16``) that a *listed name*
may resolve to although they are not public: an internal mirror, say. Absent or empty: names
must resolve to public addresses only (:mod:`sandcell.network.addresses`).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from sandcell.errors import ConfigError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS: tuple[int, ...] = (443, 80)
"""The ports of a rule that names none: HTTPS and HTTP."""
NARROWEST_V4_PREFIX = 8
NARROWEST_V6_PREFIX = 32

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# Suffixes under which anyone can register a name. Not the whole Public Suffix List: ccTLD
# second levels (co.uk, com.au...) are caught by shape below, these are the common others.
_SHARED_SUFFIXES = frozenset(
    {
        *("github.io", "gitlab.io", "herokuapp.com", "appspot.com", "blogspot.com"),
        *("cloudfront.net", "amazonaws.com", "s3.amazonaws.com", "azurewebsites.net"),
        *("netlify.app", "vercel.app", "pages.dev", "workers.dev"),
    }
)
_CC_SECOND_LEVELS = frozenset(
    {"ac", "co", "com", "edu", "gob", "gov", "go", "ltd", "mil", "ne", "net", "or", "org", "sch"}
)


class HostError(ConfigError):
    """A host, port or address in a rule (or asked for by a program) is not valid."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostRule:
    """One allowlist entry, normalised."""

    text: str
    """The rule as the profile wrote it."""
    name: str | None
    """The lower-case A-label name (for a wildcard: the domain under which it matches); None for
    an IP literal."""
    wildcard: bool
    """Whether the rule matches every name strictly under ``name`` (and not ``name`` itself)."""
    address: IPAddress | None
    """The address of an IP-literal rule; None for a name."""
    ports: tuple[int, ...]
    """The ports allowed, in the order written; :data:`DEFAULT_PORTS` when none was."""

    def matches(self, host: str | IPAddress, port: int) -> bool:
        """Whether a normalised ``host`` (see :func:`normalise_host`) on ``port`` is allowed."""
        if port not in self.ports:
            return False
        if not isinstance(host, str):
            return self.address == host
        if self.name is None:
            return False
        return host.endswith("." + self.name) if self.wildcard else host == self.name

    def show(self) -> str:
        """The canonical spelling of the rule (what the matrix and records show)."""
        if self.address is not None:
            where = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        else:
            where = f"*.{self.name}" if self.wildcard else str(self.name)
        return f"{where}:{','.join(map(str, self.ports))}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Allowlist:
    """Everything ``[network]`` allows: host rules and the non-public networks names may use."""

    rules: tuple[HostRule, ...] = ()
    """Empty: no host at all."""
    allow_addresses: tuple[IPNetwork, ...] = ()
    """Non-public networks a listed name may resolve to. Empty: public addresses only."""

    def rule_for(self, host: str | IPAddress, port: int) -> HostRule | None:
        """The first rule allowing the normalised ``host`` on ``port``, or None."""
        return next((r for r in self.rules if r.matches(host, port)), None)

    def lists_address(self, address: IPAddress) -> bool:
        """Whether ``address`` is listed literally by an IP rule (on any port)."""
        return any(r.address == address for r in self.rules)


def parse_allowlist(hosts: tuple[str, ...], allow_addresses: tuple[str, ...] = ()) -> Allowlist:
    """Build the :class:`Allowlist` of ``hosts`` and ``allow_addresses``.

    Raises:
        HostError: for the first invalid entry, naming it and saying how to write it.
    """
    return Allowlist(
        rules=tuple(parse_rule(text) for text in hosts),
        allow_addresses=tuple(parse_network(text) for text in allow_addresses),
    )


def parse_rule(text: str) -> HostRule:
    """Parse one ``hosts`` entry (see the module docstring for the forms)."""
    problem = host_problem(text)
    if problem:
        raise HostError(problem)
    where, ports = _split_port(text)
    literal = _ip_literal(where)
    if literal is not None:
        return HostRule(text=text, name=None, wildcard=False, address=literal, ports=ports)
    wildcard = where.startswith("*.")
    name = _a_label(where[2:] if wildcard else where)
    return HostRule(text=text, name=name, wildcard=wildcard, address=None, ports=ports)


def host_problem(text: str) -> str | None:
    """Why ``text`` cannot be an allowlist entry, or None if it can.

    A name has at least two labels; a wildcard may only be the whole first label, under a
    registrable domain: ``*.example.com`` is fine, ``*``, ``*.com`` and ``*.co.uk`` are refused
    because they cover domains that anyone can register.
    """
    try:
        where, _ = _split_port(text)
    except HostError as exc:
        return str(exc)
    if _ip_literal(where) is not None:
        return None
    if where.startswith("[") or where.count(":") > 1:
        return f"{text!r} is not a host: {where!r} is not an IP address"
    wildcard = where.startswith("*.")
    if where == "*" or "*" in where[2 if wildcard else 0 :]:
        return (
            f"{text!r} is not a host: a wildcard may only be the first label, as in '*.example.com'"
        )
    try:
        name = _a_label(where[2:] if wildcard else where)
    except HostError as exc:
        return f"{text!r} is not a host: {exc}"
    labels = name.split(".")
    if labels[-1].isdigit():
        return f"{text!r} is not a host: a name cannot end in a number; write an IP address whole"
    public = (
        len(labels) == 1
        or name in _SHARED_SUFFIXES
        or (len(labels) == 2 and len(labels[1]) == 2 and labels[0] in _CC_SECOND_LEVELS)
    )
    if len(labels) == 1 and not wildcard:
        return f"{text!r} is not a host: name a full host under a domain, e.g. 'api.example.com'"
    if public and wildcard:
        return (
            f"{text!r} is not a host: it is too broad, covering every domain under the public "
            f"suffix {name!r}; put the wildcard under a registrable domain, e.g. '*.example.{name}'"
        )
    if public:
        return f"{text!r} is not a host: it is a public suffix; name a host under it"
    return None


def parse_network(text: str) -> IPNetwork:
    """Parse one ``allow_addresses`` entry: an address or a network in CIDR form.

    Networks wider than /8 (IPv4) or /32 (IPv6) are refused: an allowance is for a known
    internal service, not for a whole address family.
    """
    try:
        network = ipaddress.ip_network(text.strip(), strict=True)
    except ValueError as exc:
        raise HostError(
            f"{text!r} is not an address or network: {exc}; write '10.20.0.5' or '10.20.0.0/16'"
        ) from None
    narrowest = NARROWEST_V4_PREFIX if network.version == 4 else NARROWEST_V6_PREFIX
    if network.prefixlen < narrowest:
        raise HostError(
            f"{text!r} is too broad for allow_addresses: use a prefix of at least /{narrowest}, "
            "covering the internal services the profile needs"
        )
    return network


def normalise_host(host: str) -> str | IPAddress:
    """The comparable form of a host a program asked for: an address, or a lower-case A-label.

    Raises:
        HostError: when ``host`` is neither a valid name nor an IP literal.
    """
    literal = _ip_literal(host)
    if literal is not None:
        return literal
    if host.startswith("[") or ":" in host:
        raise HostError(f"{_shown(host)} is not a host name or IP address")
    return _a_label(host)


def _split_port(text: str) -> tuple[str, tuple[int, ...]]:
    """``host`` and its ports from ``host``, ``host:p``, ``host:p,q`` or ``[v6]:p``."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise HostError(f"{text!r} is not a host: '[' without ']'; write '[2001:db8::1]:443'")
        where, rest = text[: end + 1], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise HostError(f"{text!r} is not a host: expected ':PORT' after ']'")
        return where, _ports(text, rest[1:]) if rest else DEFAULT_PORTS
    if text.count(":") == 1:
        where, spec = text.split(":")
        return where, _ports(text, spec)
    return text, DEFAULT_PORTS  # a name, or an IPv6 literal without brackets (no port)


def _ports(text: str, spec: str) -> tuple[int, ...]:
    ports: list[int] = []
    for part in spec.split(","):
        if not part.isdigit() or not 1 <= int(part) <= 65535:
            raise HostError(
                f"{text!r} is not a host: its port {part!r} is invalid; write ports from 1 to "
                "65535, comma-separated, as in 'api.example.com:443,8443'"
            )
        if int(part) not in ports:
            ports.append(int(part))
    return tuple(ports)


def _ip_literal(where: str) -> IPAddress | None:
    bare = where[1:-1] if where.startswith("[") and where.endswith("]") else where
    if "%" in bare:  # a scoped IPv6 address names an interface, which a sandbox has no say over
        return None
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        return None
    if address.version == 4 and where.startswith("["):
        return None
    return address


def _a_label(name: str) -> str:
    """The lower-case A-label form of ``name``, checked label by label."""
    name = name[:-1] if name.endswith(".") else name
    try:
        ascii_name = name.lower() if name.isascii() else name.encode("idna").decode("ascii")
    except UnicodeError:
        raise HostError(f"{_shown(name)} is not a valid internationalised name") from None
    labels = ascii_name.lower().split(".")
    if not ascii_name or len(ascii_name) > 253 or not all(_LABEL.match(lb) for lb in labels):
        raise HostError(f"{_shown(name)} is not a host name: use labels of letters, digits and '-'")
    return ascii_name.lower()


def _shown(host: str) -> str:
    """``host`` for a message: quoted, non-printable characters escaped, at most 80 long."""
    text = ascii(host[:80])
    return text if len(host) <= 80 else text[:-1] + "...'"
