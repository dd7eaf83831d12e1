"""``sandcell wasm show``/``install`` (the CLI over :mod:`sandcell.backends.wasm.dist`), and the
install's directory modes: root installs for every user of the host, whatever its umask."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from sandcell import status
from sandcell.backends.wasm import dist
from sandcell.cli import main
from sandcell.errors import IsolationUnavailable


def test_show_without_pyodide_says_why_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SANDCELL_WASM_DIR", str(tmp_path / "empty"))
    assert main(["wasm", "show", "--json"]) == status.EXIT_CONFIG
    doc = json.loads(capsys.readouterr().out)
    assert doc["installed"] is False
    assert doc["fix"]  # Node.js missing or Pyodide missing: either way a fix is named
    assert doc["dir"] == str(tmp_path / "empty" / f"pyodide-{dist.PYODIDE_VERSION}")


def test_show_prints_the_installed_pyodide(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        found = dist.find()
    except IsolationUnavailable as exc:
        pytest.skip(f"no Pyodide on this host: {exc}")
    assert main(["wasm", "show", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["installed"] is True
    assert doc["version"] == dist.PYODIDE_VERSION == found.version
    assert doc["python"] == dist.PYTHON_VERSION
    assert doc["dir"] == str(found.directory)
    assert doc["node"] == found.node


def test_install_dirs_are_readable_by_everyone_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        dist._make_readable_dirs(tmp_path / "var" / "lib" / "wasm" / "pyodide.new")
    finally:
        os.umask(old)
    for d in (tmp_path / "var", tmp_path / "var/lib", tmp_path / "var/lib/wasm/pyodide.new"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o755, d
