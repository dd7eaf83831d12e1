"""Relay details that decide whether bytes arrive: closing flushes, aborting after it is safe."""

from __future__ import annotations

import asyncio
import socket

from sandcell.network.relay import abort


def test_a_closed_stream_delivers_its_buffer_and_may_then_be_aborted() -> None:
    size = 4 * 2**20  # far more than the kernel buffers: most of it waits in the transport

    async def scenario() -> int:
        ours, theirs = socket.socketpair()
        _, writer = await asyncio.open_connection(sock=ours)
        writer.write(b"x" * size)

        def read_all() -> int:
            total = 0
            with theirs:
                while chunk := theirs.recv(65536):
                    total += len(chunk)
            return total

        received = asyncio.get_running_loop().run_in_executor(None, read_all)
        writer.close()
        await writer.wait_closed()
        abort(writer)  # what the proxy does to every connection at the end: must not raise
        return await received

    assert asyncio.run(scenario()) == size
