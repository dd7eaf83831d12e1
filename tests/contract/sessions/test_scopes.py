"""Scopes of a session's kernel on every rung: namespaces of their own inside the one sandbox.

Two scopes keep separate variables, neither sees the session's main namespace nor changes it,
each runs in its own working directory (and the main one keeps its own), a dropped scope starts
afresh, and files are shared (one sandbox). A scope's missing directory fails its cell, not the
session; its last expression's value is shown; bad scope options are refused before running.
"""

from __future__ import annotations

import pytest
from tests.contract.sessions.rungs import open_session

from sandcell import Executor, Limits, Outcome
from sandcell.errors import ConfigError
from sandcell.sessions import Session
from sandcell.spec import MiB


def _out(session: Session, code: str, scope: str | None = None, cwd: str | None = None) -> str:
    result = session.run(code, scope=scope, cwd=cwd)
    assert result.outcome is Outcome.OK, (result.reason, result.stderr)
    return result.stdout


def _check_scopes(session: Session) -> None:
    """The promises of scopes, on one live session."""
    _out(session, "import os\nos.makedirs('a', exist_ok=True)\nos.makedirs('b', exist_ok=True)")
    home = _out(session, "x = 'main'\nprint(os.getcwd())").strip()
    _out(session, "x = 1", scope="one", cwd=f"{home}/a")
    _out(session, "x = 2", scope="two", cwd=f"{home}/b")
    assert _out(session, "print(x)", scope="one") == "1\n"
    assert _out(session, "print(x)", scope="two") == "2\n"
    assert _out(session, "print(x)") == "main\n"
    # A scope is a fresh __main__: the main namespace's import of os is not in it.
    assert _out(session, "print('os' in dir(), __name__)", scope="one") == "False __main__\n"
    # Each cell of a scope runs in the scope's directory; the main one keeps its own.
    assert _out(session, "import os\nprint(os.getcwd())", scope="one") == f"{home}/a\n"
    assert _out(session, "import os\nprint(os.getcwd())", scope="two") == f"{home}/b\n"
    assert _out(session, "print(os.getcwd())") == f"{home}\n"
    # Files are the sandbox's: what one scope writes (relative to its directory), others read.
    _out(session, "open('note.txt', 'w').write('from one')", scope="one")
    assert _out(session, "print(open('a/note.txt').read())") == "from one\n"
    # A chdir inside a scope stays the scope's.
    _out(session, "os.chdir('..')", scope="two")
    assert _out(session, "print(os.getcwd())", scope="two") == f"{home}\n"
    assert _out(session, "print(os.getcwd())", scope="one") == f"{home}/a\n"
    # Dropped: the scope's next cell starts from nothing; the others are untouched.
    session.drop_scope("one")
    gone = session.run("print(x)", scope="one")
    assert gone.outcome is Outcome.ERROR
    assert "NameError" in gone.stderr
    assert _out(session, "print(x)", scope="two") == "2\n"
    assert _out(session, "print(x)") == "main\n"
    session.drop_scope("never-used")
    assert session.cells == 19  # every cell above is a run; the drops are not


def test_scopes(ex: Executor) -> None:
    with open_session(ex, limits=Limits(wall_time_s=60, memory_bytes=256 * MiB)) as session:
        _check_scopes(session)
        # A scope's missing directory fails its cell, not the session.
        missing = session.run("x = 3", scope="lost", cwd="/nonexistent-dir")
        assert missing.outcome is Outcome.ERROR
        assert "FileNotFoundError" in missing.stderr
        assert _out(session, "print('alive')") == "alive\n"
        # Rich outputs (the display module) come from a scope's last expression too.
        shown = session.run("6 * 7", scope="two")
        assert shown.outcome is Outcome.OK
        assert [o.data.get("text/plain") for o in shown.outputs] == ["42"]
        # Options that cannot hold are refused before the cell runs.
        with pytest.raises(ConfigError, match="scope="):
            session.run("x = 1", cwd="/tmp")
        with pytest.raises(ConfigError, match="scope= names a namespace"):
            session.run("echo hi", language="bash", scope="one")
        with pytest.raises(ConfigError, match="1 to 256"):
            session.run("x = 1", scope="")
        assert _out(session, "print(x)", scope="two") == "2\n"
