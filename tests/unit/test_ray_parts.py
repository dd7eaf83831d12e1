"""sandcell.ray without a cluster: Ray stays optional, and the driver's checks on what comes back.

The batch on a real cluster is tests/integration/test_ray_batch.py.
"""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sandcell.artifacts import ArtifactStore
from sandcell.errors import ConfigError, InfraError


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )


def test_importing_sandcell_ray_does_not_import_ray(tmp_path: Path) -> None:
    proc = _python("import sys, sandcell.ray; print('ray' in sys.modules)", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_batch_ray_without_ray_says_how_to_install_it(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "a", "code": "print(1)"}) + "\n")
    # ``sys.modules['ray'] = None`` makes ``import ray`` fail as on a host without the extra.
    code = (
        "import sys\n"
        "sys.modules['ray'] = None\n"
        "from sandcell.cli import main\n"
        f"sys.exit(main(['--home', {str(tmp_path / 'home')!r}, 'batch', {str(tasks)!r}, "
        "'--ray', 'auto']))\n"
    )
    proc = _python(code, tmp_path)
    assert proc.returncode == 78, proc.stdout + proc.stderr
    assert "pip install 'sandcell[ray]'" in proc.stderr
    assert not (tmp_path / "tasks.results.jsonl").exists(), "nothing may run or be written"


def test_import_ray_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandcell.ray._ray import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r"sandcell\[ray\]"):
        import_ray()


def test_artifacts_from_a_node_are_stored_only_when_their_hash_matches(tmp_path: Path) -> None:
    from sandcell.ray.driver import _store_artifacts
    from sandcell.ray.worker import TaskOutput

    store = ArtifactStore(tmp_path / "artifacts")
    data = b"exported on a node"
    sha = hashlib.sha256(data).hexdigest()
    _store_artifacts(store, TaskOutput(line={"id": "t"}, artifacts={sha: data}))
    assert store.path_for(sha).read_bytes() == data

    other = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(InfraError, match="arrived damaged"):
        _store_artifacts(store, TaskOutput(line={"id": "t"}, artifacts={other: data}))
    assert not store.has(other)


def test_task_index_maps_each_task_to_its_node_and_run(tmp_path: Path) -> None:
    from sandcell.ray import task_index

    results = tmp_path / "r.jsonl"
    lines = [
        {"id": "a", "run_id": "r1", "node_id": "n1", "node_home": "/h1", "outcome": "ok"},
        {"id": "b", "run_id": None, "node_id": "n2", "node_home": "/h2", "outcome": "refused"},
        {"id": "b", "run_id": "r3", "node_id": "n1", "node_home": "/h1", "outcome": "ok"},
        {"id": "local", "run_id": "r4", "outcome": "ok"},
    ]
    results.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"id": "cut')
    index = task_index(results)
    assert sorted(index) == ["a", "b"]
    assert (index["a"].node_id, index["a"].run_id) == ("n1", "r1")
    assert (index["b"].node_home, index["b"].run_id) == ("/h1", "r3")


def test_an_address_where_no_cluster_listens_fails_at_once(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the ray extra is not installed")
    import ray

    from sandcell.ray.driver import connect

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: refused
        with pytest.raises(InfraError, match="cannot connect to the Ray cluster") as info:
            connect(ray, address)
    assert "sandcell_slots" in str(info.value)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        connect(ray, "head-without-port")
    assert not ray.is_initialized()


def test_run_program_refuses_an_unknown_language_before_any_sandbox() -> None:
    from sandcell.ray.api import run_program

    with pytest.raises(ConfigError, match=r"unknown language 'ruby'.*javascript, typescript"):
        run_program("puts 1", language="ruby")
