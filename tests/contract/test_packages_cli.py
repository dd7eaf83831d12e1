"""``sandcell packages``: the wheel cache from the command line, with a real ``pip download``.

Each test runs the command in a subprocess with ``SANDCELL_HOME`` in a temporary directory. The
download test needs the package index: where pip cannot reach it (sandcell says so with exit
status 75, "retry later", and says why), the test is skipped with pip's words; any other failure
fails it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sandcell.status import EXIT_CONFIG, EXIT_INFRA

_UNREACHABLE = re.compile(
    r"^sandcell: (pip could not reach the package index for |pip download \S+ took over )",
    re.MULTILINE,
)
"""The only failures that skip: the index is unreachable or too slow from this host."""

PIN = "tomli==2.0.1"
"""Small, pure Python, no dependencies, and a wheel for every Python 3."""


def sandcell(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``sandcell ARGS`` with its data directory in ``home``."""
    return subprocess.run(
        [sys.executable, "-m", "sandcell", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "SANDCELL_HOME": str(home)},
        timeout=600,
        check=False,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


def test_add_list_verify_with_a_real_download(home: Path) -> None:
    added = sandcell(home, "packages", "add", PIN)
    if added.returncode == EXIT_INFRA and _UNREACHABLE.search(added.stderr):
        pytest.skip(f"pip cannot reach the package index here: {added.stderr.strip()[-300:]}")
    # Any other failure, infrastructure ones included (a store that cannot be written, pip
    # leaving the wrong files), is sandcell's and fails the test.
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("tomli 2.0.1  imports: tomli  sha256: "), added.stdout

    listed = sandcell(home, "packages", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)
    assert entry["name"] == "tomli"
    assert entry["version"] == "2.0.1"
    assert entry["imports"] == ["tomli"]
    assert entry["wheel"] == "tomli-2.0.1-py3-none-any.whl"
    assert len(entry["sha256"]) == 64
    site = home / "wheels" / "site" / "tomli-2.0.1"
    assert entry["path"] == str(site)
    assert (site / "tomli" / "__init__.py").is_file()
    lock = json.loads((home / "wheels" / "lock.json").read_text())
    assert lock["tomli"]["sha256"] == entry["sha256"]

    plain = sandcell(home, "packages", "list")
    assert plain.stdout == f"tomli 2.0.1  imports: tomli  sha256: {entry['sha256'][:12]}\n"

    verified = sandcell(home, "packages", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith("wheel cache OK: 1 packages"), verified.stdout

    # The same pin again: nothing downloaded, nothing changed.
    before = (home / "wheels" / "lock.json").read_bytes()
    again = sandcell(home, "packages", "add", PIN)
    assert again.returncode == 0, again.stderr
    assert (home / "wheels" / "lock.json").read_bytes() == before

    (site / "tomli" / "_parser.py").write_text("import os\n")
    tampered = sandcell(home, "packages", "verify")
    assert tampered.returncode == 1
    assert "tomli/_parser.py was changed after extraction" in tampered.stdout


@pytest.mark.parametrize("requirement", ["six", "six>=1.16"])
def test_unpinned_add_is_a_config_error(home: Path, requirement: str) -> None:
    p = sandcell(home, "packages", "add", requirement)
    assert p.returncode == EXIT_CONFIG, p.stderr
    assert "is not pinned: pin it to one version, as NAME==VERSION" in p.stderr
    assert not (home / "wheels" / "lock.json").exists()


def test_add_local_wheel_then_remove(home: Path, tmp_path: Path) -> None:
    wheel = tmp_path / "tiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("tiny.py", "X = 1\n")
        zf.writestr("tiny-1.0.dist-info/METADATA", "Name: tiny\nVersion: 1.0\n")
        record = "tiny.py,,\ntiny-1.0.dist-info/METADATA,,\ntiny-1.0.dist-info/RECORD,,\n"
        zf.writestr("tiny-1.0.dist-info/RECORD", record)
    added = sandcell(home, "packages", "add", "--wheel", str(wheel))
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("tiny 1.0  imports: tiny  ")
    assert sandcell(home, "packages", "remove", "tiny").returncode == 0
    assert json.loads(sandcell(home, "packages", "list", "--json").stdout) == []
    gone = sandcell(home, "packages", "remove", "tiny")
    assert gone.returncode == 1
    assert "tiny is not in the wheel cache" in gone.stderr


def test_unsafe_local_wheel_is_a_config_error(home: Path, tmp_path: Path) -> None:
    wheel = tmp_path / "tiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("../evil.py", "X = 1\n")
    p = sandcell(home, "packages", "add", "--wheel", str(wheel))
    assert p.returncode == EXIT_CONFIG
    assert "climbing out" in p.stderr
    assert not (tmp_path / "evil.py").exists()


def test_runtime_lock_written_then_checked(home: Path, tmp_path: Path) -> None:
    lock = tmp_path / "runtime.lock"
    p = sandcell(home, "packages", "lock-runtime", str(lock))
    assert p.returncode == 0, p.stderr
    lines = lock.read_text().splitlines()
    numpy = next(line for line in lines if line.startswith("numpy=="))
    assert "# record-sha256:" in numpy
    assert sandcell(home, "packages", "check-runtime", str(lock)).returncode == 0
    # A runtime that drifted from its lock is reported, naming the package.
    lock.write_text(lock.read_text().replace(numpy.split()[0], "numpy==0.0.1"))
    p = sandcell(home, "packages", "check-runtime", str(lock))
    assert p.returncode == 1
    assert "numpy" in p.stdout
