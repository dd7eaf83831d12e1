"""The egress allowlist: rule forms, normalisation, matching, and bad rules refused clearly."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from sandcell.errors import ConfigError
from sandcell.network.allowlist import (
    DEFAULT_PORTS,
    HostError,
    normalise_host,
    parse_allowlist,
    parse_network,
    parse_rule,
)
from sandcell.policy.profiles import ProfileError, load_profile, render_matrix


def test_a_bare_name_gets_the_default_ports() -> None:
    rule = parse_rule("api.example.com")
    assert rule.ports == DEFAULT_PORTS == (443, 80)
    assert rule.matches("api.example.com", 443) and rule.matches("api.example.com", 80)
    assert not rule.matches("api.example.com", 8443)
    assert not rule.matches("example.com", 443)
    assert not rule.matches("xapi.example.com", 443)


def test_explicit_ports_replace_the_defaults() -> None:
    rule = parse_rule("api.example.com:8443,9000,8443")
    assert rule.ports == (8443, 9000)
    assert rule.matches("api.example.com", 9000) and not rule.matches("api.example.com", 443)
    assert rule.show() == "api.example.com:8443,9000"


def test_a_wildcard_matches_below_the_domain_but_not_the_domain_itself() -> None:
    rule = parse_rule("*.example.com")
    assert rule.matches("a.example.com", 443)
    assert rule.matches("a.b.example.com", 443)
    assert not rule.matches("example.com", 443)
    assert not rule.matches("badexample.com", 443)
    assert not rule.matches("example.com.evil.net", 443)


def test_names_are_compared_as_lower_case_a_labels() -> None:
    rule = parse_rule("Bücher.Example.COM.")
    assert rule.name == "xn--bcher-kva.example.com"
    assert rule.matches(normalise_host("XN--BCHER-KVA.example.com"), 443)
    assert rule.matches(normalise_host("bücher.example.com"), 443)
    assert normalise_host("API.Example.com.") == "api.example.com"


def test_ip_literals_are_rules_only_when_listed() -> None:
    v4, v6 = parse_rule("203.0.113.7:443"), parse_rule("[2001:db8::7]:443")
    assert v4.address == ipaddress.ip_address("203.0.113.7") and v4.name is None
    assert v6.show() == "[2001:db8::7]:443"
    allow = parse_allowlist(("203.0.113.7:443", "api.example.com"))
    assert allow.rule_for(normalise_host("203.0.113.7"), 443) == v4
    assert allow.rule_for(normalise_host("203.0.113.8"), 443) is None
    assert allow.rule_for(normalise_host("[2001:db8::7]"), 443) is None
    # A name rule never matches an address, even the one the name resolves to.
    assert allow.rule_for(ipaddress.ip_address("93.184.216.34"), 443) is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("*.com", "too broad"),
        ("*.co.uk", "too broad"),
        ("*.github.io", "too broad"),
        ("github.io", "public suffix"),
        ("*", "wildcard may only be the first label"),
        ("a.*.example.com", "wildcard may only be the first label"),
        ("localhost", "full host under a domain"),
        ("api.example.com:0", "port '0' is invalid"),
        ("api.example.com:70000", "port '70000' is invalid"),
        ("api.example.com:", "port '' is invalid"),
        ("api.example.com:443;80", "is invalid"),
        ("[2001:db8::1", "'[' without ']'"),
        ("[api.example.com]:443", "is not an IP address"),
        ("ex ample.com", "labels of letters, digits and '-'"),
        ("-x.example.com", "labels of letters, digits and '-'"),
        ("1.2.3", "cannot end in a number"),
        ("a" * 64 + ".example.com", "labels of letters"),
    ],
)
def test_bad_rules_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(HostError) as info:
        parse_rule(text)
    assert words in str(info.value)
    assert isinstance(info.value, ConfigError)


@pytest.mark.parametrize("host", ["", "ex ample.com", "a..b", "[::1", "1.2.3.4:80", "x" * 300])
def test_requested_hosts_that_are_not_hosts_are_refused(host: str) -> None:
    with pytest.raises(HostError):
        normalise_host(host)


def test_allow_addresses_take_narrow_networks_only() -> None:
    assert parse_network("10.20.0.0/16") == ipaddress.ip_network("10.20.0.0/16")
    assert parse_network("127.0.0.1") == ipaddress.ip_network("127.0.0.1/32")
    with pytest.raises(HostError, match="too broad"):
        parse_network("0.0.0.0/0")
    with pytest.raises(HostError, match="too broad"):
        parse_network("::/0")
    with pytest.raises(HostError, match="not an address or network"):
        parse_network("10.20.0.1/16")  # host bits set: a typo more often than not
    with pytest.raises(HostError, match="not an address or network"):
        parse_network("intranet")


def test_a_profile_parses_into_frozen_rules(tmp_path: Path) -> None:
    path = tmp_path / "fetch.toml"
    path.write_text(
        '[network]\nmode = "allowlist"\n'
        'hosts = ["pypi.org", "*.pythonhosted.org:443", "[2001:db8::5]:8443"]\n'
        'allow_addresses = ["10.1.0.0/16"]\n'
    )
    profile = load_profile(str(path))
    rules = profile.network.allowlist.rules
    assert [r.show() for r in rules] == [
        "pypi.org:443,80",
        "*.pythonhosted.org:443",
        "[2001:db8::5]:8443",
    ]
    assert profile.network.allowlist.allow_addresses == (ipaddress.ip_network("10.1.0.0/16"),)
    assert "*.pythonhosted.org:443" in render_matrix(profile)
    assert "10.1.0.0/16" in render_matrix(profile)


def test_a_bad_allow_address_points_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        '[network]\nmode = "allowlist"\nhosts = ["pypi.org"]\n'
        'allow_addresses = [\n  "10.1.0.0/16",\n  "0.0.0.0/0",\n]\n'
    )
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    assert info.value.line == 6 and "too broad" in info.value.reason


def test_allow_addresses_need_allowlist_mode(tmp_path: Path) -> None:
    path = tmp_path / "none.toml"
    path.write_text('[network]\nallow_addresses = ["10.1.0.0/16"]\n')
    with pytest.raises(ProfileError, match="mode is 'none'"):
        load_profile(str(path))
