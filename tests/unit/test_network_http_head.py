"""Strict request heads: what the proxy accepts, and the ambiguous forms it refuses."""

from __future__ import annotations

import pytest

from sandcell.network.http_head import (
    Authority,
    BodyFraming,
    HeadError,
    body_framing,
    close_response_head,
    end_to_end,
    forward_head,
    parse_request_head,
    split_absolute_url,
    split_authority,
)


def head(text: str) -> bytes:
    return text.replace("\n", "\r\n").encode("latin-1")


def test_a_plain_request_is_forwarded_in_origin_form_with_hop_by_hop_headers_dropped() -> None:
    parsed = parse_request_head(
        head(
            "GET http://api.example.com/a?b=1 HTTP/1.1\nHost: api.example.com\n"
            "Proxy-Authorization: Basic eA==\nConnection: keep-alive, X-Private\n"
            "X-Private: 1\nAccept: */*\n\n"
        ),
        max_headers=100,
    )
    authority, path = split_absolute_url(parsed.target)
    assert authority == Authority(host="api.example.com", port=80) and path == "/a?b=1"
    assert forward_head(parsed, path) == head(
        "GET /a?b=1 HTTP/1.1\nHost: api.example.com\nAccept: */*\nConnection: close\n\n"
    )


@pytest.mark.parametrize("named", ["Host", "close, content-length", "TRANSFER-ENCODING"])
def test_a_connection_header_may_not_name_what_the_proxy_relies_on(named: str) -> None:
    parsed = parse_request_head(
        head(f"POST http://a.example/ HTTP/1.1\nHost: a.example\nConnection: {named}\n\n"),
        max_headers=100,
    )
    for step in (end_to_end, lambda h: forward_head(h, "/")):
        with pytest.raises(HeadError) as info:
            step(parsed)
        assert info.value.status == 400 and "the Connection header names" in info.value.message


def test_the_end_to_end_head_is_what_is_forwarded() -> None:
    parsed = parse_request_head(
        head("GET http://a.example/ HTTP/1.1\nHost: a.example\nConnection: X-A\nX-A: 1\n\n"),
        max_headers=100,
    )
    forwarded = end_to_end(parsed)
    assert forwarded.headers == (("Host", "a.example"),)
    assert forward_head(forwarded, "/") == forward_head(parsed, "/")


@pytest.mark.parametrize(
    ("raw", "status", "words"),
    [
        ("GET http://a.example/ HTTP/1.1\nHost: a\n", 400, "empty line"),
        ("GET http://a.example/ HTTP/1.1\r\nHost: a\n\n", 400, "bare CR or LF"),
        ("GET  http://a.example/ HTTP/1.1\n\n", 400, "request line"),
        ("GET http://a.example/ HTTP/2.0\n\n", 505, "HTTP/1.0 and HTTP/1.1"),
        ("G(T http://a.example/ HTTP/1.1\n\n", 400, "invalid method"),
        ("GET http://a.example/ HTTP/1.1\nHost: a\n  folded\n\n", 400, "folded"),
        ("GET http://a.example/ HTTP/1.1\nHost : a\n\n", 400, "Name: value"),
        ("GET http://a.example/ HTTP/1.1\nX: a\x00b\n\n", 400, "Name: value"),
        ("GET http://a.example/ HTTP/1.1\n" + "X: 1\n" * 101 + "\n", 431, "header lines"),
    ],
)
def test_malformed_heads_are_refused(raw: str, status: int, words: str) -> None:
    with pytest.raises(HeadError) as info:
        parse_request_head(head(raw), max_headers=100)
    assert info.value.status == status and words in info.value.message


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("/path", "absolute URL"),
        ("https://a.example/", "use CONNECT"),
        ("ftp://a.example/", "not forwarded"),
        ("http://user@a.example/", "user information"),
        ("http://allowed.example@evil.example/", "user information"),
        ("http:///path", "no host"),
        ("http://a.example:99999/", "host:port"),
        ("http://::1/", "brackets"),
    ],
)
def test_bad_urls_are_refused(target: str, words: str) -> None:
    with pytest.raises(HeadError) as info:
        split_absolute_url(target)
    assert words in info.value.message


def test_authorities() -> None:
    assert split_authority("a.example:443", default_port=None) == Authority(
        host="a.example", port=443
    )
    assert split_authority("[::1]:8443", default_port=None) == Authority(host="::1", port=8443)
    assert split_authority("[::1]", default_port=80) == Authority(host="::1", port=80)
    with pytest.raises(HeadError, match="has no port"):
        split_authority("a.example", default_port=None)
    with pytest.raises(HeadError):
        split_authority("[::1]x:1", default_port=None)


def test_body_framing_refuses_what_two_parsers_could_read_differently() -> None:
    def framing(extra: str) -> BodyFraming:
        raw = head(f"POST http://a.example/ HTTP/1.1\n{extra}\n")
        return body_framing(parse_request_head(raw, max_headers=10))

    assert framing("") == BodyFraming()
    assert framing("Content-Length: 5\n") == BodyFraming(length=5)
    assert framing("Content-Length: 5\nContent-Length: 5\n") == BodyFraming(length=5)
    assert framing("Transfer-Encoding: Chunked\n") == BodyFraming(chunked=True)
    for extra, status in [
        ("Content-Length: 5\nTransfer-Encoding: chunked\n", 400),
        ("Content-Length: 5\nContent-Length: 6\n", 400),
        ("Content-Length: -1\n", 400),
        ("Content-Length: 0x10\n", 400),
        ("Transfer-Encoding: gzip, chunked\n", 501),
        ("Transfer-Encoding: chunked\nTransfer-Encoding: chunked\n", 501),
    ]:
        with pytest.raises(HeadError) as info:
            framing(extra)
        assert info.value.status == status, extra


def test_a_response_head_is_made_to_close() -> None:
    raw = head(
        "HTTP/1.1 200 OK\nConnection: keep-alive, X-Hop\nX-Hop: 1\nKeep-Alive: 5\n"
        "Content-Length: 2\n\n"
    )
    assert close_response_head(raw) == head(
        "HTTP/1.1 200 OK\nContent-Length: 2\nConnection: close\n\n"
    )
    with pytest.raises(HeadError) as info:
        close_response_head(b"SSH-2.0-x\r\n\r\n")
    assert info.value.status == 502
