"""The microVM relay's own cost: HTTP through the egress proxy with and without the hop over
the agent channel, both measured natively in this process (no guest, no TCG).

    .venv/bin/python bench/bench_vm_relay.py [--rounds N] [--mib N] [--json]

In a microVM the program's connection goes bridge -> the guest agent's ``egress.sock`` ->
``R`` frames over the virtio-serial channel -> the host's relay thread -> the proxy's socket.
Here the channel is a socket pair, and the guest side is the agent's own ``Forwarder`` code
(``microvm/guest/forward.py``) on a thread, so the difference between the variants is the
relay's framing and credit flow control, not the emulation. Variants, interleaved in shuffled
order each round:

- ``proxy-socket``: plain HTTP to the proxy's Unix socket (the baseline);
- ``vm-relay``: the same request to the forwarder's socket, carried over the channel.

Then throughput: three downloads of ``--mib`` MiB each. Medians and ratios to the baseline of
the same run. Under TCG the guest's share of the work is tens of times slower than here.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import random
import select
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sandcell.backends.microvm import channel, relay
from sandcell.backends.microvm.guest.forward import Forwarder
from sandcell.backends.microvm.guest.port import Port
from sandcell.network.addresses import MapResolver
from sandcell.network.allowlist import parse_allowlist
from sandcell.network.caps import ProxyLimits
from sandcell.network.proxy import EgressProxy
from sandcell.run_sockets import SandboxSockets


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


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(self._path)


def _get(conn: http.client.HTTPConnection, target: str) -> int:
    conn.request("GET", target)
    total = 0
    response = conn.getresponse()
    while chunk := response.read(1 << 20):
        total += len(chunk)
    conn.close()
    return total


def _guest(host_dir: Path, guest_dir: Path) -> tuple[relay.Pump, threading.Event]:
    """The agent's forwarder on a thread, joined to a host relay by a socket pair."""
    host_sock, guest_sock = socket.socketpair()
    port = object.__new__(Port)
    port.fd = guest_sock.fileno()
    port.buf = bytearray()
    port.early = []
    os.set_blocking(port.fd, False)
    fwd = Forwarder(port)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(guest_dir / "egress.sock"))
    listener.listen(128)
    listener.setblocking(False)
    fwd.listeners[listener.fileno()] = (listener, b"e")
    pump = relay.Pump(
        channel.Channel(host_sock), SandboxSockets(host_dir=host_dir, egress=True, tools=False)
    )
    pump.start()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            r, w, _ = select.select([port.fd, *fwd.rfds()], fwd.wfds(), [], 0.1)
            fwd.ready(r, w)
            if port.fd in r or port.early:
                for kind, payload in port.frames(0):
                    if kind == b"R":
                        fwd.on_host(payload)
        listener.close()
        guest_sock.close()

    threading.Thread(target=loop, daemon=True).start()
    return pump, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=100, help="requests per variant")
    parser.add_argument("--mib", type=int, default=32, help="size of the throughput download")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    folder = Path(tempfile.mkdtemp(prefix="bench-relay-", dir="/tmp"))
    (folder / "guest").mkdir()
    port = server.server_address[1]
    proxy = EgressProxy(
        profile="bench",
        allowlist=parse_allowlist((f"api.test:{port}",), ("127.0.0.1",)),
        socket_path=folder / "egress.sock",
        limits=ProxyLimits(max_connections=10**6, max_bytes_down=2**40, max_bytes_up=2**40),
        resolver=MapResolver({"api.test": ["127.0.0.1"]}),
    )
    proxy.start()
    pump, stop = _guest(folder, folder / "guest")
    remote = f"http://api.test:{port}"
    variants: dict[str, Callable[[str], int]] = {
        "proxy-socket": lambda t: _get(
            _UnixHTTPConnection(str(folder / "egress.sock")), remote + t
        ),
        "vm-relay": lambda t: _get(
            _UnixHTTPConnection(str(folder / "guest" / "egress.sock")), remote + t
        ),
    }
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for fetch in variants.values():  # warm-up
        fetch("/small")
    order = list(variants)
    for _ in range(args.rounds):
        random.shuffle(order)
        for name in order:
            start = time.perf_counter()
            assert variants[name]("/small") == 100
            samples[name].append((time.perf_counter() - start) * 1000)
    size = args.mib * 2**20
    rates: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(3):
        random.shuffle(order)
        for name in order:
            start = time.perf_counter()
            assert variants[name](f"/bytes/{size}") == size
            rates[name].append(size / 2**20 / (time.perf_counter() - start))

    stop.set()
    pump.chan.close()
    proxy.stop()
    server.shutdown()
    server.server_close()
    shutil.rmtree(folder)

    medians = {k: statistics.median(v) for k, v in samples.items()}
    throughput = {k: statistics.median(v) for k, v in rates.items()}
    result = {
        "rounds": args.rounds,
        "mib": args.mib,
        "variants": {
            k: {
                "median_ms": round(medians[k], 3),
                "ratio": round(medians[k] / medians["proxy-socket"], 2),
                "mib_per_s": round(throughput[k], 1),
                "throughput_ratio": round(throughput[k] / throughput["proxy-socket"], 2),
            }
            for k in variants
        },
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{args.rounds} requests of 100 bytes per variant, a new connection each; "
        f"then three {args.mib} MiB downloads each (no guest: the relay's own cost)"
    )
    print(f"{'variant':14} {'median ms':>10} {'x socket':>9} {'MiB/s':>9} {'x socket':>9}")
    for name, row in result["variants"].items():
        print(
            f"{name:14} {row['median_ms']:>10.3f} {row['ratio']:>9.2f} "
            f"{row['mib_per_s']:>9.1f} {row['throughput_ratio']:>9.2f}"
        )


if __name__ == "__main__":
    main()
