"""``sandcell serve``: the long-running service (see docs/service.md)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.cli.options import add_backend_option
from sandcell.errors import ConfigError
from sandcell.home import data_dir

if TYPE_CHECKING:
    from sandcell.cluster import Cluster

DEFAULT_PORT = 8790


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "serve",
        help="run the HTTP service for tenants (loopback and a local socket by default)",
    )
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    s.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0: any)"
    )
    s.add_argument(
        "--socket",
        type=Path,
        help="the local Unix socket (default: service.sock in the sandcell home)",
    )
    s.add_argument("--no-socket", action="store_true", help="listen on TCP only")
    s.add_argument(
        "--advertise",
        metavar="URL",
        help="with $SANDCELL_DATABASE_URL: the URL other replicas reach this one at, for the "
        "sessions and runs it holds (default: http://HOST:PORT as bound)",
    )
    s.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host that is not loopback (put TLS in front of it)",
    )
    s.add_argument(
        "--start",
        choices=("pool", "template", "cold"),
        default="pool",
        help="how Python runs on the namespaces backend start (default: pool, warm sandboxes "
        "forked ahead)",
    )
    s.add_argument("--pool-size", type=int, default=4, help="warm sandboxes kept ready (pool)")
    s.add_argument(
        "--workers", type=int, default=16, help="runs at once; more wait in the queue (16)"
    )
    s.add_argument(
        "--max-body-mb", type=float, default=8.0, help="largest request body, MiB (default 8)"
    )
    s.add_argument(
        "--local-tenant",
        metavar="NAME",
        help="the tenant a request without a key from this user over the local socket acts as "
        "(default: the built-in @local: every profile, no quotas)",
    )
    s.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name (with any port) /mcp answers besides the loopback ones: the name a "
        "proxy or the LAN reaches this service by; repeatable",
    )
    s.add_argument(
        "--metrics-key-file",
        type=Path,
        metavar="FILE",
        help="a file holding the operator key /metrics asks for (Authorization: Bearer KEY), "
        "from any address; without it /metrics answers loopback and the local socket only",
    )
    s.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="place runs on the nodes of a Ray cluster: 'auto' (the cluster this machine is "
        "part of), HOST:PORT of its head, or ray://HOST:PORT; --start and --pool-size then "
        "set the warm starts of each node agent this service starts (docs/cluster.md)",
    )
    add_backend_option(s)


def _connect_cluster(args: argparse.Namespace, home: Path) -> Cluster | None:
    """The cluster of ``--cluster``, connected, or None without it."""
    if args.cluster is None:
        return None
    from sandcell.backends.warm import WarmConfig
    from sandcell.cluster import Cluster
    from sandcell.cluster.malloc_arenas import limit_malloc_arenas

    # Before Ray's threads start (each would get an arena of its own): the replica's memory
    # then stays flat under load (malloc_arenas.py).
    limit_malloc_arenas()
    warm = None if args.start == "cold" else WarmConfig(mode=args.start, pool_size=args.pool_size)
    return Cluster.connect(args.cluster, home=home, warm=warm)


def _metrics_key_sha256(path: Path | None) -> str | None:
    """The SHA-256 of the key in ``path`` (its first line), or None without a file."""
    if path is None:
        return None
    import hashlib

    try:
        key = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--metrics-key-file {path}: cannot read it ({exc})") from None
    if len(key) < 16 or any(c.isspace() for c in key):
        raise ConfigError(
            f"--metrics-key-file {path}: the key must be one line of at least 16 characters "
            "without spaces (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _host_name(text: str) -> str:
    """A Host name as --allowed-host takes it: a DNS name or an address, no port, no scheme."""
    import ipaddress
    import re

    name = text.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        try:
            ipaddress.IPv6Address(name[1:-1])
        except ValueError:
            pass
        else:
            return name
    label = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
    if re.fullmatch(rf"{label}(\.{label})*", name):
        return name
    raise ConfigError(
        f"--allowed-host {text!r}: give a host name or address as clients send it in Host, "
        "without a port or scheme (e.g. sandcell.internal, 10.0.0.5, [fd00::5])"
    )


def _advertised(given: str | None, bound: socket.socket) -> str:
    """Where the other replicas reach this one: ``--advertise``, else the bound address (a
    wildcard address is replaced by this host's name)."""
    if given:
        if not given.startswith(("http://", "https://")):
            raise ConfigError(f"--advertise {given!r}: give a URL, e.g. http://10.0.0.5:8080")
        return given.rstrip("/")
    host, port = bound.getsockname()[:2]
    if host in ("0.0.0.0", "::"):  # noqa: S104 - naming the wildcard, not binding it
        host = socket.gethostname()
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def handle(args: argparse.Namespace) -> int:
    from sandcell.service.server import bind_tcp, bind_unix, is_loopback

    if not is_loopback(args.host) and not args.allow_remote:
        raise ConfigError(
            f"--host {args.host} is not a loopback address: the service would be reachable from "
            "other machines. Pass --allow-remote to mean it (and put TLS in front of it)"
        )
    if args.workers < 1 or args.pool_size < 1 or args.max_body_mb <= 0:
        raise ConfigError("--workers, --pool-size and --max-body-mb must be positive")
    try:
        from sandcell.service.app import create_app, default_socket, make_service
        from sandcell.service.core import ServiceConfig
        from sandcell.service.server import run_server
    except ImportError as exc:
        raise ConfigError(
            f"the service needs its extra ({exc.name} is missing): pip install 'sandcell[service]'"
        ) from None
    home: Path = args.home or data_dir()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = ServiceConfig(
        home=home,
        workers=args.workers,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        local_tenant=args.local_tenant,
        allowed_hosts=tuple(_host_name(h) for h in args.allowed_host),
        metrics_key_sha256=_metrics_key_sha256(args.metrics_key_file),
    )
    if args.local_tenant is not None:
        from sandcell.service.tenants import TenantStore

        with TenantStore.in_home(home) as tenants:
            tenants.get(args.local_tenant)  # a name that is no tenant is refused now, not later
    sockets = [bind_tcp(args.host, args.port)]
    config = dataclasses.replace(config, advertise=_advertised(args.advertise, sockets[0]))
    socket_path = None if args.no_socket else (args.socket or default_socket(home))
    cluster = None
    try:
        if socket_path is not None:
            sockets.append(bind_unix(socket_path))
        cluster = _connect_cluster(args, home)
        service = make_service(
            config,
            backend=getattr(args, "backend", None),
            start=args.start,
            pool_size=args.pool_size,
            cluster=cluster,
        )
    except BaseException:
        for s in sockets:
            s.close()
        if cluster is not None:
            cluster.close()
        raise
    host, port = sockets[0].getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    where = f"http://{shown}:{port}" + (f" and unix:{socket_path}" if socket_path else "")
    on = f", runs on the cluster at {args.cluster}" if cluster is not None else ""
    print(f"sandcell: serving on {where} (home {home}{on})", flush=True)
    try:
        run_server(create_app(service), sockets)
    finally:
        if cluster is not None:
            cluster.close()
    print("sandcell: stopped", file=sys.stderr)
    return 0
