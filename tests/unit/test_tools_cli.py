"""``sandcell tools list|call``: the same gateway checks, with the person as the approver.

The tool is an HTTP API on 127.0.0.1 that checks its credential header; the CLI runs as its own
process (``python -m sandcell``), with the credential in its environment as on a host.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sandcell import status

KEY = "cli-key-3c9e1f7a2b8d4e60"


class _Api(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.headers.get("Authorization") == f"Bearer {KEY}"
        data = json.dumps({"path": self.path, "auth": self.headers.get("Authorization")}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/api"
    folder = tmp_path_factory.mktemp("profiles")
    (folder / "withtools.toml").write_text(
        f"""
[tools.api]
kind = "http"
base_url = "{base}"
allow = ["GET /items/*"]
credential_env = "API_KEY"

[tools.guarded]
kind = "http"
base_url = "{base}"
allow = ["GET /items/*"]
credential_env = "API_KEY"
approval = "always"
"""
    )
    yield folder
    server.shutdown()
    server.server_close()


def _cli(
    profile_dir: Path, *args: str, stdin: int | None = subprocess.DEVNULL
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "API_KEY": KEY}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sandcell",
            "tools",
            *args,
            "--profile",
            "withtools",
            "--profile-dir",
            str(profile_dir),
        ],
        env=env,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_list_shows_the_allowed_operations(profile_dir: Path) -> None:
    done = _cli(profile_dir, "list")
    assert done.returncode == 0, done.stderr
    assert "api.request  [approval: never]" in done.stdout
    assert "guarded.request  [approval: always]" in done.stdout
    as_json = json.loads(_cli(profile_dir, "list", "--json").stdout)
    assert [e["name"] for e in as_json] == ["api.request", "guarded.request"]


def test_call_returns_the_result_with_the_credential_redacted(profile_dir: Path) -> None:
    done = _cli(profile_dir, "call", "api.request", "--json", '{"method":"GET","path":"/items/7"}')
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == 200
    assert result["body"] == {"path": "/api/items/7", "auth": "Bearer [REDACTED:known_secret]"}
    assert KEY not in done.stdout + done.stderr


def test_a_call_outside_the_allow_list_is_refused(profile_dir: Path) -> None:
    done = _cli(profile_dir, "call", "api.request", "--json", '{"method":"GET","path":"/admin"}')
    assert done.returncode == status.EXIT_DENIED
    assert "GET /admin is not allowed by tool api" in done.stderr


def test_bad_json_arguments_are_a_clear_error(profile_dir: Path) -> None:
    done = _cli(profile_dir, "call", "api.request", "--json", "[1]")
    assert done.returncode != 0
    assert "--json must be a JSON object" in done.stderr


def test_approval_without_a_terminal_is_refused(profile_dir: Path) -> None:
    done = _cli(
        profile_dir, "call", "guarded.request", "--json", '{"method":"GET","path":"/items/1"}'
    )
    assert done.returncode == status.EXIT_DENIED
    assert "guarded.request needs approval" in done.stderr
    assert "nobody can approve" in done.stderr


@pytest.mark.parametrize(("answer", "code"), [(b"y\n", 0), (b"n\n", status.EXIT_DENIED)])
def test_the_person_at_the_terminal_approves_or_denies(
    profile_dir: Path, answer: bytes, code: int
) -> None:
    primary, secondary = pty.openpty()
    try:
        os.write(primary, answer)
        done = _cli(
            profile_dir,
            "call",
            "guarded.request",
            "--json",
            '{"method":"GET","path":"/items/1"}',
            stdin=secondary,
        )
    finally:
        os.close(primary)
        os.close(secondary)
    assert done.returncode == code, done.stderr
    assert "guarded.request needs approval" in done.stderr
    if code:
        assert "denied by cli:" in done.stderr
    else:
        assert json.loads(done.stdout)["status"] == 200
