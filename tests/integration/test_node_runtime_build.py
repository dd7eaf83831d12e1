"""The Node runtime as built on this host: it verifies, it lists its packages, a rebuild by an
ordinary user into their own store is the same tree, a changed tree is refused, and a real
program uses its packages in the namespaces sandbox.

The system store's runtime is what ``.ci/run`` builds (``sandcell runtime build node`` as root);
without it these tests skip, saying so. The rebuild fetches through npm (its cache, its registry).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import UnprivEnv, run_as_user, run_cli

from sandcell import Executor, RunRequest
from sandcell.errors import ConfigError, IsolationUnavailable
from sandcell.runtimes.node import node_runtime
from sandcell.runtimes.node.locked import node_lock
from sandcell.runtimes.store import find, verify
from sandcell.runtimes.store.store import StoredRuntime, forget_verified
from sandcell.spec import Outcome


@pytest.fixture(scope="module")
def stored() -> StoredRuntime:
    try:
        return find("node")
    except ConfigError as exc:
        pytest.skip(f"the node runtime is not built on this host ({exc})")


def test_the_built_runtime_verifies_and_shows_node_and_every_package(
    stored: StoredRuntime,
) -> None:
    verify(stored, full=True)
    m = stored.manifest
    lock = node_lock()
    assert m.kind == "node" and m.lock_sha256 == lock.sha256
    assert m.distributions == lock.packages and set(m.imports) == set(lock.top_level)
    assert (stored.tree / "node" / "bin" / "node").is_file()
    assert (stored.tree / "node_modules" / "lodash").stat().st_mode & 0o222 == 0
    env = {k: v for k, v in os.environ.items() if k != "SANDCELL_RUNTIMES_DIR"}
    shown = run_cli(["runtime", "show", "node"], env=env)
    assert shown.returncode == 0, shown.stderr
    assert "Node.js 22.23.5" in shown.stdout and lock.sha256 in shown.stdout
    for name, version in lock.packages.items():
        assert f"    {name}@{version}\n" in shown.stdout
    listed = run_cli(["runtime", "list", "--json"], env=env)
    node = next(r for r in json.loads(listed.stdout) if r["name"] == "node")
    assert node["kind"] == "node" and node["tree_sha256"] == m.tree_sha256


@pytest.fixture
def user_store(unpriv: UnprivEnv) -> Iterator[Path]:
    store = unpriv.home / "runtimes"
    yield store
    for dirpath, _, _ in os.walk(store):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(store, ignore_errors=True)


def test_an_ordinary_users_build_is_the_same_tree_and_a_changed_one_is_refused(
    stored: StoredRuntime,
    unpriv: UnprivEnv,
    user_store: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed; the node runtime's build needs it")
    env = {"SANDCELL_RUNTIMES_DIR": str(user_store)}
    built = run_as_user(unpriv, ["runtime", "build", "node"], extra_env=env, timeout=600)
    assert built.returncode == 0, built.stderr.decode()
    # The same pins give the same bytes, whoever builds them, wherever.
    assert stored.manifest.tree_sha256 in built.stdout.decode()
    tree = user_store / "sha256" / stored.manifest.tree_sha256
    assert tree.stat().st_uid != 0

    lodash = tree / "node_modules" / "lodash"
    lodash.chmod(0o755)
    (lodash / "chunk.js").chmod(0o644)
    with (lodash / "chunk.js").open("a") as f:
        f.write("\nmodule.exports = () => 'changed';\n")
    monkeypatch.setenv("SANDCELL_RUNTIMES_DIR", str(user_store))
    forget_verified()
    with pytest.raises(IsolationUnavailable, match="refused as tampered"):
        node_runtime()
    checked = run_as_user(unpriv, ["runtime", "verify", "node"], extra_env=env)
    assert checked.returncode == 1 and b"refused as tampered" in checked.stderr
    # The build puts the locked tree back (the changed one is moved aside, never used).
    rebuilt = run_as_user(unpriv, ["runtime", "build", "node"], extra_env=env, timeout=600)
    assert rebuilt.returncode == 0, rebuilt.stderr.decode()
    forget_verified()
    assert node_runtime().tree_sha256 == stored.manifest.tree_sha256


def test_a_program_uses_the_locked_packages_in_the_sandbox(
    stored: StoredRuntime, executor: Executor
) -> None:
    code = """
const _ = require("lodash");
const fs = require("node:fs");
console.log(JSON.stringify(_.chunk([1, 2, 3], 2)));
console.log(process.version, process.execPath, require.resolve("lodash"));
let write = "written";
try { fs.writeFileSync("/node_modules/lodash/x.js", "1"); } catch (e) { write = e.code; }
console.log(write, require("yaml").stringify({ a: 1 }).trim());
"""
    result = executor.run(RunRequest(code=code, language="javascript"))
    assert result.outcome is Outcome.OK, (result.stderr, result.reason)
    lines = result.stdout.splitlines()
    assert lines[0] == "[[1,2],[3]]"
    assert lines[1] == "v22.23.5 /opt/sandcell/node/bin/node /node_modules/lodash/lodash.js"
    # Node's permission model refuses the write before the read-only mount would.
    assert lines[2] == "ERR_ACCESS_DENIED a: 1"
    assert result.runtime is not None
    assert result.runtime.name == "node"
    assert result.runtime.tree_sha256 == stored.manifest.tree_sha256
    assert result.runtime.lock_sha256 == node_lock().sha256
