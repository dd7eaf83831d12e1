"""Small HTTP servers on 127.0.0.1 for the tests of runs that reach outside (upstreams of tools,
hosts of an allowlist): a handler base that answers JSON, and a context manager serving it."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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
