"""A session's ports over HTTP (``/v1/sessions/{id}/ports/{port}/{path}``), through a real
``sandcell serve``: a server the session's program started is reached with the tenant's key, only
on the profile's ports, never by another tenant, and the tenant's key never reaches it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.service.server import ServiceProcess, add_tenant

from sandcell.audit import AuditLog

PROFILE = """
approval = "never"
[ingress]
ports = [8000, 8001]
[runtime]
allowed_imports = ["*"]
[checks]
disabled = ["py.network", "py.import", "py.subprocess", "py.process"]
"""

# A server that answers every request with what it received, as JSON.
SERVE = r'''
import socket, subprocess, sys, time
open("echo.py", "w").write("""
import json, http.server
class H(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        n = int(self.headers.get("content-length") or 0)
        body = json.dumps({"method": self.command, "path": self.path,
                           "headers": {k.lower(): v for k, v in self.headers.items()},
                           "body": self.rfile.read(n).decode()}).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("content-type", "application/json")
        self.send_header("x-echo", "yes")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_PUT = do_DELETE = _answer
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
""")
server = subprocess.Popen([sys.executable, "echo.py"])
for _ in range(1200):
    try:
        socket.create_connection(("127.0.0.1", 8000), 1).close()
        break
    except OSError:
        time.sleep(0.05)
print("serving")
'''


def test_the_port_route_reaches_the_sessions_server(service: ServiceProcess, home: Path) -> None:
    (home / "profiles").mkdir(exist_ok=True)
    (home / "profiles" / "web-ports.toml").write_text(PROFILE)
    key = add_tenant(home, "porter", profiles=("web-ports",), max_concurrent=2)
    other = add_tenant(home, "stranger", profiles=("web-ports",))
    plain = add_tenant(home, "plain", profiles=("strict",))
    with service.client(key) as c:
        created = c.post("/v1/sessions", json={"idle_timeout_s": 300})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        started = c.post(f"/v1/sessions/{sid}/cells", json={"code": SERVE}).json()
        assert started["outcome"] == "ok" and "serving" in started["stdout"], started
        got = c.get(f"/v1/sessions/{sid}/ports/8000/some/where?q=1", headers={"X-Mine": "a"})
        assert got.status_code == 200, got.text
        assert got.headers["x-echo"] == "yes"
        seen = got.json()
        assert seen["path"] == "/some/where?q=1" and seen["headers"]["x-mine"] == "a", seen
        assert seen["headers"]["host"] == "127.0.0.1:8000", seen
        # The tenant's key stays outside.
        assert key not in json.dumps(seen) and "authorization" not in seen["headers"], seen
        posted = c.post(f"/v1/sessions/{sid}/ports/8000/items", content=b"payload")
        assert posted.status_code == 201 and posted.json()["body"] == "payload", posted.text
        refused = c.get(f"/v1/sessions/{sid}/ports/9000/")
        assert refused.status_code == 403 and "not in the [ingress] ports" in refused.text
        closed = c.get(f"/v1/sessions/{sid}/ports/8001/")
        assert closed.status_code == 502 and "nothing accepted" in closed.text, closed.text
        # Recorded: the next cell's record holds this tenant's connections (refused ones too).
        after = c.post(f"/v1/sessions/{sid}/cells", json={"code": "pass"}).json()
        with AuditLog(home / "audit.sqlite3") as audit:
            entry = audit.get(after["run_id"])
        assert entry is not None
        conns = entry.record["ingress"]["connections"]  # type: ignore[index]
        assert [(x["port"], x["allowed"]) for x in conns] == [
            (8000, True),
            (8000, True),
            (8001, False),
        ], conns
        assert len({x["by"] for x in conns}) == 1 and conns[0]["by"], conns
    with service.client(other) as c:
        assert c.get(f"/v1/sessions/{sid}/ports/8000/").status_code == 404
    with service.client(plain) as c:
        mine = c.post("/v1/sessions", json={}).json()["id"]
        none = c.get(f"/v1/sessions/{mine}/ports/8000/")
        assert none.status_code == 403, none.text
        c.delete(f"/v1/sessions/{mine}")
    with service.client(key) as c:
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200
