"""Address classes, the allow decision, and resolving a name exactly once."""

from __future__ import annotations

import ipaddress

import pytest

from sandcell.network.addresses import (
    MapResolver,
    address_problem,
    classify,
    resolve_pinned,
    system_resolver,
)
from sandcell.network.allowlist import parse_allowlist


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("93.184.216.34", "public"),
        ("2606:2800:220:1:248:1893:25c8:1946", "public"),
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "cgnat"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.100.100.200", "metadata"),
        ("168.63.129.16", "metadata"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("192.0.2.1", "private"),  # documentation range: not global
        # IPv6 forms that embed an IPv4 address are judged by it.
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "metadata"),
        ("::ffff:10.0.0.1", "private"),
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::1", "metadata"),  # 6to4 of 169.254.169.254
        ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
        ("64:ff9b::7f00:1", "loopback"),  # NAT64 of 127.0.0.1
        ("64:ff9b:1::5db8:d822", "private"),  # local-use NAT64 prefix
        ("::7f00:1", "loopback"),  # IPv4-compatible (deprecated) 127.0.0.1
    ],
)
def test_classify(address: str, kind: str) -> None:
    assert classify(ipaddress.ip_address(address)).kind == kind


def test_an_embedded_address_is_named_in_the_reason() -> None:
    address = ipaddress.ip_address("::ffff:169.254.169.254")
    text = classify(address).describe(address)
    assert "metadata" in text and "169.254.169.254" in text


def test_only_public_addresses_pass_by_default() -> None:
    allow = parse_allowlist(("api.example.com",))
    assert address_problem(ipaddress.ip_address("93.184.216.34"), allow) is None
    problem = address_problem(ipaddress.ip_address("127.0.0.1"), allow)
    assert problem is not None and "loopback" in problem and "allow_addresses" in problem
    assert address_problem(ipaddress.ip_address("::ffff:7f00:1"), allow) is not None


def test_allow_addresses_and_listed_literals_open_exactly_what_they_name() -> None:
    allow = parse_allowlist(("api.example.com", "169.254.169.254:80"), ("10.20.0.0/16",))
    assert address_problem(ipaddress.ip_address("10.20.3.4"), allow) is None
    assert address_problem(ipaddress.ip_address("10.21.0.1"), allow) is not None
    assert address_problem(ipaddress.ip_address("169.254.169.254"), allow) is None
    assert address_problem(ipaddress.ip_address("169.254.170.2"), allow) is not None
    # An allowance for an IPv4 network does not cover the IPv6 forms embedding it.
    assert address_problem(ipaddress.ip_address("::ffff:10.20.3.4"), allow) is not None


def test_a_name_is_refused_when_any_answer_is_refused() -> None:
    allow = parse_allowlist(("api.example.com",))
    resolver = MapResolver({"api.example.com": ["93.184.216.34", "10.0.0.1"]})
    pinned = resolve_pinned("api.example.com", 443, allow, resolver)
    assert pinned.refused and pinned.addresses == ()
    assert pinned.problem is not None and "10.0.0.1" in pinned.problem


def test_resolution_happens_once_and_its_answers_are_kept() -> None:
    allow = parse_allowlist(("api.example.com",))
    resolver = MapResolver({"api.example.com": [["93.184.216.34"], ["127.0.0.1"]]})
    first = resolve_pinned("api.example.com", 443, allow, resolver)
    assert first.addresses == (ipaddress.ip_address("93.184.216.34"),)
    assert resolver.calls == {"api.example.com": 1}
    second = resolve_pinned("api.example.com", 443, allow, resolver)
    assert second.refused and "loopback" in str(second.problem)


def test_a_name_that_does_not_resolve_is_not_a_refusal_of_an_address() -> None:
    allow = parse_allowlist(("api.example.com",))
    pinned = resolve_pinned("api.example.com", 443, allow, MapResolver({}))
    assert not pinned.refused and "does not resolve" in str(pinned.problem)


def test_the_system_resolver_answers_numerically_without_the_network() -> None:
    assert system_resolver("127.0.0.1", 80) == (ipaddress.ip_address("127.0.0.1"),)


def test_ipv6_forms_of_a_public_address_stay_public() -> None:
    for text in ("::ffff:93.184.216.34", "64:ff9b::5db8:d822"):
        assert classify(ipaddress.ip_address(text)).kind == "public", text
