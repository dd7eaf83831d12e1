"""The channel between host and guest agent: handshake and framing, against hostile input."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from sandcell.backends.microvm import channel
from sandcell.backends.microvm.channel import ChannelError, FrameReader, encode
from sandcell.backends.microvm.guest import files as guest_files
from sandcell.backends.microvm.guest.port import Port


def test_frames_round_trip_in_any_split() -> None:
    stream = encode(b"O", b"hello") + encode(b"X", b"{}") + encode(b"Z")
    for cut in range(len(stream) + 1):
        reader = FrameReader()
        got = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert got == [(b"O", b"hello"), (b"X", b"{}"), (b"Z", b"")]


def test_oversized_and_unknown_frames_are_refused() -> None:
    with pytest.raises(ChannelError, match="frame of"):
        FrameReader().feed(channel.HEADER.pack(b"O", channel.MAX_FRAME + 1))
    with pytest.raises(ChannelError, match="unknown frame type"):
        FrameReader().feed(encode(b"J", b"{}"))  # a host-to-guest type, from the guest
    with pytest.raises(ValueError, match="not sendable"):
        encode(b"O", b"x" * (channel.MAX_FRAME + 1))


def test_chunks_split_large_data() -> None:
    data = b"a" * (channel.MAX_FRAME * 2 + 5)
    frames = channel.chunks(b"S", data)
    assert len(frames) == 3
    reader = FrameReader(frozenset({b"S"}))
    assert b"".join(p for _, p in reader.feed(b"".join(frames))) == data
    assert channel.chunks(b"S", b"") == []


def test_handshake_with_the_real_agent_code_survives_noise() -> None:
    """The host greets, the agent (its own code, over a socket pair) answers; garbage before
    the greeting (bytes of a restore) is skipped, and frames after it parse on both sides."""
    host_sock, guest_sock = socket.socketpair()
    port = object.__new__(Port)
    port.fd = guest_sock.fileno()
    port.buf = bytearray()
    port.early = []
    got: list[tuple[bytes, bytes]] = []

    def guest() -> None:
        port.handshake()
        port.send(b"O", b"from the guest")
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got.extend(port.frames(0.1))

    t = threading.Thread(target=guest)
    host_sock.sendall(b"\x00\xffgarbage of a half-loaded device\n")
    t.start()
    chan = channel.Channel(host_sock)
    chan.handshake(time.monotonic() + 10)
    assert chan.recv(time.monotonic() + 10) == (b"O", b"from the guest")
    chan.send(b"J", b'{"a": 1}')
    t.join(10)
    assert got == [(b"J", b'{"a": 1}')]
    chan.close()
    guest_sock.close()


def test_handshake_times_out_on_a_silent_guest() -> None:
    host_sock, guest_sock = socket.socketpair()
    chan = channel.Channel(host_sock)
    with pytest.raises(channel.ChannelTimeout):
        chan.handshake(time.monotonic() + 0.2)
    chan.close()
    guest_sock.close()


def test_agent_export_globs_match_like_the_host() -> None:
    assert guest_files.glob_match(["out", "a.png"], ["out/*.png"])
    assert guest_files.glob_match(["a", "b", "c.csv"], ["**/*.csv"])
    assert guest_files.glob_match(["c.csv"], ["**/*.csv"])
    assert not guest_files.glob_match(["out", "a.txt"], ["out/*.png"])
    assert guest_files._may_descend(["out"], ["out/*.png"])
    assert not guest_files._may_descend(["other"], ["out/*.png"])
