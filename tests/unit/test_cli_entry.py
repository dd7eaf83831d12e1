"""The ``sandcell`` command's first step (:mod:`sandcell._entry`): what it serves itself and what
it leaves to the full command line, the socket it looks for, and what it imports.

Its runs against a real service, with output compared to the full command line's, are in
tests/service/test_cli_fast.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sandcell import _entry
from sandcell.home import data_dir

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-c", "print(1)"], ("print(1)", "python", None, False)),
        (["-c", ""], ("", "python", None, False)),
        (["--lang", "bash", "-c", "echo hi"], ("echo hi", "bash", None, False)),
        (["--lang=bash", "-c", "echo"], ("echo", "bash", None, False)),
        (["--lang", "js", "-c", "1"], ("1", "javascript", None, False)),
        (["--lang=TS", "-c", "1"], ("1", "typescript", None, False)),
        (["-c", "x", "--profile", "analysis", "--json"], ("x", "python", "analysis", True)),
        (["--profile=", "-c", "x"], ("x", "python", "", False)),
    ],
)
def test_plain_runs_are_served(args: list[str], expected: tuple[object, ...]) -> None:
    assert _entry._run_options(args) == expected


@pytest.mark.parametrize(
    "args",
    [
        [],  # no program: the full command line says so
        ["-c", "x", "prog.py"],  # both
        ["-c", "x", "-c", "y"],  # given twice
        ["-cprint(1)"],  # attached value: argparse's business
        ["-c=x"],
        ["-c"],
        ["-c", "-x"],  # a value that looks like an option
        ["--lang", "cobol", "-c", "x"],  # not a choice: argparse's error
        ["--pro", "analysis", "-c", "x"],  # an abbreviation
        ["-c", "x", "--timeout", "5"],  # an option this step does not send
        ["-c", "x", "--no-service"],
        ["-c", "x", "--json=1"],
        ["-"],  # the program on stdin
        ["--", "-c"],
        ["missing-program-file.py"],  # unreadable: the full command line says why
    ],
)
def test_anything_else_is_the_full_command_lines(args: list[str]) -> None:
    assert _entry._run_options(args) is None


def test_a_program_file_is_read_as_run_reads_it(tmp_path: Path) -> None:
    program = tmp_path / "prog.py"
    program.write_bytes("print('é')\r\nprint(2)\n".encode())
    served = _entry._run_options([str(program)])
    # Text mode, as Path.read_text: CRLF is read as LF.
    assert served is not None and served[0] == "print('é')\nprint(2)\n"
    program.write_bytes(b"\xff\xfe")
    assert _entry._run_options([str(program)]) is None  # not UTF-8: the full CLI says so


def _plan_env(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name in ("SANDCELL_URL", "SANDCELL_HOME", "SANDCELL_PROFILE", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SANDCELL_API_KEY", "sc_test-key")
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_the_plan_needs_a_key_and_a_local_socket(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _plan_env(monkeypatch, SANDCELL_HOME=str(tmp_path))
    plan = _entry._plan(["run", "-c", "print(1)"])
    assert plan is not None and plan.socket == str(tmp_path / "service.sock")
    assert plan.key == "sc_test-key" and not plan.as_json
    assert b'"code": "print(1)"' in plan.payload
    elsewhere = _entry._plan(["--home", "/srv/sc", "run", "-c", "x"])
    assert elsewhere is not None and elsewhere.socket == "/srv/sc/service.sock"
    joined = _entry._plan(["--home=/srv/sc", "run", "-c", "x"])
    assert joined is not None and joined.socket == "/srv/sc/service.sock"
    unix = "/run/sc.sock"
    monkeypatch.setenv("SANDCELL_URL", f"unix:{unix}")
    assert getattr(_entry._plan(["run", "-c", "x"]), "socket", None) == unix
    for url in ("http://127.0.0.1:8790", "https://sc.example", "unix:"):
        monkeypatch.setenv("SANDCELL_URL", url)
        assert _entry._plan(["run", "-c", "x"]) is None, url  # TCP: the full command line
    monkeypatch.delenv("SANDCELL_URL")
    for key in ("", "has space", "ctl\x01", "naïve"):
        monkeypatch.setenv("SANDCELL_API_KEY", key)
        assert _entry._plan(["run", "-c", "x"]) is None, key
    monkeypatch.setenv("SANDCELL_API_KEY", "sc_test-key")
    for argv in (["session", "list"], ["--home"], ["--home", "", "run", "-c", "x"], ["runs"]):
        assert _entry._plan(argv) is None, argv


def test_the_profile_is_sent_by_name_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _plan_env(monkeypatch, SANDCELL_HOME=str(tmp_path), SANDCELL_PROFILE="analysis")
    plan = _entry._plan(["run", "-c", "x"])
    assert plan is not None and b'"profile": "analysis"' in plan.payload
    given = _entry._plan(["run", "-c", "x", "--profile", "strict"])
    assert given is not None and b'"profile": "strict"' in given.payload
    for path in ("./mine.toml", "dir/mine", "mine.toml"):
        assert _entry._plan(["run", "-c", "x", "--profile", path]) is None
    # A program that is not text (bytes that were not UTF-8 on the command line).
    assert _entry._plan(["run", "-c", "print('\udcff')"]) is None


def test_the_language_names_are_the_specs() -> None:
    from sandcell.spec import LANGUAGE_ALIASES

    assert dict(LANGUAGE_ALIASES) == _entry._LANGUAGES


def test_the_body_is_the_one_the_full_command_line_sends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import argparse
    import json

    from sandcell.cli.remote import Target
    from sandcell.cli.remote_run import request_body
    from sandcell.cli.run import add_parser

    _plan_env(monkeypatch, SANDCELL_HOME=str(tmp_path))
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    code = 'print("quote \\" é")\u2028\x1b[31m\n\ttab'
    for extra in ([], ["--lang", "bash"], ["--lang", "ts"], ["--profile", "analysis"]):
        argv = ["run", "-c", code, *extra]
        plan = _entry._plan(argv)
        assert plan is not None
        expected = request_body(parser.parse_args(argv), Target(key="k", socket=tmp_path))
        assert json.loads(plan.payload) == expected


@pytest.mark.parametrize(
    "env",
    [
        {"HOME": "/home/someone"},
        {"HOME": "/home/someone/"},
        {"HOME": "/"},
        {"HOME": "/home/someone", "XDG_DATA_HOME": "/data/xdg"},
        {"HOME": "/home/someone", "XDG_DATA_HOME": "relative/xdg"},
        {"HOME": "/home/someone", "XDG_DATA_HOME": ""},
    ],
)
def test_the_default_home_is_the_one_sandcell_uses(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    _plan_env(monkeypatch, **env)
    assert _entry._socket_path(None) == str(data_dir() / "service.sock")


def test_an_unusual_environment_leaves_the_home_to_the_full_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _plan_env(monkeypatch, HOME="relative/home")
    assert _entry._socket_path(None) is None
    monkeypatch.delenv("HOME")
    assert _entry._socket_path(None) is None


def test_the_first_step_imports_only_built_in_modules() -> None:
    """What ``import sandcell._entry`` adds to an interpreter's own start: none of the modules
    that made the command slow (re, typing, argparse, json, socket, pathlib, dataclasses, enum)
    and no other part of sandcell."""
    probe = (
        "import sys; before = set(sys.modules); import sandcell._entry; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    added = set(done.stdout.split())
    assert added <= {"sandcell", "sandcell._entry", "__future__"}, added


def test_the_command_is_installed_as_a_script_of_its_own() -> None:
    """pyproject.toml installs bin/sandcell (not an entry point, whose generated script imports
    ``re`` first), and that script is the first step."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["tool"]["setuptools"]["script-files"] == ["bin/sandcell"]
    assert "sandcell" not in project["project"].get("scripts", {})
    script = (REPO / "bin" / "sandcell").read_text(encoding="utf-8")
    assert script.startswith("#!python\n") and "from sandcell._entry import entry" in script
    done = subprocess.run(
        [sys.executable, str(REPO / "bin" / "sandcell"), "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "usage: sandcell" in done.stdout, done.stderr


class _Terminal:
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ("plain\n", True),
        ("tab\tand CRLF\r\n", True),
        ("bell\x07", False),
        ("esc \x1b[31mred", False),
        ("lone CR\roverwrite", False),
        ("CR CR LF\r\r\n", False),
        ("\r\t\n", False),
        ("del\x7f", False),
        ("bidi \u202e", False),
        ("c1 \x9b", False),
        ("accent é", False),  # kept by neutralise, but left to the full report all the same
    ],
)
def test_text_printed_as_it_is_on_a_terminal_is_text_neutralise_keeps(
    text: str, plain: bool
) -> None:
    from sandcell.validation import neutralise

    assert _entry._tty_plain(text, _Terminal()) is plain
    assert neutralise(text) == text if plain else neutralise(text) != text or not text.isascii()
    assert _entry._tty_plain(text, object())  # not a terminal: printed as it is
