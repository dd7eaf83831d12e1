"""Small servers on 127.0.0.1 for the tests of runs that reach outside (upstreams of tools,
hosts of an allowlist): a handler base that answers JSON and a context manager serving it, and
the test MCP server over streamable HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet handler with :meth:`send_json`; subclasses define ``do_GET``/``do_POST``."""

    def send_json(self, value: object, code: int = 200) -> None:
        data = json.dumps(value).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def json_body(self) -> dict[str, object]:
        """The request's JSON object (empty when it has no body)."""
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        value = json.loads(raw or b"{}")
        assert isinstance(value, dict)
        return value

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """Serve ``handler`` on a free 127.0.0.1 port; yields the port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


MCP_SERVER = Path(__file__).resolve().parents[1] / "mcp_ticket_server.py"


@contextlib.contextmanager
def serving_mcp(token: str) -> Iterator[str]:
    """The test MCP server (``tests/mcp_ticket_server.py``, the official SDK) over streamable
    HTTP on a free 127.0.0.1 port, holding ``token`` as its credential; yields its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    proc = subprocess.Popen(
        [sys.executable, str(MCP_SERVER), "http", str(port)],
        env={**os.environ, "TICKETS_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the MCP test server over streamable HTTP did not start")
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)
