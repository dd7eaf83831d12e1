"""Keyless access for the service's own user over its local Unix socket.

Over TCP every ``/v1`` request carries a tenant's API key. Over the Unix socket a request
without one is taken to come from the *local owner* when the connecting process runs as the
same user as the service: the kernel says who connected (``SO_PEERCRED``, the credentials of the
process at ``connect()``), which no client can forge, and that user can already run sandcell
in-process on the same home, read its stores and start or stop the service, so a key would
protect nothing from it. Exactly the service's effective uid counts: root connecting to a
service that runs as another user is refused like any other uid (it can run the command as
that user), so the rule has no exception to audit. Any other uid that can reach the socket (its
mode is 0600, so only after someone widened it) must send a key, as over TCP; without one it
gets 401. A request that sends a key is that key's tenant wherever it comes from. A sandboxed
program runs as the service's uid on the host (its user namespace maps to the caller's), so
this holds only because no sandbox can reach the socket: it lives in the sandcell home, which
no sandbox mounts.

The local owner is a tenant like the others for scoping and records: by default the built-in
``@local`` (a name ``sandcell tenants add`` cannot make, so no key can ever act as it), allowed
every installed profile with ``strict`` first, as in-process, and without quotas, as
in-process; or, with ``sandcell serve --local-tenant NAME``, that tenant: its profiles, its
quotas, what it owns.
"""

from __future__ import annotations

import socket
import struct
from typing import TYPE_CHECKING, Any

from sandcell.policy.profiles import DEFAULT_PROFILE, builtin_names, default_profile_dir
from sandcell.service.tenants import Tenant

if TYPE_CHECKING:
    import asyncio

__all__ = ["LOCAL_TENANT", "PEER_UID", "builtin_local_tenant", "peer_uid", "protocol_class"]

PEER_UID = "sandcell.peer_uid"
"""Key of the connecting process's uid in a request's ``scope["state"]`` (Unix socket only)."""
LOCAL_TENANT = "@local"
_UNLIMITED = 2**62
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_uid(sock: Any) -> int | None:
    """The uid of the process at the other end of a connected Unix socket; None for any other
    kind of socket."""
    if getattr(sock, "family", None) != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    _pid, uid, _gid = _CRED.unpack(raw)
    return int(uid)


def protocol_class() -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, which also puts the peer's uid of a Unix-socket connection into
    the state of each of its requests."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class PeerProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            uid = peer_uid(transport.get_extra_info("socket"))
            if uid is not None:
                # Each request's scope["state"] is a copy of this: the peer travels with the
                # connection's requests, and nothing a client sends can set it.
                state: dict[str, Any] = self.app_state  # type: ignore[has-type]
                self.app_state = {**state, PEER_UID: uid}

    return PeerProtocol


def _installed_profiles() -> tuple[str, ...]:
    names = [*builtin_names()]
    folder = default_profile_dir()
    if folder.is_dir():
        names += sorted(p.stem for p in folder.glob("*.toml"))
    return tuple(dict.fromkeys([DEFAULT_PROFILE, *names]))


def builtin_local_tenant() -> Tenant:
    """The local owner when no ``--local-tenant`` is set: every installed profile (read on each
    request, so a profile added later is usable), ``strict`` first, no quotas."""
    return Tenant(
        # Its id is its name: it is never added or removed, so no other tenant can take it.
        id=LOCAL_TENANT,
        name=LOCAL_TENANT,
        profiles=_installed_profiles(),
        max_concurrent=_UNLIMITED,
        runs_per_minute=_UNLIMITED,
        cpu_seconds_per_day=_UNLIMITED,
        max_stored_bytes=_UNLIMITED,
        created_at="",
    )
