"""Serving the application: uvicorn on a loopback TCP port and a local Unix socket at once.

The sockets are bound here, before uvicorn starts, so that the port is known (``--port 0``
picks a free one) and the Unix socket is made private (0600) before anyone can connect. On
SIGTERM or SIGINT uvicorn stops accepting, waits for the requests in flight (a synchronous run
is one), then the application's lifespan waits for the asynchronous runs (see
:meth:`Service.drain`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.errors import ConfigError

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["bind_tcp", "bind_unix", "is_loopback", "run_server"]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP by name: asyncio turns Nagle off only on sockets whose proto says TCP, and
    # with Nagle on, a response written in two parts waits for the client's delayed ACK (40 ms
    # per request on a kept-alive connection).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror}; is another service running there? "
            "choose another --port"
        ) from exc
    sock.listen(512)
    sock.set_inheritable(True)
    return sock


def bind_unix(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, 0600; a stale one (nobody listening) is replaced,
    a live one is refused."""
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()
        else:
            raise ConfigError(
                f"a service already listens on {path}; stop it first, or give another --socket"
            )
        finally:
            probe.close()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot create the socket {path}: {exc.strerror}") from exc
    finally:
        os.umask(old)
    sock.listen(512)
    return sock


def run_server(app: FastAPI, sockets: list[socket.socket], *, log_level: str = "info") -> None:
    """Serve ``app`` on the bound ``sockets`` until SIGTERM or SIGINT; returns after the
    graceful stop."""
    import asyncio

    import uvicorn

    from sandcell.service.local_owner import protocol_class

    config = uvicorn.Config(
        app,
        # Tells the application which uid connected over the Unix socket (keyless local owner).
        http=protocol_class(),
        log_level=log_level,
        lifespan="on",
        # Wait for every request in flight: a synchronous run ends, and is recorded, before
        # the service exits.
        timeout_graceful_shutdown=None,
        # Longer than a client's idle keep-alive (httpx: 5 s, uvicorn's own default too): with
        # equal timers a loaded service closed idle connections just as a client reused one,
        # and its request was answered with a connection reset (seen in bench/soak.py).
        timeout_keep_alive=30,
        access_log=False,
    )
    unix_paths = [sock.getsockname() for sock in sockets if sock.family == socket.AF_UNIX]

    def remove_sockets() -> None:
        for path in unix_paths:
            with contextlib.suppress(OSError):
                os.unlink(path)

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            await super().shutdown(sockets=sockets)
            # Here, not after serve() returns: uvicorn then re-raises the signal it caught,
            # which ends the process before any later code runs.
            remove_sockets()

    try:
        asyncio.run(Server(config).serve(sockets=sockets))
    finally:
        remove_sockets()
        for sock in sockets:
            sock.close()
        sys.stdout.flush()
