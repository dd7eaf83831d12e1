"""The egress proxy's cost: per request and in throughput, against direct loopback requests.

    .venv/bin/python bench/bench_proxy.py [--rounds N] [--mib N] [--json]

Servers on 127.0.0.1 (HTTP, and HTTPS with a throwaway CA from ``trustme``, a test extra; the
HTTPS rows are left out without it). Each request opens a new connection, as every request
through the proxy does. Variants, interleaved in shuffled order each round so load on the
shared host hits all alike:

- ``direct``: http.client to the server;
- ``proxy-socket``: plain HTTP through the proxy's Unix socket (the proxy alone);
- ``proxy-bridge``: plain HTTP through the loopback bridge to the socket (what a sandboxed
  program's ``http_proxy`` reaches);
- ``tls-direct`` and ``tls-tunnel``: HTTPS straight, and through CONNECT via the bridge.

Then throughput: three downloads of ``--mib`` MiB per variant. Medians, and ratios to the
direct variant measured in the same run.

Servers, clients, bridge and proxy all share this one interpreter here, so the relaying
threads compete for one GIL with the client's decryption: the tunnel's throughput ratio is a
pessimistic bound. In a run, the bridge and the client are the sandbox's own processes.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import random
import socket
import ssl
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sandcell.network.addresses import MapResolver
from sandcell.network.allowlist import parse_allowlist
from sandcell.network.bridge import Bridge
from sandcell.network.caps import ProxyLimits
from sandcell.network.proxy import EgressProxy

SMALL = b"x" * 100


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:
        size = int(self.path.rsplit("/", 1)[1]) if self.path.startswith("/bytes/") else 100
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        chunk = b"x" * 65536
        left = size
        while left > 0:
            self.wfile.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))


def _serve(tls: ssl.SSLContext | None) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    # Accepted sockets inherit it: no Nagle wait after the handshake's last small write.
    server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(self._path)


def _get(conn: http.client.HTTPConnection, target: str) -> int:
    conn.request("GET", target)
    total = 0
    response = conn.getresponse()
    while chunk := response.read(1 << 20):
        total += len(chunk)
    conn.close()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=100, help="requests per variant")
    parser.add_argument("--mib", type=int, default=32, help="size of the throughput download")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    try:
        import trustme
    except ImportError:
        trustme = None
    server_tls = client_tls = None
    if trustme is not None:
        ca = trustme.CA()
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("api.test", "127.0.0.1").configure_cert(server_tls)
        client_tls = ssl.create_default_context()
        ca.configure_trust(client_tls)
    plain = _serve(None)
    secure = _serve(server_tls) if server_tls is not None else None
    ports = [plain.server_address[1]] + ([secure.server_address[1]] if secure else [])
    folder = Path(tempfile.mkdtemp(prefix="bench-egress-", dir="/tmp"))
    proxy = EgressProxy(
        profile="bench",
        allowlist=parse_allowlist((f"api.test:{','.join(map(str, ports))}",), ("127.0.0.1",)),
        socket_path=folder / "proxy.sock",
        limits=ProxyLimits(max_connections=10**6, max_bytes_down=2**40, max_bytes_up=2**40),
        resolver=MapResolver({"api.test": ["127.0.0.1"]}),
    )
    proxy.start()
    bridge = Bridge(("127.0.0.1", 0), str(proxy.socket_path)).start()
    p_port = plain.server_address[1]
    remote = f"http://api.test:{p_port}"

    def tls_direct(target: str) -> int:
        assert secure is not None
        return _get(
            http.client.HTTPSConnection(
                "127.0.0.1", secure.server_address[1], context=client_tls, timeout=30
            ),
            target,
        )

    def tls_tunnel(target: str) -> int:
        assert secure is not None
        conn = http.client.HTTPSConnection("127.0.0.1", bridge.port, context=client_tls, timeout=30)
        conn.set_tunnel("api.test", secure.server_address[1])
        return _get(conn, target)

    variants: dict[str, Callable[[str], int]] = {
        "direct": lambda t: _get(http.client.HTTPConnection("127.0.0.1", p_port, timeout=30), t),
        "proxy-socket": lambda t: _get(_UnixHTTPConnection(str(proxy.socket_path)), remote + t),
        "proxy-bridge": lambda t: _get(
            http.client.HTTPConnection("127.0.0.1", bridge.port, timeout=30), remote + t
        ),
    }
    if secure is not None:
        variants |= {"tls-direct": tls_direct, "tls-tunnel": tls_tunnel}

    samples: dict[str, list[float]] = {k: [] for k in variants}
    for name in variants:  # warm-up
        variants[name]("/small")
    order = list(variants)
    for _ in range(args.rounds):
        random.shuffle(order)
        for name in order:
            start = time.perf_counter()
            assert variants[name]("/small") == len(SMALL)
            samples[name].append((time.perf_counter() - start) * 1000)

    size = args.mib * 2**20
    rates: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(3):
        random.shuffle(order)
        for name in order:
            start = time.perf_counter()
            assert variants[name](f"/bytes/{size}") == size
            rates[name].append(size / 2**20 / (time.perf_counter() - start))
    throughput = {k: statistics.median(v) for k, v in rates.items()}

    bridge.close()
    report = proxy.stop()
    for server in (plain, secure):
        if server is not None:
            server.shutdown()
            server.server_close()
    folder.rmdir()

    medians = {k: statistics.median(v) for k, v in samples.items()}
    base = {k: "tls-direct" if k.startswith("tls") else "direct" for k in variants}
    result = {
        "rounds": args.rounds,
        "mib": args.mib,
        "proxied_connections": len(report.records),
        "refused": len(report.refused),
        "variants": {
            k: {
                "median_ms": round(medians[k], 3),
                "ratio": round(medians[k] / medians[base[k]], 2),
                "mib_per_s": round(throughput[k], 1),
                "throughput_ratio": round(throughput[k] / throughput[base[k]], 2),
            }
            for k in variants
        },
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{args.rounds} requests of {len(SMALL)} bytes per variant, a new connection each; "
        f"then three {args.mib} MiB downloads each"
    )
    print(f"{'variant':14} {'median ms':>10} {'x direct':>9} {'MiB/s':>9} {'x direct':>9}")
    for name, row in result["variants"].items():  # type: ignore[attr-defined]
        print(
            f"{name:14} {row['median_ms']:>10.3f} {row['ratio']:>9.2f} "
            f"{row['mib_per_s']:>9.1f} {row['throughput_ratio']:>9.2f}"
        )
    print(f"proxy records: {len(report.records)}, refused: {len(report.refused)}")


if __name__ == "__main__":
    main()
