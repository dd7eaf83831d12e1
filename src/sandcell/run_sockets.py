"""The ways out of one run: its egress proxy and its tool gateway, served by the host on Unix
sockets in a private directory that the backend makes visible inside the sandbox.

A run (or a session) under a profile with ``[network] mode = "allowlist"`` or ``[tools]`` gets a
:class:`RunSockets`: a fresh 0700 directory with a short path (a socket path must fit in 108
bytes), the proxy's socket, the gateway's socket, and two standalone standard-library files the
sandbox runs (the loopback bridge and the ``sandcell_tools`` client). The executor opens it before
the program starts and closes it after the program ended; what the proxy and the gateway saw goes
into the run record.

What a backend does with it is :class:`SandboxSockets`, plain data: show ``host_dir`` read-only at
:data:`SANDBOX_DIR`, set :meth:`SandboxSockets.env` in the program's environment, put
:data:`SANDBOX_LIB` on the program's ``sys.path``, and, when ``egress`` is set, start
:meth:`SandboxSockets.bridge_argv` inside the sandbox's own network namespace before the
program, waiting for the one line it prints once it listens; when ``ingress`` names ports (a
session under a profile with ``[ingress] ports``), start :meth:`SandboxSockets.ingress_argv` the
same way, next to it. The sockets grant nothing by themselves: the proxy checks every connection
against the allowlist, the gateway every call against the profile, and the ingress gate
(``network/ingress.py``) opens only the profile's ports, only when the host asks.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.errors import ConfigError, InfraError
from sandcell.spec import MiB

if TYPE_CHECKING:
    from sandcell.network.addresses import Resolver
    from sandcell.network.ingress import IngressGate
    from sandcell.network.proxy import EgressProxy
    from sandcell.policy.profiles import Profile
    from sandcell.tools.approval import Approver
    from sandcell.tools.gateway import ToolGateway

SANDBOX_DIR = "/run/sandcell"
"""Where the sandbox sees the run's socket directory (read-only)."""
SANDBOX_LIB = f"{SANDBOX_DIR}/lib"
"""The directory of ``sandcell_tools.py`` and the bridge, on the program's ``sys.path``."""
EGRESS_SOCKET = "egress.sock"
TOOLS_SOCKET = "tools.sock"
INGRESS_SOCKET = "ingress.sock"
BRIDGE_FILE = "lib/sandcell_bridge.py"
TOOLS_FILE = "lib/sandcell_tools.py"
INGRESS_FILE = "lib/sandcell_ingress.py"
PROXY_PORT = 3128
"""The loopback port of the bridge inside the sandbox (each sandbox has its own loopback)."""
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"

_SOCKET_PARENT = Path("/tmp")
"""Short on every host (``$TMPDIR`` may be long): the socket paths must fit in 107 bytes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxSockets:
    """What a backend makes of a run's ways out (see the module): pure data."""

    host_dir: Path
    """The host directory to show read-only at :data:`SANDBOX_DIR`."""
    egress: bool
    """Whether ``egress.sock`` serves the egress proxy (then start the bridge)."""
    tools: bool
    """Whether ``tools.sock`` serves the tool gateway."""
    ingress: tuple[int, ...] = ()
    """The ports ``ingress.sock`` reaches in the sandbox (then start the ingress agent)."""

    def env(self) -> dict[str, str]:
        """The program's environment additions: the proxy variables (both cases: curl reads
        only the lower-case ``http_proxy``, some tools only upper case), the gateway socket,
        and :data:`SANDBOX_LIB` on ``PYTHONPATH`` for Pythons the program starts itself."""
        env = {"PYTHONPATH": SANDBOX_LIB, "SANDCELL_SOCKETS": SANDBOX_DIR}
        if self.egress:
            for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
                env[name] = PROXY_URL
            env["SANDCELL_PROXY"] = PROXY_URL
        if self.tools:
            env["SANDCELL_TOOLS_SOCKET"] = f"{SANDBOX_DIR}/{TOOLS_SOCKET}"
        return env

    def bridge_argv(self, python: str) -> list[str] | None:
        """The bridge's command inside the sandbox (None without egress): it prints the port
        once it listens, then forwards 127.0.0.1:PORT to the proxy socket until killed."""
        if not self.egress:
            return None
        return [
            python,
            "-I",
            f"{SANDBOX_DIR}/{BRIDGE_FILE}",
            f"127.0.0.1:{PROXY_PORT}",
            f"{SANDBOX_DIR}/{EGRESS_SOCKET}",
        ]

    def ingress_argv(self, python: str) -> list[str] | None:
        """The ingress agent's command inside the sandbox (None without ingress ports): it
        prints one line once connected to ``ingress.sock``, then carries the host's connections
        to 127.0.0.1:PORT for those ports until the session ends."""
        if not self.ingress:
            return None
        return [
            python,
            "-I",
            f"{SANDBOX_DIR}/{INGRESS_FILE}",
            f"{SANDBOX_DIR}/{INGRESS_SOCKET}",
            ",".join(map(str, self.ingress)),
        ]

    def describe(self) -> str:
        """The enforcement report's line."""
        parts = []
        if self.egress:
            parts.append(f"egress proxy on 127.0.0.1:{PROXY_PORT} (allowlist, host-side)")
        if self.tools:
            parts.append("tool gateway socket (host-side)")
        if self.ingress:
            ports = ", ".join(map(str, self.ingress))
            parts.append(f"ingress to port {ports} through sandcell only (host-side)")
        return ", ".join(parts)


def needs_sockets(profile: Profile, *, ingress: bool = False) -> bool:
    """Whether a run under ``profile`` reaches anything outside the sandbox (``ingress``: or,
    for a session, is reached from outside)."""
    served = ingress and bool(ingress_ports(profile))
    return profile.allows_network() or bool(profile.tools) or served


def ingress_ports(profile: Profile) -> tuple[int, ...]:
    """The profile's ``[ingress] ports``."""
    return tuple(profile.ingress.ports)


class RunSockets:
    """The host side of one run's (or one session's) ways out. Build with :meth:`open`.

    Thread-safe: a session takes its cells' records from one thread while it ends on another.
    """

    def __init__(
        self,
        *,
        host_dir: Path,
        proxy: EgressProxy | None,
        gateway: ToolGateway | None,
        before_close: Callable[[RunSockets], None] | None = None,
        ingress: IngressGate | None = None,
    ) -> None:
        self.sandbox = SandboxSockets(
            host_dir=host_dir,
            egress=proxy is not None,
            tools=gateway is not None,
            ingress=ingress.ports if ingress is not None else (),
        )
        self._proxy = proxy
        self._gateway = gateway
        self.ingress = ingress
        """The session's ports, reached from the host (None: the profile has none)."""
        self._taken_ingress = 0
        self._before_close = before_close
        self._lock = threading.Lock()
        self._taken_connections = 0
        self._taken_dropped = 0
        self._taken_calls = 0
        self._closed = False

    @classmethod
    def open(
        cls,
        profile: Profile,
        *,
        approver: Approver | None,
        approval_timeout_s: float,
        resolver: Resolver | None = None,
        environ: Mapping[str, str] | None = None,
        before_close: Callable[[RunSockets], None] | None = None,
        ingress: bool = False,
    ) -> RunSockets | None:
        """Start what ``profile`` allows (None when it allows nothing outside); ``ingress``
        (sessions only): serve the profile's ``[ingress] ports`` too.

        ``before_close`` is called first thing in :meth:`close`, while the gateway still
        serves (the approval queue answers the calls still waiting there).

        Raises:
            ConfigError: a tool's credential is not set on the host.
            InfraError: a socket could not be served.
        """
        if not needs_sockets(profile, ingress=ingress):
            return None
        host_dir = Path(tempfile.mkdtemp(prefix="sandcell-", dir=_SOCKET_PARENT))
        proxy: EgressProxy | None = None
        gateway: ToolGateway | None = None
        gate: IngressGate | None = None
        try:
            _write_helpers(host_dir, ingress=ingress and bool(ingress_ports(profile)))
            if profile.allows_network():
                from sandcell.network.addresses import HostsResolver, system_resolver
                from sandcell.network.caps import ProxyLimits
                from sandcell.network.proxy import EgressProxy

                rules = profile.network
                proxy = EgressProxy(
                    profile=profile.name,
                    allowlist=rules.allowlist,
                    socket_path=host_dir / EGRESS_SOCKET,
                    limits=ProxyLimits(
                        max_connections=rules.max_connections,
                        max_concurrent=rules.max_concurrent,
                        max_bytes_up=rules.max_mb_up * MiB,
                        max_bytes_down=rules.max_mb_down * MiB,
                    ),
                    resolver=resolver
                    or (
                        HostsResolver(rules.static_hosts, system_resolver)
                        if rules.static_hosts
                        else system_resolver
                    ),
                )
                proxy.start()
            if profile.tools:
                from sandcell.tools.gateway import ToolGateway

                gateway = ToolGateway(
                    profile=profile.name,
                    tools=profile.tools,
                    approver=approver,
                    approval_timeout_s=approval_timeout_s,
                    environ=environ,
                    socket_path=host_dir / TOOLS_SOCKET,
                )
                gateway.start()
            if ingress and ingress_ports(profile):
                from sandcell.network.ingress import IngressGate

                gate = IngressGate(
                    ports=ingress_ports(profile), socket_path=host_dir / INGRESS_SOCKET
                )
                gate.start()
        except BaseException:
            if gate is not None:
                gate.stop()
            for server in (gateway, proxy):
                if server is not None:
                    with contextlib.suppress(ConfigError, InfraError):
                        server.stop()
            shutil.rmtree(host_dir, ignore_errors=True)
            raise
        return cls(
            host_dir=host_dir,
            proxy=proxy,
            gateway=gateway,
            before_close=before_close,
            ingress=gate,
        )

    @property
    def tool_calls(self) -> int:
        """Gateway requests recorded so far."""
        return len(self._gateway.records) if self._gateway is not None else 0

    @property
    def secrets(self) -> tuple[str, ...]:
        """The credentials the gateway holds: the leak scan looks for them in every output."""
        return self._gateway.secrets if self._gateway is not None else ()

    def take_record(self) -> dict[str, object]:
        """What happened since the last take (a session cell's share), for the run record:
        ``network`` (connection attempts) and ``tools`` (calls), each None when not served, and
        ``ingress`` (connections from outside to a session's ports) where it is served."""
        with self._lock:
            network: dict[str, object] | None = None
            tools: dict[str, object] | None = None
            if self._proxy is not None:
                records = self._proxy.records
                new = records[self._taken_connections :]
                self._taken_connections = len(records)
                dropped = self._proxy.refused_dropped
                network = _network_record(
                    self._proxy.profile, new, refused_dropped=dropped - self._taken_dropped
                )
                self._taken_dropped = dropped
            if self._gateway is not None:
                calls = self._gateway.records
                new_calls = calls[self._taken_calls :]
                self._taken_calls = len(calls)
                tools = {
                    "profile": self._gateway.profile,
                    "calls": [c.to_record() for c in new_calls],
                }
            taken: dict[str, object] = {"network": network, "tools": tools}
            if self.ingress is not None:
                seen = self.ingress.records
                new_seen = seen[self._taken_ingress :]
                self._taken_ingress = len(seen)
                taken["ingress"] = {
                    "ports": list(self.ingress.ports),
                    "connections": [r.to_record() for r in new_seen],
                    "dropped": self.ingress.dropped,
                }
            return taken

    def close(self) -> dict[str, object]:
        """Stop serving and remove the directory; returns :meth:`take_record` of what is left
        (with the totals of the whole run). Idempotent after the first call's record."""
        with self._lock:
            if self._closed:
                return {"network": None, "tools": None}
            self._closed = True
        try:
            if self._before_close is not None:
                self._before_close(self)
            if self.ingress is not None:
                self.ingress.stop()
            proxy_report = self._proxy.stop() if self._proxy is not None else None
            gateway_report = self._gateway.stop() if self._gateway is not None else None
        finally:
            shutil.rmtree(self.sandbox.host_dir, ignore_errors=True)
        record = self.take_record()
        if proxy_report is not None and isinstance(record["network"], dict):
            record["network"].update(
                bytes_up_total=proxy_report.bytes_up,
                bytes_down_total=proxy_report.bytes_down,
            )
        if gateway_report is not None and isinstance(record["tools"], dict):
            record["tools"]["unrecorded"] = gateway_report.unrecorded
        return record


def _network_record(
    profile: str, records: tuple[object, ...], *, refused_dropped: int
) -> dict[str, object]:
    """``refused`` counts every refused attempt, listed or not; ``refused_dropped`` those past
    the proxy's cap on refused records, which ``connections`` does not list."""
    rows = [r.to_record() for r in records]  # type: ignore[attr-defined]
    return {
        "profile": profile,
        "connections": rows,
        "refused": sum(1 for r in rows if not r["allowed"]) + refused_dropped,
        "refused_dropped": refused_dropped,
        "bytes_up": sum(int(r["bytes_up"]) for r in rows),
        "bytes_down": sum(int(r["bytes_down"]) for r in rows),
    }


def _write_helpers(host_dir: Path, *, ingress: bool) -> None:
    """The bridge, the client and (``ingress``) the ingress agent, copied read-only: all import
    only the standard library."""
    from sandcell.network import bridge, ingress_agent
    from sandcell.tools import sandcell_tools

    (host_dir / "lib").mkdir(mode=0o755)
    helpers = [(bridge, BRIDGE_FILE), (sandcell_tools, TOOLS_FILE)]
    if ingress:
        helpers.append((ingress_agent, INGRESS_FILE))
    for module, name in helpers:
        source = module.__file__
        if source is None:
            raise InfraError(f"the source of {module.__name__} cannot be found to copy")
        target = host_dir / name
        shutil.copyfile(source, target)
        target.chmod(0o444)
    # The directory stays writable by its owner (the sandbox sees it read-only): an ordinary
    # user could not remove a 0555 directory's files when the run ends.


__all__ = [
    "EGRESS_SOCKET",
    "INGRESS_FILE",
    "INGRESS_SOCKET",
    "PROXY_PORT",
    "PROXY_URL",
    "SANDBOX_DIR",
    "SANDBOX_LIB",
    "TOOLS_SOCKET",
    "RunSockets",
    "SandboxSockets",
    "ingress_ports",
    "needs_sockets",
]
