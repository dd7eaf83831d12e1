"""A session's cells on every rung: state kept, rich outputs, bash cells, errors, exports and
records; interrupts, output caps and the pids limit that end a cell and keep the session; a
kernel that ignores the interrupt or exits, which ends it; the display directory a cell replaces
with a link.

Each test groups the assertions of one session (a microVM's costs seconds under emulation), and
asserts outcomes and what is left on the host, never how long anything took.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.contract.sessions.rungs import only_on, open_session
from tests.contract.sessions.traces import trace

from sandcell import Executor, Limits, Outcome
from sandcell.errors import ConfigError
from sandcell.sessions import SessionEnded
from sandcell.spec import MiB

NO_LINKS = (
    "the wasm rung's cells cannot make symbolic links (Pyodide's file system on Node refuses "
    "os.symlink with PermissionError), so there is no link for the host to refuse"
)


def test_state_outputs_files_exports_and_records(rung: str, ex: Executor) -> None:
    # A figure's first import builds matplotlib's font cache: CPU seconds under TCG.
    s = open_session(ex, limits=Limits(wall_time_s=120, cpu_time_s=240))
    host = trace(rung, s)
    # The wasm rung has no processes (no bash cells, no shell escapes), none of the compiled
    # packages (pandas, matplotlib), and its cells cannot make links (NO_LINKS): those parts
    # are the other rungs'; test_bash_cells_are_refused_on_wasm checks its bash cells.
    wasm = rung == "wasm"
    links = ("", "") if wasm else (
        "os.symlink('/etc/passwd', 'link')\n", "\nos.symlink('/etc/shadow', 'b.csv')"
    )  # fmt: skip
    codes = [
        f"import json, os\nx = 41\nopen('notes.txt', 'w').write('kept')\n{links[0]}"
        "os.makedirs('sub')\nopen('sub/b.txt', 'w').close()",
        "print(json.dumps({'x': x + 1}), open('notes.txt').read())",
        f"open('a.csv', 'w').write('a,b'){links[1]}",
    ]
    first = s.run(codes[0])
    assert first.outcome is Outcome.OK, first.reason + first.stderr
    second = s.run(codes[1])
    assert second.outcome is Outcome.OK, second.stderr
    assert second.stdout == '{"x": 42} kept\n'
    assert s.files() == ["notes.txt", "sub/b.txt"]  # the link is not a file of the workspace
    # Rich outputs: the last expression's value, a table, a figure (PNG and SVG).
    shown = s.run("x")
    assert shown.outcome is Outcome.OK
    assert [(o.kind, o.data.get("text/plain")) for o in shown.outputs] == [("value", "41")]
    if not wasm:
        table = s.run("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
        assert [o.kind for o in table.outputs] == ["table"], table.stderr
        figure = s.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]);")
        assert figure.outcome is Outcome.OK, figure.reason + figure.stderr
        assert [o.kind for o in figure.outputs] == ["figure"]
        media = sorted(a.media_type for a in figure.outputs[0].artifacts)
        assert media == ["image/png", "image/svg+xml"]
        # The figure's chart data too; display() and shell escapes work.
        chart = json.loads(figure.outputs[0].data["application/vnd.sandcell.chart+json"])
        assert chart["type"] == "line" and chart["elements"][0]["points"][2] == [2.0, 3.0]
    shell = "" if wasm else "_sandcell_shell('echo from-guest')\n"
    ordered = s.run(f"display(1)\n{shell}2")
    assert ordered.stdout == ("" if wasm else "from-guest\n"), ordered.stderr
    assert [(o.data["text/plain"], o.displayed) for o in ordered.outputs] == [
        ("1", True),
        ("2", False),
    ]
    # The outputs' directory is sandcell's: read, removed, never a file of the session.
    assert s.files() == ["notes.txt", "sub/b.txt"]
    # Errors and exit statuses end the cell, not the session; tracebacks show the cell only.
    failed = s.run("1 / 0")
    assert failed.outcome is Outcome.ERROR and "ZeroDivisionError" in failed.stderr
    assert "kernel" not in failed.stderr
    exited = s.run("import sys; sys.exit(3)")
    assert (exited.outcome, exited.exit_code) == (Outcome.ERROR, 3)
    assert s.run("print(x)").stdout == "41\n"
    if not wasm:
        # Bash cells share the sandbox, take an environment, and are recorded as bash.
        wrote = s.run(
            'printf "%s" "$GREETING" > from_bash.txt; pwd; exit 4',
            language="bash",
            env={"GREETING": "hello"},
        )
        assert wrote.outcome is Outcome.ERROR and wrote.exit_code == 4, wrote.stderr
        bash_entry = ex.audit.get(wrote.run_id)
        assert bash_entry is not None
        assert bash_entry.record["language"] == "bash"
        # The program, not the wrapper.
        assert str(bash_entry.record["code"]).startswith('printf "%s"')
        assert s.run("print(open('from_bash.txt').read())").stdout == "hello\n"
    with pytest.raises(ConfigError, match="Bash cells"):
        s.run("print(1)", env={"X": "1"})
    # Exports during the session pass the host's checks: the link is refused.
    out = s.run(codes[2], exports=["*.csv"])
    assert [a.path for a in out.artifacts] == ["a.csv"]
    assert [r.path for r in out.rejected_exports] == ([] if wasm else ["b.csv"])
    assert ex.store.path_for(out.artifacts[0].sha256).read_text() == "a,b"
    # Every cell is a run in the record, naming the session and the rung.
    for r, code in zip((first, second, out), codes, strict=True):
        assert r.session_id == s.id
        entry = ex.audit.get(r.run_id)
        assert entry is not None and entry.record["session_id"] == s.id
        assert entry.record["outcome"] == "ok"
        assert entry.record["code"] == code
        backend = entry.record["backend"]
        assert isinstance(backend, dict) and backend["name"] == rung, backend
        assert r.enforcement is not None and r.enforcement.backend == rung
        assert "session" in r.enforcement.layers
        if rung == "gvisor":  # the record names the boundary's version: runsc's
            assert "runsc" in backend, backend
        if rung == "microvm":  # and the guest kernel's, which is a layer of its own
            versions = ex.backend.versions()
            assert backend["guest_kernel_sha256"] == versions["guest_kernel_sha256"]
            assert "guest_kernel" in r.enforcement.layers
    end = s.close(exports=["notes.txt"])
    assert [a.path for a in end.artifacts] == ["notes.txt"]
    host.assert_gone()
    assert s.close().reason == "closed"  # idempotent


def test_interrupts_output_caps_and_pids_keep_the_session(rung: str, ex: Executor) -> None:
    with open_session(ex, limits=Limits(stdout_bytes=4096, max_pids=16)) as s:
        s.run("counter = 7")
        looped = s.run("while True:\n    counter += 0", timeout_s=1)
        assert looped.outcome is Outcome.TIMEOUT, looped.reason
        assert "interrupted" in looped.reason and "kept" in looped.reason
        assert "KeyboardInterrupt" in looped.stderr
        assert s.ended is None
        flood = s.run("while True:\n    print('x' * 100)", timeout_s=30)
        assert flood.outcome is Outcome.OUTPUT_LIMIT, flood.reason
        assert flood.stdout_truncated and len(flood.stdout) <= 4096
        # The session's pids limit refuses the 17th process (in the microVM's guest: its cgroup
        # and RLIMIT_NPROC); the wasm rung has no processes.
        kill = "[p.kill() for p in procs]\n"
        if rung != "wasm":
            spawn = s.run(
                "import subprocess\nprocs = []\ntry:\n"
                "    for _ in range(40):\n        procs.append(subprocess.Popen(['sleep', '60']))\n"
                "except OSError as e:\n    print('refused', e.errno)\n"
                "print(len(procs) < 16)"
            )
            assert spawn.outcome is Outcome.OK, spawn.reason + spawn.stderr
            assert spawn.stdout.split() == ["refused", "11", "True"], spawn.stdout
        after = s.run(("" if rung == "wasm" else kill) + "print(counter)")
        assert (after.outcome, after.stdout) == (Outcome.OK, "7\n")
        assert s.ended is None
        # Output and reply in quick succession, again and again: the relay keeps them in order
        # and never waits on a pipe it already drained (a stuck agent would time these out).
        for i in range(25):
            quick = s.run(f"print({i})\nimport sys; sys.stderr.write('e')", timeout_s=20)
            assert (quick.stdout, quick.stderr) == (f"{i}\n", "e"), quick.reason


def test_a_kernel_ignoring_the_interrupt_ends_the_session(rung: str, ex: Executor) -> None:
    s = open_session(ex)
    host = trace(rung, s)
    s.run("v = 1")
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    stuck = s.run(code, timeout_s=1)
    assert stuck.outcome is Outcome.TIMEOUT
    assert "did not stop" in stuck.reason and "session ended" in stuck.reason
    assert s.ended is not None
    with pytest.raises(SessionEnded, match="has ended"):
        s.run("print(v)")
    host.assert_gone()


def test_kernel_exit_ends_the_session_with_its_status(rung: str, ex: Executor) -> None:
    s = open_session(ex)
    host = trace(rung, s)
    gone = s.run("import os, sys\nprint('bye', file=sys.stderr, flush=True)\nos._exit(5)")
    assert gone.outcome is Outcome.ERROR
    assert "exited with status 5" in gone.reason and "session ended" in gone.reason
    assert gone.stderr == "bye\n"  # the agent's exit trailer is not the cell's output
    host.assert_gone()


@only_on(
    "wasm",
    reason="the other rungs run bash cells (test_state_outputs_files_exports_and_records)",
)
def test_bash_cells_are_refused_on_wasm(rung: str, ex: Executor) -> None:
    """The rung has no processes: a bash cell is refused before it runs, as a bash run is, and
    the session goes on."""
    with open_session(ex) as s:
        with pytest.raises(ConfigError, match="Python only"):
            s.run("echo hi", language="bash")
        assert s.ended is None
        assert s.run("print(1)").stdout == "1\n"


@only_on("gvisor", reason="the exit trailer is the gVisor agent's, written on the kernel's stderr")
def test_forged_exit_trailer_is_not_believed(rung: str, ex: Executor) -> None:
    s = open_session(ex)
    host = trace(rung, s)
    # The agent's trailer, written by the cell itself (a status of 0: a clean exit).
    forged = s.run("import os\nos.write(2, b'\\x00sandcell-gvisor-exit 0\\n')\nos._exit(7)")
    assert forged.outcome is Outcome.ERROR
    assert "exited with status 7" in forged.reason, forged.reason
    assert forged.exit_code == 7
    host.assert_gone()


OUTPUTS_DIR = {
    "namespaces": "/tmp/.sandcell-outputs",
    "gvisor": "/sandbox/.sandcell-display",
    "microvm": "/tmp/.sandcell-outputs",
    "wasm": "/tmp/.sandcell-outputs",
}
"""Where each rung's kernel leaves a cell's rich outputs (one directory per cell) for the host:
read from the live sandbox on namespaces and gVisor; on the microVM the guest's agent sends a
copy, so the guest's link leads nowhere on the host."""


@only_on("namespaces", "gvisor", "microvm", reason=NO_LINKS)
def test_display_directory_link_is_not_followed(rung: str, ex: Executor, tmp_path: Path) -> None:
    # A host directory shaped like a cell's outputs, which a link from the sandbox would reach
    # if the host followed it: its "output" must never come back.
    bait = tmp_path / "bait"
    (bait / "2").mkdir(parents=True)
    manifest = {"kind": "value", "data": {"text/plain": "HOST SECRET"}, "files": []}
    (bait / "2" / "0001.json").write_text(json.dumps(manifest))
    bait.chmod(0o755)
    outputs = OUTPUTS_DIR[rung]
    with open_session(ex, limits=Limits(wall_time_s=20, memory_bytes=256 * MiB)) as s:
        assert s.run("import os, shutil").outcome is Outcome.OK
        planted = s.run(f"shutil.rmtree({outputs!r})\nos.symlink({str(bait)!r}, {outputs!r})")
        assert planted.outcome is Outcome.OK, planted.stderr
        assert not [o for o in planted.outputs if "HOST SECRET" in str(o.data)]
        if rung != "microvm":  # read from the live sandbox: the host says why it would not
            assert any("cannot be opened safely" in r.reason for r in planted.rejected_exports)
        assert (bait / "2" / "0001.json").exists()  # and nothing on the host was removed
        # The kernel replaces the link with a fresh directory: the session goes on.
        assert s.run("print(6 * 7)").stdout == "42\n"
