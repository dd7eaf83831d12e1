"""Strict parsing of the HTTP/1 heads the egress proxy reads and writes.

Pure functions over bytes. Anything ambiguous is refused rather than guessed at, because a
proxy and a server that read the same bytes differently is how requests get smuggled: folded
header lines, bare line feeds, a body framed both by ``Content-Length`` and by
``Transfer-Encoding``, two ``Host`` headers, user information in a URL, are all errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandcell.errors import SandcellError

_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_TARGET = re.compile(rb"^[\x21-\x7e]+$")
_FIELD_VALUE = re.compile(rb"^[\t\x20-\x7e\x80-\xff]*$")
_VERSIONS = (b"HTTP/1.0", b"HTTP/1.1")
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    }
)
"""Headers meaningful only between the program and the proxy; never forwarded."""
RELIED_ON = ("host", "content-length", "transfer-encoding")
"""End-to-end headers the proxy checks (the host) or frames the body by: a ``Connection``
header may not name them, since removing them after the checks would let the server read the
request (and the body as a second request) otherwise than the proxy did."""


class HeadError(SandcellError):
    """A head the proxy will not act on; ``status`` is the HTTP answer to give."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestHead:
    """A parsed request line and its headers (names as sent, values stripped)."""

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]

    def values(self, name: str) -> tuple[str, ...]:
        """The values of every header called ``name`` (case-insensitive)."""
        return tuple(v for k, v in self.headers if k.lower() == name.lower())


@dataclass(frozen=True, slots=True, kw_only=True)
class Authority:
    """A host and port taken from a request; ``host`` is still the text as sent."""

    host: str
    port: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BodyFraming:
    """How the request body after the head ends."""

    chunked: bool = False
    length: int = 0
    """Bytes of body when not chunked (0: none)."""


def parse_request_head(raw: bytes, *, max_headers: int) -> RequestHead:
    """Parse ``raw``, a request head ending in an empty line.

    Raises:
        HeadError: 400 for malformed heads, 431 for too many headers, 505 for other versions.
    """
    if not raw.endswith(b"\r\n\r\n"):
        raise HeadError(400, "the request head does not end with an empty line")
    lines = raw[:-4].split(b"\r\n")
    if any(b"\n" in line or b"\r" in line for line in lines):
        raise HeadError(400, "a line of the request head ends in a bare CR or LF")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise HeadError(400, "the request line is not 'METHOD TARGET HTTP/1.1'")
    method, target, version = parts
    if not _TOKEN.match(method) or not _TARGET.match(target):
        raise HeadError(400, "the request line has an invalid method or target")
    if version not in _VERSIONS:
        raise HeadError(505, "only HTTP/1.0 and HTTP/1.1 are spoken by the proxy")
    if len(lines) - 1 > max_headers:
        raise HeadError(431, f"more than {max_headers} header lines")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            raise HeadError(400, "folded header lines are not accepted")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name) or not _FIELD_VALUE.match(value):
            raise HeadError(400, "a header line is not 'Name: value'")
        headers.append((name.decode("ascii"), value.strip(b" \t").decode("latin-1")))
    return RequestHead(
        method=method.decode("ascii"),
        target=target.decode("ascii"),
        version=version.decode("ascii"),
        headers=tuple(headers),
    )


def split_authority(text: str, *, default_port: int | None) -> Authority:
    """``host:port`` or ``[v6]:port`` (the port optional when ``default_port`` is given).

    Raises:
        HeadError: 400 when the text is not an authority.
    """
    if text.startswith("["):
        end = text.find("]")
        host, rest = (text[1:end], text[end + 1 :]) if end > 0 else ("", "")
        if not host or (rest and not rest.startswith(":")):
            raise HeadError(400, f"{text[:80]!a} is not 'host:port'")
        port_text = rest[1:] if rest else None
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
        if ":" in host:
            raise HeadError(400, f"{text[:80]!a}: write an IPv6 address in brackets")
    else:
        host, port_text = text, None
    if port_text is None:
        if default_port is None:
            raise HeadError(400, f"{text[:80]!a} has no port; CONNECT needs 'host:port'")
        return Authority(host=host, port=default_port)
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535 or not host:
        raise HeadError(400, f"{text[:80]!a} is not 'host:port'")
    return Authority(host=host, port=int(port_text))


def split_absolute_url(target: str) -> tuple[Authority, str]:
    """The authority and the origin-form path of an absolute ``http://`` URL.

    Raises:
        HeadError: 400 for another scheme, user information, or a URL without a host.
    """
    scheme, sep, rest = target.partition("://")
    if not sep:
        raise HeadError(
            400, "this is a proxy: send the absolute URL (GET http://host/path) or CONNECT"
        )
    if scheme.lower() != "http":
        raise HeadError(400, f"scheme {scheme[:20]!a} is not forwarded: use CONNECT for https")
    cut = min(
        (i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest)
    )
    authority, path = rest[:cut], rest[cut:]
    if "@" in authority:
        raise HeadError(400, "user information in the URL is not accepted")
    if not authority:
        raise HeadError(400, "the URL has no host")
    path = path.split("#", 1)[0]
    if not path.startswith("/"):
        path = "/" + path
    return split_authority(authority, default_port=80), path


def body_framing(head: RequestHead) -> BodyFraming:
    """How the body of ``head`` is framed.

    Raises:
        HeadError: 400 for contradictory or invalid framing, 501 for a transfer coding other
        than ``chunked``.
    """
    encodings = head.values("transfer-encoding")
    lengths = head.values("content-length")
    if encodings and lengths:
        raise HeadError(400, "both Transfer-Encoding and Content-Length frame the body")
    if encodings:
        if [e.strip().lower() for e in encodings] != ["chunked"]:
            raise HeadError(501, "only 'Transfer-Encoding: chunked' is forwarded")
        if head.version == "HTTP/1.0":
            raise HeadError(400, "an HTTP/1.0 request cannot have a chunked body")
        return BodyFraming(chunked=True)
    if not lengths:
        return BodyFraming()
    values = {v.strip() for v in lengths}
    if len(values) != 1 or not next(iter(values)).isdigit() or len(next(iter(values))) > 15:
        raise HeadError(400, "an invalid Content-Length")
    return BodyFraming(length=int(next(iter(values))))


def end_to_end(head: RequestHead) -> RequestHead:
    """``head`` as it will be forwarded: the hop-by-hop headers, and those its ``Connection``
    headers name, removed. Check and frame the request on this, not on ``head``.

    Raises:
        HeadError: 400 when a ``Connection`` header names Host, Content-Length or
        Transfer-Encoding.
    """
    named = {
        token.strip().lower() for value in head.values("connection") for token in value.split(",")
    }
    relied = [name for name in RELIED_ON if name in named]
    if relied:
        raise HeadError(
            400,
            f"the Connection header names {', '.join(relied)}, which the proxy checks or frames "
            "the request by; name only hop-by-hop headers there (or send Connection: close)",
        )
    return RequestHead(
        method=head.method,
        target=head.target,
        version=head.version,
        headers=tuple(
            (name, value)
            for name, value in head.headers
            if name.lower() not in HOP_BY_HOP and name.lower() not in named
        ),
    )


def with_header(head: RequestHead, name: str, value: str) -> RequestHead:
    """``head`` with one more header, first."""
    return RequestHead(
        method=head.method,
        target=head.target,
        version=head.version,
        headers=((name, value), *head.headers),
    )


def forward_head(head: RequestHead, path: str) -> bytes:
    """The head to send the server: origin-form target, the :func:`end_to_end` headers,
    ``Connection: close`` (one request per connection).

    Raises:
        HeadError: as :func:`end_to_end`. On a head that went through it already, nothing is
        removed a second time: what was checked is what is sent.
    """
    lines = [f"{head.method} {path} {head.version}"]
    lines += [f"{name}: {value}" for name, value in end_to_end(head).headers]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def close_response_head(raw: bytes) -> bytes:
    """A server's response head with its connection headers replaced by ``Connection: close``.

    Raises:
        HeadError: 502 when ``raw`` is not a response head.
    """
    lines = raw[:-4].split(b"\r\n") if raw.endswith(b"\r\n\r\n") else []
    if not lines or not re.match(rb"^HTTP/1\.[01] [0-9]{3}( |$)", lines[0]):
        raise HeadError(502, "the server did not answer with an HTTP/1 response")
    named = {
        token.strip().lower()
        for line in lines[1:]
        if line.partition(b":")[0].strip().lower() == b"connection"
        for token in line.partition(b":")[2].split(b",")
    }
    kept = [lines[0]] + [
        line
        for line in lines[1:]
        if (key := line.partition(b":")[0].strip().lower()).decode("latin-1") not in HOP_BY_HOP
        and key not in named
    ]
    return b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n"
