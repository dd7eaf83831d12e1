"""From a host a program asked for to an open connection, or a refusal saying why.

:meth:`Gate.check` decides on the name alone (is it a host, is it on the allowlist, on that
port); :meth:`Gate.connect` resolves it once, checks every address, and connects to a checked
address by number (:mod:`sandcell.network.addresses`).
"""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import Executor
from dataclasses import dataclass

from sandcell.errors import SandcellError
from sandcell.network.addresses import Resolver, address_problem, resolve_pinned
from sandcell.network.allowlist import Allowlist, HostError, IPAddress, normalise_host


class Refusal(SandcellError):
    """The proxy will not make this connection; ``status`` is the HTTP answer."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A host on the allowlist, normalised, and its port."""

    host: str | IPAddress
    port: int

    @property
    def shown(self) -> str:
        """The host as records and messages show it."""
        return str(self.host)


@dataclass(frozen=True, slots=True, kw_only=True)
class Connected:
    """An open connection to a checked address."""

    address: IPAddress
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


@dataclass(frozen=True, slots=True, kw_only=True)
class Gate:
    """The checks of one run's proxy."""

    profile: str
    allowlist: Allowlist
    resolver: Resolver
    executor: Executor
    """Where the (blocking) resolver runs, off the event loop."""
    connect_timeout_s: float

    def check(self, host_text: str, port: int) -> Target:
        """The normalised target, if the allowlist allows it.

        Raises:
            Refusal: 400 for a host that is not one, 403 for one not allowed.
        """
        try:
            host = normalise_host(host_text)
        except HostError as exc:
            raise Refusal(400, str(exc)) from None
        if self.allowlist.rule_for(host, port) is not None:
            return Target(host=host, port=port)
        where = f"profile {self.profile}'s allowlist"
        if not isinstance(host, str):
            raise Refusal(
                403, f"{host} is an IP address that {where} does not list; connect by host name"
            )
        ports = sorted({p for r in self.allowlist.rules for p in r.ports if r.matches(host, p)})
        if ports:
            raise Refusal(
                403,
                f"port {port} of host {host} is not in {where} "
                f"(it allows port {', '.join(map(str, ports))})",
            )
        raise Refusal(403, f"host {host} is not in {where}")

    async def connect(self, target: Target) -> Connected:
        """Resolve once, check every address, connect to the first that answers.

        Raises:
            Refusal: 403 for a refused address, 502 when the name does not resolve or nothing
            accepts the connection, 504 when connecting takes too long.
        """
        loop = asyncio.get_running_loop()
        if isinstance(target.host, str):
            lookup = loop.run_in_executor(
                self.executor,
                resolve_pinned,
                target.host,
                target.port,
                self.allowlist,
                self.resolver,
            )
            try:
                pinned = await asyncio.wait_for(lookup, self.connect_timeout_s)
            except TimeoutError:
                raise Refusal(504, f"resolving {target.host} took too long") from None
            if pinned.problem is not None:
                raise Refusal(403 if pinned.refused else 502, pinned.problem)
            addresses = pinned.addresses
        else:
            problem = address_problem(target.host, self.allowlist)
            if problem is not None:
                raise Refusal(403, problem)
            addresses = (target.host,)
        failure = ""
        timed_out = False
        for address in addresses:
            family = socket.AF_INET if address.version == 4 else socket.AF_INET6
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                # By number: the address just checked is the one connected to.
                await asyncio.wait_for(
                    loop.sock_connect(sock, (str(address), target.port)), self.connect_timeout_s
                )
            except TimeoutError:
                sock.close()
                timed_out, failure = True, f"{address}: no answer"
                continue
            except OSError as exc:
                sock.close()
                failure = f"{address}: {exc.strerror or exc}"
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader, writer = await asyncio.open_connection(sock=sock)
            return Connected(address=address, reader=reader, writer=writer)
        raise Refusal(
            504 if timed_out else 502,
            f"could not connect to {target.shown} port {target.port} ({failure})",
        )
