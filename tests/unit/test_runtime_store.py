"""The runtime store on its own: lock files, builds, lookups and verification.

Builds go into a temporary ``$SANDCELL_RUNTIMES_DIR``. A lock with a package installs a tiny wheel
written by the test (a zip with its ``METADATA``, ``WHEEL`` and ``RECORD``) through pip with
``--no-index --find-links``: no network, a second or so per build.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tomllib
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandcell.errors import ConfigError, IsolationUnavailable
from sandcell.runtimes.store import SHIPPED, build, find, list_runtimes, shipped_lock, verify
from sandcell.runtimes.store.locks import Lock, parse
from sandcell.runtimes.store.store import StoredRuntime, forget_verified, python_tag

REPO = Path(__file__).resolve().parents[2]


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def write_wheel(where: Path, name: str = "tinypkg", version: str = "1.0") -> Path:
    """A pure-Python wheel of one module ``name`` (what pip needs of a wheel, nothing more)."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {version!r}\n\ndef double(x):\n    return 2 * x\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: sandcell-tests\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n"
        ),
        f"{dist_info}/top_level.txt": f"{name}\n",
    }
    record = [
        f"{path},{_record_hash(text.encode())},{len(text.encode())}" for path, text in files.items()
    ]
    record.append(f"{dist_info}/RECORD,,")
    path = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            # A fixed date: the wheel's bytes (and so its hash in the lock) are the same each time.
            zf.writestr(zipfile.ZipInfo(member, date_time=(2020, 1, 1, 0, 0, 0)), text)
        zf.writestr(
            zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)),
            "\n".join(record) + "\n",
        )
    return path


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("wheels")
    write_wheel(where)
    return where


def tiny_lock(wheels: Path, name: str = "tiny") -> Lock:
    wheel = wheels / "tinypkg-1.0-py3-none-any.whl"
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return parse(
        name, f"test:{name}", f"# a test lock\ntinypkg==1.0 \\\n    --hash=sha256:{digest}\n"
    )


def offline(wheels: Path) -> list[str]:
    return ["--no-index", "--find-links", str(wheels)]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty store of this test's own, and a verification cache nobody else writes."""
    base = tmp_path / "runtimes"
    monkeypatch.setenv("SANDCELL_RUNTIMES_DIR", str(base))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    forget_verified()
    yield base
    forget_verified()


# -- lock files ---------------------------------------------------------------------------------

HEX = "ab" * 32


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("numpy==2.4.6\n", "not an exact pin with hashes"),
        ("numpy>=2.4 --hash=sha256:" + HEX + "\n", "not an exact pin with hashes"),
        ("numpy --hash=sha256:" + HEX + "\n", "not an exact pin with hashes"),
        ("--index-url https://example.org/simple\n", "is the pip option '--index-url'"),
        ("--extra-index-url=https://example.org\n", "pip option"),
        ("-e ./src\n", "pip option '-e'"),
        (f"numpy==2.4.6 --hash=sha256:{HEX}\nNumPy==2.4.6 --hash=sha256:{HEX}\n", "pinned twice"),
    ],
)
def test_a_lock_that_is_not_exact_and_hashed_is_refused_with_the_line(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match="runtime lock test:x") as info:
        parse("x", "test:x", text)
    assert says in str(info.value)


def test_a_runtime_name_is_checked() -> None:
    with pytest.raises(ConfigError, match="not a runtime name"):
        parse("../etc", "test", "")
    with pytest.raises(ConfigError, match="ships no runtime lock 'nope'"):
        shipped_lock("nope")


def test_the_shipped_locks_parse_and_hold_the_defaults_pins() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    default_pins = {
        name: version
        for name, _, version in (d.partition("==") for d in deps)
        if name in ("numpy", "pandas", "matplotlib")
    }
    assert len(default_pins) == 3, deps
    locks = {name: shipped_lock(name) for name in SHIPPED}
    assert locks["minimal"].pins == ()
    for name in ("analysis", "datascience"):
        pins = {p.name: p.version for p in locks[name].pins}
        assert {k: pins.get(k) for k in default_pins} == default_pins, name
        assert all(p.hashes for p in locks[name].pins)
    wanted = {
        "scipy", "scikit-learn", "statsmodels", "seaborn", "pyarrow", "openpyxl", "xlrd",
        "tabulate", "sympy", "pillow", "beautifulsoup4", "lxml",
    }  # fmt: skip
    assert wanted <= {p.name for p in locks["datascience"].pins}
    # analysis is a subset of datascience at the same versions: code moves between them.
    analysis = {(p.name, p.version) for p in locks["analysis"].pins}
    assert analysis <= {(p.name, p.version) for p in locks["datascience"].pins}


# -- build and lookup ---------------------------------------------------------------------------


def test_minimal_builds_offline_and_is_found(store: Path) -> None:
    built = build(shipped_lock("minimal"), store)
    assert built.manifest.distributions == {} and built.manifest.imports == ()
    assert built.manifest.python == python_tag()
    assert built.tree == store / "sha256" / built.manifest.tree_sha256
    assert built.site_packages.is_dir() and not any(built.site_packages.iterdir())
    found = find("minimal")
    assert found == built
    verify(found)
    assert [r.manifest.name for r in list_runtimes()] == ["minimal"]


def test_a_rebuild_gives_the_same_tree_and_keeps_the_first(
    store: Path, wheels: Path, tmp_path: Path
) -> None:
    lock = tiny_lock(wheels)
    first = build(lock, store, pip_args=offline(wheels))
    assert first.manifest.distributions == {"tinypkg": "1.0"}
    assert "tinypkg" in first.manifest.imports
    assert first.manifest.lock_sha256 == lock.sha256
    package = first.site_packages / "tinypkg"
    # Compiled at build time, for the path the sandbox sees, read-only.
    assert list((package / "__pycache__").glob("__init__.cpython-*.pyc"))
    assert (package / "__init__.py").stat().st_mode & 0o777 == 0o444
    assert package.stat().st_mode & 0o777 == 0o555
    inode = first.tree.stat().st_ino

    again = build(lock, store, pip_args=offline(wheels))
    assert again.manifest.tree_sha256 == first.manifest.tree_sha256
    assert again.tree.stat().st_ino == inode  # the first tree kept, the new one dropped
    assert sorted(p.name for p in (store / "sha256").iterdir()) == sorted(
        [first.manifest.tree_sha256, f"{first.manifest.tree_sha256}.json"]
    )
    assert not [p for p in store.iterdir() if p.name.startswith(".build-")]

    # Built elsewhere (another store path): still the same hash.
    elsewhere = build(lock, tmp_path / "elsewhere", pip_args=offline(wheels))
    assert elsewhere.manifest.tree_sha256 == first.manifest.tree_sha256


def test_a_failed_install_stores_nothing(store: Path, wheels: Path, tmp_path: Path) -> None:
    lock = parse("broken", "test:broken", f"tinypkg==1.0 --hash=sha256:{HEX}\n")
    with pytest.raises(Exception, match="pip could not install runtime 'broken'"):
        build(lock, store, pip_args=offline(wheels))
    assert list((store / "sha256").iterdir()) == []
    assert list((store / "names").iterdir()) == []


def test_a_missing_runtime_names_the_build_command(store: Path) -> None:
    with pytest.raises(ConfigError, match="sandcell runtime build nothere"):
        find("nothere")
    build(shipped_lock("minimal"), store)
    with pytest.raises(ConfigError, match="sandcell runtime build analysis"):
        find("analysis")


def test_a_runtime_built_for_another_python_is_refused(store: Path) -> None:
    built = build(shipped_lock("minimal"), store)
    where = store / "sha256" / f"{built.manifest.tree_sha256}.json"
    data = json.loads(where.read_text())
    data["python"] = "3.99"
    where.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        find("minimal")
    assert "built for Python 3.99" in str(info.value)
    assert "sandcell runtime build minimal" in str(info.value)


def test_a_manifest_that_names_another_tree_is_refused(store: Path) -> None:
    built = build(shipped_lock("minimal"), store)
    where = store / "sha256" / f"{built.manifest.tree_sha256}.json"
    where.write_text(where.read_text().replace(built.manifest.tree_sha256, "0" * 64))
    with pytest.raises(IsolationUnavailable, match="names another tree"):
        find("minimal")


# -- verification -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built_tiny(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Path:
    """One store with the tiny runtime, copied by each tampering test."""
    base = tmp_path_factory.mktemp("tiny-store") / "runtimes"
    build(tiny_lock(wheels), base, pip_args=offline(wheels))
    return base


def _writable(path: Path) -> None:
    # As root the read-only modes do not stop a write; as a user they would.
    path.chmod(path.stat().st_mode | 0o200)


def _change_file(site: Path) -> None:
    target = site / "tinypkg" / "__init__.py"
    _writable(target)
    target.write_text("VALUE = 'evil'\n")


def _add_file(site: Path) -> None:
    _writable(site / "tinypkg")
    (site / "tinypkg" / "extra.py").write_text("")


def _chmod(site: Path) -> None:
    (site / "tinypkg" / "__init__.py").chmod(0o555)


def _symlink_swap(site: Path) -> None:
    # The same bytes, reached through a link out of the tree: refused all the same.
    target = site / "tinypkg" / "__init__.py"
    outside = site.parents[3] / "outside.py"
    outside.write_bytes(target.read_bytes())
    _writable(site / "tinypkg")
    target.unlink()
    target.symlink_to(outside)


TAMPERS: dict[str, Callable[[Path], None]] = {
    "changed-file": _change_file,
    "added-file": _add_file,
    "chmod": _chmod,
    "symlink-swap": _symlink_swap,
}


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_a_tampered_tree_is_refused(
    tamper: str, built_tiny: Path, store: Path, tmp_path: Path
) -> None:
    shutil.copytree(built_tiny, store, symlinks=True)
    stored = find("tiny")
    verify(stored)  # clean: passes, and the cache remembers its fingerprint
    TAMPERS[tamper](stored.site_packages)
    forget_verified()
    # Not full: the changed fingerprint alone must send it to a full hash.
    with pytest.raises(IsolationUnavailable) as info:
        verify(stored)
    assert "tampered" in str(info.value)
    assert "sandcell runtime build tiny" in str(info.value)
    with pytest.raises(IsolationUnavailable):
        verify(stored, full=True)


def test_a_missing_tree_is_refused(built_tiny: Path, store: Path) -> None:
    shutil.copytree(built_tiny, store, symlinks=True)
    stored = find("tiny")
    moved = StoredRuntime(stored.manifest, stored.tree.with_name("gone"))
    with pytest.raises(IsolationUnavailable, match=r"are missing.*sandcell runtime build tiny"):
        verify(moved)


def test_verification_is_remembered_until_the_tree_changes(built_tiny: Path, store: Path) -> None:
    shutil.copytree(built_tiny, store, symlinks=True)
    stored = find("tiny")
    verify(stored)
    cached = list((Path(os.environ["XDG_CACHE_HOME"]) / "sandcell" / "runtime-verified").iterdir())
    assert [p.name for p in cached] == [stored.manifest.tree_sha256]
    forget_verified()
    verify(stored)  # the cache's fingerprint still matches
