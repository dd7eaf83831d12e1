"""Reading the server name from a ClientHello: real hellos, every prefix, and hostile bytes."""

from __future__ import annotations

import random
import ssl
import struct

import pytest

from sandcell.network.sni import MAX_HELLO_BYTES, Hello, read_hello


def real_hello(server_name: str | None) -> bytes:
    """The first flight of Python's own TLS client (OpenSSL), asking for ``server_name``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def crafted_hello(extensions: list[tuple[int, bytes]]) -> bytes:
    """A minimal ClientHello with exactly these extensions, in one record."""
    body = b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    exts = b"".join(struct.pack("!HH", kind, len(data)) + data for kind, data in extensions)
    body += struct.pack("!H", len(exts)) + exts
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake


def sni(*names: bytes) -> bytes:
    entries = b"".join(b"\x00" + struct.pack("!H", len(n)) + n for n in names)
    return struct.pack("!H", len(entries)) + entries


def reframe(hello: bytes, size: int) -> bytes:
    """The same handshake split into records of ``size`` bytes."""
    handshake = hello[5:]
    return b"".join(
        b"\x16\x03\x01" + struct.pack("!H", len(part)) + part
        for part in (handshake[i : i + size] for i in range(0, len(handshake), size))
    )


def test_a_real_hello_names_its_server() -> None:
    assert read_hello(real_hello("api.example.com")) == Hello(server_name="api.example.com")
    assert read_hello(real_hello("API.Example.COM")).server_name == "api.example.com"


def test_a_real_hello_without_a_name_has_none() -> None:
    assert read_hello(real_hello(None)) == Hello(server_name=None)
    assert read_hello(real_hello("127.0.0.1")) == Hello(server_name=None)  # RFC 6066: no IPs


def test_every_prefix_of_a_hello_asks_for_more() -> None:
    hello = real_hello("api.example.com")
    for end in range(len(hello)):
        assert read_hello(hello[:end]) == Hello(incomplete=True), end


def test_a_hello_split_over_records_is_put_back_together() -> None:
    hello = real_hello("files.example.org")
    for size in (1, 7, 100):
        framed = reframe(hello, size)
        assert read_hello(framed).server_name == "files.example.org"
        assert read_hello(framed[:-1]).incomplete


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "not a handshake"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "not a handshake"),
        (b"\x16\x02\x00\x00\x05hello", "not TLS"),
        (b"\x16\x03\x01\x00\x00", "a record of 0 bytes"),
        (b"\x16\x03\x01\xff\xff", "a record of 65535 bytes"),
        (b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", "not a ClientHello"),
        (b"\x16\x03\x01\x00\x04\x01\xff\xff\xff", "a ClientHello of"),
    ],
)
def test_bytes_that_are_not_a_hello_are_refused(data: bytes, words: str) -> None:
    result = read_hello(data)
    assert result.problem is not None and words in result.problem, result


def test_crafted_names() -> None:
    assert read_hello(crafted_hello([(0, sni(b"a.example"))])).server_name == "a.example"
    assert read_hello(crafted_hello([(0, sni(b"a.example."))])).server_name == "a.example"
    assert read_hello(crafted_hello([])) == Hello(server_name=None)
    for extensions, words in [
        ([(0, sni(b"a.example")), (0, sni(b"b.example"))], "appears twice"),
        ([(0, sni(b"a.example", b"b.example"))], "two host names"),
        ([(0, sni(b"a example"))], "not a host name"),
        ([(0, sni(b"caf\xc3\xa9.example"))], "not ASCII"),
        ([(0, sni())], "without a host name"),
        ([(0, sni(b"a.example") + b"x")], "bytes after"),
        ([(0, b"\x00\x09\x00\x00\x09a.ex")], "runs past the end"),
        ([(0, sni(b"a.example")), (0xFE0D, b"\x00" * 8)], "encrypted ClientHello"),
    ]:
        result = read_hello(crafted_hello(extensions))
        assert result.problem is not None and words in result.problem, (extensions, result)


def test_a_hello_that_never_ends_is_cut_off_at_the_bound() -> None:
    # The largest hello allowed, which with its record headers cannot fit in the bound.
    claim = b"\x01" + (MAX_HELLO_BYTES - 4).to_bytes(3, "big")
    records = reframe(b"\x16\x03\x01\x00\x00" + claim + bytes(MAX_HELLO_BYTES), 16384)
    assert read_hello(records[: MAX_HELLO_BYTES // 2]).incomplete
    result = read_hello(records)
    assert result.problem is not None and "within" in result.problem


def test_random_and_mutated_bytes_never_break_the_parser() -> None:
    rng = random.Random(11)
    hello = real_hello("api.example.com")
    for _ in range(3000):
        if rng.random() < 0.5:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 600)))
            if rng.random() < 0.5:
                data = b"\x16\x03" + data
        else:
            mutated = bytearray(hello)
            for _ in range(rng.randrange(1, 6)):
                mutated[rng.randrange(len(mutated))] = rng.getrandbits(8)
            data = bytes(mutated[: rng.randrange(1, len(mutated) + 1)])
        result = read_hello(data)
        states = [result.incomplete, result.problem is not None, result.server_name is not None]
        assert sum(states) <= 1, (data, result)
