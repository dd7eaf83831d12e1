"""``sandcell session port ID PORT`` (issue 23): the session's server forwards a port of this
host's loopback to a server the session's program started, on a port its profile lists; the
forward ends with the session. One rung: the command only asks the session's server, whose
``forward_port`` is the Python API's (tests/contract/sessions/test_ports.py, every rung)."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest
from tests.conftest import run_cli
from tests.contract.sessions.test_ports import SERVE

PROFILE = """
approval = "never"
[ingress]
ports = [8000]
[ceilings]
wall_time_s = 300
[runtime]
allowed_imports = ["*"]
[checks]
disabled = ["py.network", "py.import", "py.subprocess", "py.process"]
"""


def test_session_port_forwards_a_local_port_until_the_session_ends(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root CLI test runs as root; this test run is not root")
    env = {k: v for k, v in os.environ.items() if k not in ("SANDCELL_URL", "SANDCELL_API_KEY")} | {
        "SANDCELL_HOME": str(tmp_path / "home")
    }
    (tmp_path / "web-cli.toml").write_text(PROFILE)

    def call(*args: str) -> str:
        done = run_cli(list(args), env=env, timeout=300)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return str(done.stdout)

    sid = call("session", "start", "--profile", str(tmp_path / "web-cli.toml")).strip()
    try:
        served = call("session", "run", sid, "-c", SERVE.format(body="from-the-cli", port=8000))
        assert "serving" in served, served
        address = call("session", "port", sid, "8000").strip()
        host, _, port = address.rpartition(":")
        assert host == "127.0.0.1" and port.isdigit(), address
        with urllib.request.urlopen(f"http://{address}/page.txt", timeout=60) as r:
            assert r.read() == b"from-the-cli\n"
        refused = run_cli(["session", "port", sid, "9000"], env=env, timeout=120)
        assert refused.returncode != 0 and "not in the profile" in str(refused.stderr), refused
        shown = json.loads(call("session", "port", sid, "8000", "--json"))
        assert shown["host"] == "127.0.0.1" and shown["host_port"] != int(port), shown
    finally:
        run_cli(["session", "close", sid], env=env, timeout=120)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{address}/page.txt", timeout=10)
