"""The tool gateway's cost per call, against calling the same upstream directly.

    .venv/bin/python bench/bench_tools.py [--rounds N]

Upstreams on this host: an HTTP API on 127.0.0.1 and the MCP test server of the tool tests
(``tests/mcp_ticket_server.py``, the official ``mcp`` SDK) over stdio. Variants, interleaved
in shuffled order each round so load on the shared host hits all alike:

- ``http-direct``: http.client to the API, credential header set by the caller;
- ``http-gateway``: the same request as ``weather.request`` through the gateway's Unix socket
  with the sandbox's client module (every check, redaction and the record included);
- ``mcp-direct``: an SDK session to a freshly started stdio server, one ``call_tool``;
- ``mcp-gateway``: the same call through the gateway (which also starts a server per call).

Medians, and ratios to the direct variant of the same upstream measured in the same run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from sandcell.policy.profiles import parse_profile
from sandcell.tools import sandcell_tools
from sandcell.tools.gateway import ToolGateway

SERVER = Path(__file__).resolve().parents[1] / "tests" / "mcp_ticket_server.py"
KEY = "bench-key-0123456789"


class _Api(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        data = json.dumps({"city": "paris", "temp": 21}).encode()
        self.send_response(200 if self.headers.get("X-Api-Key") == KEY else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    api = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    port = api.server_address[1]
    toml = f"""
[tools.weather]
kind = "http"
base_url = "http://127.0.0.1:{port}/v1"
allow = ["GET /forecast/*"]
credential_env = "K"
header = "X-Api-Key"
scheme = ""
rate_per_minute = 1000000
max_calls = 1000000

[tools.tickets]
kind = "mcp"
command = ["{sys.executable}", "{SERVER}", "stdio"]
allow = ["search_tickets"]
rate_per_minute = 1000000
max_calls = 1000000
"""
    tools = parse_profile(toml.encode(), name="bench", source="bench.toml").tools
    folder = Path(tempfile.mkdtemp(prefix="sct-bench-"))
    socket_path = folder / "t.sock"

    def http_direct() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/v1/forecast/paris", headers={"X-Api-Key": KEY})
        assert conn.getresponse().status == 200
        conn.close()

    def http_gateway() -> None:
        out = sandcell_tools.call("weather.request", method="GET", path="/forecast/paris")
        assert out["status"] == 200

    def mcp_direct() -> None:
        async def run() -> None:
            params = StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio"])
            async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
                await s.initialize()
                await s.call_tool("search_tickets", {"query": "refund"})

        anyio.run(run)

    def mcp_gateway() -> None:
        sandcell_tools.call("tickets.search_tickets", query="refund")

    variants = {
        "http-direct": http_direct,
        "http-gateway": http_gateway,
        "mcp-direct": mcp_direct,
        "mcp-gateway": mcp_gateway,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    os.environ["SANDCELL_TOOLS_SOCKET"] = str(socket_path)
    with ToolGateway(
        profile="bench",
        tools=tools,
        environ={"K": KEY},
        socket_path=socket_path,
        max_records=1_000_000,
    ) as gateway:
        mcp_gateway()  # the schemas, read once per gateway
        for _ in range(rounds):
            order = list(variants)
            random.shuffle(order)
            for name in order:
                repeat = 20 if name.startswith("http") else 1
                start = time.perf_counter()
                for _ in range(repeat):
                    variants[name]()
                times[name].append((time.perf_counter() - start) / repeat)
    api.shutdown()
    api.server_close()
    shutil.rmtree(folder, ignore_errors=True)
    assert all(r.decision == "allowed" for r in gateway.report.records)
    median = {name: statistics.median(v) for name, v in times.items()}
    for name, value in median.items():
        base = median[name.split("-")[0] + "-direct"]
        print(f"{name:14} median {value * 1000:8.2f} ms   x{value / base:5.2f} of direct")


if __name__ == "__main__":
    main()
