"""``sandcell run|session|approvals|audit`` through a real ``sandcell serve``: over its local
socket (a key in ``SANDCELL_API_KEY``) and over ``SANDCELL_URL``, printing what the same
command prints in-process (``--no-service``); the service knows what was sent through it; what
it cannot honour is refused; an explicit URL that does not answer is an error."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from tests.service.server import REPO, ServiceProcess, add_approver, add_tenant

# What differs between two runs of the same program, wherever they ran.
_PER_RUN = {"run_id", "usage", "started_at", "start", "enforcement"}


@pytest.fixture(scope="module")
def key(service: ServiceProcess, home: Path) -> str:
    return add_tenant(home, "cli", profiles=("strict", "analysis"))


def _cli(
    *args: str,
    home: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    return subprocess.run(
        [sys.executable, "-m", "sandcell", *args],
        cwd=cwd,
        env={**clean, "SANDCELL_HOME": str(home), **(env or {})},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _known(service: ServiceProcess, key: str, run_id: str) -> bool:
    with service.client(key) as c:
        answer = c.get(f"/v1/runs/{run_id}")
    assert answer.status_code in (200, 404), answer.text
    return answer.status_code == 200


def _same_result(a: dict[str, object], b: dict[str, object]) -> None:
    assert a.keys() == b.keys()
    assert {k: v for k, v in a.items() if k not in _PER_RUN} == {
        k: v for k, v in b.items() if k not in _PER_RUN
    }
    enf_a, enf_b = a["enforcement"], b["enforcement"]
    assert isinstance(enf_a, dict) and isinstance(enf_b, dict)
    assert (enf_a["backend"], enf_a["mode"]) == (enf_b["backend"], enf_b["mode"])


PROGRAM = "import sys\nprint(6 * 7)\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n"


def test_run_over_the_socket_prints_what_in_process_prints(
    service: ServiceProcess, home: Path, key: str
) -> None:
    env = {"SANDCELL_API_KEY": key}
    served = _cli("run", "-c", PROGRAM, "--json", home=home, env=env)
    local = _cli("run", "-c", PROGRAM, "--json", "--no-service", home=home, env=env)
    assert served.returncode == local.returncode == 3, served.stderr + local.stderr
    a, b = json.loads(served.stdout), json.loads(local.stdout)
    _same_result(a, b)
    assert a["stdout"] == "42\n" and a["outcome"] == "error"
    # The first went through the service (it knows the run), the second did not.
    assert _known(service, key, str(a["run_id"]))
    assert not _known(service, key, str(b["run_id"]))

    text = _cli("run", "-c", PROGRAM, home=home, env=env)
    text_local = _cli("run", "-c", PROGRAM, "--no-service", home=home, env=env)
    assert (text.returncode, text.stdout, text.stderr) == (
        text_local.returncode,
        text_local.stdout,
        text_local.stderr,
    )
    assert text.stdout == "42\n" and text.stderr == "to stderr\n"


def test_run_over_sandcell_url_with_display_stdin_and_limits(
    service: ServiceProcess, key: str, tmp_path: Path
) -> None:
    # Another home: no socket there, so only the URL leads to the service.
    env = {"SANDCELL_URL": service.url, "SANDCELL_API_KEY": key}
    code = "import sys\ndata = sys.stdin.read()\nprint(data.upper())\n{'n': len(data)}\n"
    args = ("run", "-", "--display", "--timeout", "20", "--memory", "256", "--json")
    stdin_file = tmp_path / "stdin.txt"
    stdin_file.write_text("hello")
    served = _cli(*args, "--stdin", str(stdin_file), home=tmp_path, env=env, stdin=code)
    local = _cli(*args, "--stdin", str(stdin_file), "--no-service", home=tmp_path, stdin=code)
    assert served.returncode == local.returncode == 0, served.stderr + local.stderr
    a, b = json.loads(served.stdout), json.loads(local.stdout)
    _same_result(a, b)
    assert a["stdout"] == "HELLO\n"
    assert a["outputs"][0]["data"]["text/plain"] == "{'n': 5}"
    assert _known(service, key, str(a["run_id"]))
    assert not _known(service, key, str(b["run_id"]))


def test_inputs_are_uploaded_and_exports_downloaded(
    service: ServiceProcess, home: Path, key: str, tmp_path: Path
) -> None:
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    code = (
        "import pathlib\n"
        "rows = pathlib.Path('/inputs/data.csv').read_text().splitlines()\n"
        "pathlib.Path('out').mkdir()\n"
        "pathlib.Path('out/rows.txt').write_text(str(len(rows)))\n"
        "print(rows[1])\n"
    )
    outs = {}
    for where, extra in (("served", ()), ("local", ("--no-service",))):
        out = tmp_path / where
        done = _cli(
            "run", "-c", code, "--profile", "analysis", "--input", str(data),
            "--export", "out/*.txt", "--out", str(out), *extra,
            home=home, env={"SANDCELL_API_KEY": key},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout == "1,2\n"
        assert done.stderr == f"sandcell: exported {out / 'out' / 'rows.txt'}\n"
        outs[where] = (out / "out" / "rows.txt").read_text()
    assert outs == {"served": "2", "local": "2"}


def test_figures_are_downloaded_and_rendered_as_in_process(
    service: ServiceProcess, key: str, tmp_path: Path
) -> None:
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\n6 * 7\n"
    env = {"SANDCELL_URL": service.url, "SANDCELL_API_KEY": key}
    printed = {}
    for where, extra in (("served", ()), ("local", ("--no-service",))):
        out = tmp_path / where
        done = _cli(
            "run", "-c", code, "--profile", "analysis", "--display", "--out", str(out), *extra,
            home=tmp_path, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        png = (out / "display" / "0001.png").read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        printed[where] = done.stdout.replace(str(out), "OUT")
    assert printed["served"] == printed["local"]
    assert printed["served"].startswith("Out[1]: 42\nOut[2]: figure\n  image/png: OUT/display/")


def test_what_the_service_cannot_honour_is_refused(
    service: ServiceProcess, home: Path, key: str, tmp_path: Path
) -> None:
    env = {"SANDCELL_API_KEY": key}
    profile = tmp_path / "mine.toml"
    profile.write_text("")
    for extra, named in (
        (("--start", "pool"), "--start pool"),
        (("--isolation", "rlimits"), "--isolation rlimits"),
        (("--no-landlock",), "--no-landlock"),
        (("--input", str(tmp_path)), "directory"),
        (("--profile", str(profile)), "--profile"),
        (("--profile", "paranoid-nonexistent"), "paranoid-nonexistent"),
        (("--timeout", "100000"), "ceiling"),
    ):
        done = _cli("run", "-c", "print(1)", *extra, home=home, env=env)
        assert done.returncode == 78, (extra, done.stdout, done.stderr)
        assert named in done.stderr and done.stdout == "", (extra, done.stderr)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_explicit_url_that_does_not_answer_is_an_error(
    service: ServiceProcess, key: str, tmp_path: Path
) -> None:
    nobody = f"http://127.0.0.1:{_free_port()}"
    done = _cli(
        "run", "-c", "print(1)", home=tmp_path,
        env={"SANDCELL_URL": nobody, "SANDCELL_API_KEY": key},
    )  # fmt: skip
    assert done.returncode == 75 and done.stdout == ""
    assert f"cannot reach the service at {nobody}" in done.stderr
    assert not (tmp_path / "audit.sqlite3").exists()  # nothing ran here instead
    no_key = _cli("run", "-c", "print(1)", home=tmp_path, env={"SANDCELL_URL": service.url})
    assert no_key.returncode == 78 and "SANDCELL_API_KEY is not" in no_key.stderr
    wrong = _cli(
        "audit", "list", home=tmp_path,
        env={"SANDCELL_URL": service.url, "SANDCELL_API_KEY": "sc_not-a-key"},
    )  # fmt: skip
    assert wrong.returncode == 78 and "refused the key" in wrong.stderr
    bad_url = _cli(
        "run", "-c", "print(1)", home=tmp_path,
        env={"SANDCELL_URL": "ftp://x", "SANDCELL_API_KEY": key},
    )  # fmt: skip
    assert bad_url.returncode == 78 and "http://HOST:PORT" in bad_url.stderr


def test_without_a_key_the_socket_is_not_used(
    service: ServiceProcess, home: Path, key: str
) -> None:
    assert service.socket.exists()
    done = _cli("run", "-c", "print(5)", "--json", home=home)
    assert done.returncode == 0, done.stderr
    assert not _known(service, key, json.loads(done.stdout)["run_id"])


def test_approvals_and_audit_go_through_the_service(
    service: ServiceProcess, home: Path, key: str, tmp_path: Path
) -> None:
    env = {"SANDCELL_URL": service.url, "SANDCELL_API_KEY": key}
    held = "import subprocess\nprint(subprocess.run(['echo', 'hi'], capture_output=True).stdout)"
    waiting = _cli("run", "-c", held, "--json", home=tmp_path, env=env)
    assert waiting.returncode == 125, waiting.stderr
    approval = json.loads(waiting.stdout)["policy"]["approval"]["id"]

    listed = _cli("approvals", "list", "--json", home=tmp_path, env=env)
    assert approval in [a["id"] for a in json.loads(listed.stdout)]
    assert approval in _cli("approvals", "list", home=tmp_path, env=env).stdout
    shown = _cli("approvals", "show", approval, home=tmp_path, env=env)
    assert shown.returncode == 0 and "1 | import subprocess" in shown.stdout
    assert "not shown by the service" in shown.stdout

    refused = _cli("approve", approval, "--reason", "me", "--json", home=tmp_path, env=env)
    assert refused.returncode != 0 and "approver key" in refused.stderr
    # A person approves with the tenant's approver key, not the key that submitted the run.
    approver = {**env, "SANDCELL_API_KEY": add_approver(home, "cli")}
    approved = _cli("approve", approval, "--reason", "fine", "--json", home=tmp_path, env=approver)
    assert approved.returncode == 0, approved.stderr
    result = json.loads(approved.stdout)
    assert result["stdout"] == "b'hi\\n'\n"
    with service.client(key) as c:
        assert c.get(f"/v1/approvals/{approval}").json()["status"] == "ran"

    second = _cli("run", "-c", held, "--json", home=tmp_path, env=env)
    other = json.loads(second.stdout)["policy"]["approval"]["id"]
    denied = _cli("deny", other, "--reason", "not today", home=tmp_path, env=env)
    assert denied.returncode == 0 and denied.stdout.startswith("denied: ")
    with service.client(key) as c:
        assert c.get(f"/v1/approvals/{other}").json()["status"] == "denied"

    # The records are the service's: this home has none of its own.
    runs = json.loads(_cli("audit", "list", "--json", home=tmp_path, env=env).stdout)
    assert result["run_id"] in [r["run_id"] for r in runs]
    assert set(runs[0]) == {"run_id", "started_at", "language", "outcome", "wall_ms"}
    entry = _cli("audit", "show", result["run_id"], "--json", home=tmp_path, env=env)
    assert json.loads(entry.stdout)["record"]["run_id"] == result["run_id"]
    text = _cli("audit", "show", result["run_id"], home=tmp_path, env=env)
    assert text.returncode == 0 and "# boundary: namespaces" in text.stdout
    missing = _cli("audit", "show", "0" * 32, home=tmp_path, env=env)
    assert missing.returncode == 1 and "no run" in missing.stderr
    verified = _cli("audit", "verify", home=tmp_path, env=env)
    assert verified.returncode == 0 and "hash chain intact" in verified.stdout
    assert not (tmp_path / "audit.sqlite3").exists()
    # Tool-call tickets are decided through the service too: an unknown one is its 404.
    tool = _cli("approve", "t" + "0" * 11, home=tmp_path, env=env)
    assert tool.returncode == 78 and "no tool call" in tool.stderr


def test_a_session_through_the_service(
    service: ServiceProcess, home: Path, key: str, tmp_path: Path
) -> None:
    env = {"SANDCELL_API_KEY": key}
    started = _cli("session", "start", "--profile", "analysis", home=home, env=env)
    assert started.returncode == 0, started.stderr
    session = started.stdout.strip()
    with service.client(key) as c:
        assert c.get(f"/v1/sessions/{session}").status_code == 200
    assert _cli("session", "run", session, "-c", "x = 41", home=home, env=env).returncode == 0
    cell = _cli("session", "run", session, "-c", "open('f.csv', 'w').write('hey')\nx + 1",
                home=home, env=env)  # fmt: skip
    assert cell.returncode == 0 and cell.stdout == "Out[1]: 42\n", cell.stderr
    listed = _cli("session", "list", "--json", home=home, env=env)
    rows = {r["id"]: r for r in json.loads(listed.stdout)}
    assert rows[session]["cells"] == 2 and rows[session]["pid"] is None
    assert session in _cli("session", "list", home=home, env=env).stdout
    closed = _cli(
        "session", "close", session, "--export", "f.csv", "--out", str(tmp_path / "o"),
        home=home, env=env,
    )  # fmt: skip
    assert closed.returncode == 0, closed.stderr
    assert (tmp_path / "o" / "f.csv").read_text() == "hey"
    with service.client(key) as c:
        assert c.get(f"/v1/sessions/{session}").status_code == 404
    # A session this machine does not hold is not looked for here.
    gone = _cli("session", "run", session, "-c", "1", home=home, env=env)
    assert gone.returncode == 78 and f"no session {session!r}" in gone.stderr


def test_over_a_quota_is_an_error_to_retry(service: ServiceProcess, home: Path) -> None:
    slow = add_tenant(home, "cli-slow", runs_per_minute=1)
    env = {"SANDCELL_API_KEY": slow}
    assert _cli("run", "-c", "print(1)", home=home, env=env).returncode == 0
    refused = _cli("run", "-c", "print(2)", home=home, env=env)
    assert refused.returncode == 75 and refused.stdout == ""
    assert "over the tenant's quota" in refused.stderr and "retry after" in refused.stderr
