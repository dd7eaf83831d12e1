"""A named runtime rebuilt or replaced under a running executor (as under a running service).

A warm template made from the old build would go on serving runs from it (from a removed tree,
every import not made yet failed until a restart). Its runs start cold instead, in the build the
store holds now, and the record says why; a tree replaced under the process is verified again
before a run uses it. The store here is a private copy of the built ``minimal`` runtime
(``SANDCELL_RUNTIMES_DIR``), changed the ways a rebuild changes it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import runtime_required

from sandcell import Executor, Outcome, RunRequest
from sandcell.backends.warm import WarmConfig
from sandcell.errors import IsolationUnavailable
from sandcell.runtimes.store import find, verify
from sandcell.runtimes.store.stamp import TreeStamp

NAME = "minimal"


def _writable(root: Path) -> None:
    for dirpath, _, _ in os.walk(root):
        os.chmod(dirpath, 0o755)


def _point(base: Path, tree_sha: str, lock_sha: str) -> None:
    pointer = base / "names" / f"{NAME}.json"
    pointer.write_text(json.dumps({"tree_sha256": tree_sha, "lock_sha256": lock_sha}))


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("the warm template of this test runs as root")
    runtime_required(NAME)
    built = find(NAME)
    sha = built.manifest.tree_sha256
    base = tmp_path / "runtimes"
    (base / "names").mkdir(parents=True)
    (base / "sha256").mkdir()
    shutil.copytree(built.tree, base / "sha256" / sha, symlinks=True)
    shutil.copy(built.tree.with_name(f"{sha}.json"), base / "sha256")
    _point(base, sha, built.manifest.lock_sha256)
    monkeypatch.setenv("SANDCELL_RUNTIMES_DIR", str(base))
    try:
        yield base
    finally:
        _writable(base)
        shutil.rmtree(base, ignore_errors=True)


def _replace(tree: Path) -> None:
    """As a rebuild of a changed tree does: the same content in a new directory at its path."""
    aside = tree.with_name(".replaced")
    os.rename(tree, aside)
    shutil.copytree(aside, tree, symlinks=True)
    _writable(aside)
    shutil.rmtree(aside)


def test_a_replaced_tree_is_not_served_warm(store: Path, tmp_path: Path) -> None:
    warm = WarmConfig(mode="template", runtime=NAME, preload=())
    request = RunRequest(code="print(1)", runtime=NAME)
    with Executor(home=tmp_path / "home", profile="unchecked", warm=warm) as ex:
        first = ex.run(request)
        assert (first.outcome, first.start.mode) == (Outcome.OK, "template"), first.reason
        _replace(find(NAME).tree)
        second = ex.run(request)
    assert (second.outcome, second.stdout) == (Outcome.OK, "1\n"), second.reason
    assert second.start.mode == "cold"
    assert second.enforcement is not None
    why = second.enforcement.layers["warm_start"]
    assert "were replaced since the template was made" in why, why


def test_a_stamp_names_each_change(store: Path) -> None:
    built = find(NAME)
    stamp = TreeStamp.of(built)
    assert stamp.changed() is None
    _replace(built.tree)
    assert stamp.changed() == f"the files of runtime {NAME} at {built.tree} were replaced"
    other = "0" * 64
    _point(store, other, built.manifest.lock_sha256)
    assert (stamp.changed() or "").startswith(f"runtime {NAME} can no longer be found")
    manifest = json.loads(built.tree.with_name(f"{stamp.tree_sha256}.json").read_text())
    (store / "sha256" / f"{other}.json").write_text(json.dumps({**manifest, "tree_sha256": other}))
    rebuilt = f"runtime {NAME} was rebuilt ({stamp.tree_sha256[:12]} -> {other[:12]})"
    assert stamp.changed() == rebuilt


def test_a_tree_replaced_after_its_verification_is_verified_again(store: Path) -> None:
    built = find(NAME)
    verify(built)
    tree = built.tree
    aside = tree.with_name(".changed")
    os.rename(tree, aside)
    shutil.copytree(aside, tree, symlinks=True)
    _writable(tree)
    (tree / "planted.py").write_text("print('not built')\n")
    with pytest.raises(IsolationUnavailable, match="changed since it was built"):
        verify(built)
