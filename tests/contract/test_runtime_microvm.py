"""The microVM backend boots the image of each run's runtime: one guest image per runtime, built
from it (``sandcell vm build --runtime NAME``), its pool and snapshot of one runtime only.

The datascience image is built once for the module (the build function ``sandcell vm build``
calls, into this host's VM directory, next to the default image): it is the one build CI pays
for. Real VMs; skipped with the reason where the host cannot run microVMs or the runtime is not
built (``sandcell runtime build datascience``). The first tests need neither: they check the
image plan and the manifest checks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import backend_unavailable, runtime_required

from sandcell import Executor, Limits, RunRequest
from sandcell.backends.host.warm_runtime import importable_preload
from sandcell.backends.microvm import (
    MicroVMBackend,
    image,
    layout,
    machine,
    probe,
    qemu,
    snapshot,
)
from sandcell.backends.warm import WarmConfig
from sandcell.errors import ConfigError, InfraError, IsolationUnavailable
from sandcell.runtimes import python_runtime
from sandcell.spec import MiB, Outcome

DS = "datascience"
IN_DS = (
    "import sys, importlib.util\n"
    "print(sys.prefix, *(importlib.util.find_spec(m) is not None for m in"
    " ('scipy', 'sklearn', 'pyarrow', 'pytest')))\n"
)
"""Which image a run is in: the runtime's packages are there and sandcell's own (pytest) are not,
without the minute that importing scikit-learn cold takes in a guest under TCG (real work in the
runtime on this rung: tests/integration/test_runtimes_work.py)."""
IN_DS_OUT = ["/opt/sandcell/venv", "True", "True", "True", "False"]
PRELOAD = ("numpy",)
"""What the module's pool imports ahead: a module of the runtime, light enough that the pool's
snapshot is ready in seconds (a heavy preload is exercised by test_runtimes_work)."""


def _runtime_or_skip(name: str) -> None:
    runtime_required(name)  # a skip here, a failure where CI requires it
    python_runtime(name)


def _fake_manifest(**fields: Any) -> image.Manifest:
    """A manifest of a datascience image that was never built: zero hashes unless given."""
    base = image.Manifest(
        format=image.FORMAT,
        kernel_release="6.1",
        kernel_sha256="0" * 64,
        initrd_sha256="0" * 64,
        image_sha256="0" * 64,
        image_bytes=0,
        runtime_sha256="0" * 64,
        runtime_identity="",
        python="/opt/sandcell/venv/bin/python",
        bash="/usr/bin/bash",
        built_at="",
        agent_sha256=image.agent_sha256(),
        runtime=DS,
        runtime_tree_sha256="0" * 64,
    )
    return replace(base, **fields)


# -- the plan and the manifest (no VM) -------------------------------------------------------


def test_the_minimal_image_holds_no_numpy() -> None:
    _runtime_or_skip("minimal")
    rt = python_runtime("minimal")
    plan = image.plan_root("minimal")
    default_site = {host for host, _ in python_runtime().mounts if "site-packages" in host}
    hosts = [src for src, _ in plan.moved] + list(plan.trees) + list(plan.files)
    assert not default_site & set(hosts), "sandcell's own packages are in the minimal image"
    for src, _ in plan.moved:
        assert not os.path.exists(os.path.join(src, "numpy")), src
    assert not any("numpy" in p for p in hosts)
    # Its site-packages are the stored tree's, at the neutral venv, bytecode as built.
    sites = [(src, dest) for src, dest in plan.moved if dest.endswith("/site-packages")]
    assert [dest for _, dest in sites] == ["/opt/sandcell/venv/lib/python3.11/site-packages"]
    # The runtime's site-packages, and the Node runtime's tree where it is built (nothing in
    # it is Python bytecode to rewrite).
    assert plan.prebuilt[: len(rt.prebuilt_bytecode)] == rt.prebuilt_bytecode
    assert all("/node" in extra for extra in plan.prebuilt[len(rt.prebuilt_bytecode) :])
    assert os.path.realpath(sites[0][0]) in plan.prebuilt
    kept = importable_preload(("numpy", "pandas", "json", "os.path"), "minimal")
    assert kept == ("json", "os.path")


def test_each_runtime_has_its_own_image_dir(tmp_path: Path) -> None:
    assert layout.image_dir(tmp_path) == tmp_path / "image"
    assert layout.image_dir(tmp_path, "default") == tmp_path / "image"
    assert layout.image_dir(tmp_path, DS) == tmp_path / f"image-{DS}"
    with pytest.raises(ConfigError, match="not a runtime name"):
        layout.image_dir(tmp_path, "../image")


def test_a_missing_image_names_the_command_that_builds_it(tmp_path: Path) -> None:
    with pytest.raises(IsolationUnavailable, match=f"runtime {DS}") as info:
        image.verify(tmp_path, runtime=DS)
    assert f"sandcell vm build --runtime {DS}" in (info.value.fix or "")
    with pytest.raises(IsolationUnavailable) as default:
        image.verify(tmp_path)
    assert "--runtime" not in (default.value.fix or "")


def test_an_image_of_another_runtime_is_refused(tmp_path: Path) -> None:
    _runtime_or_skip("analysis")
    fake = _fake_manifest()
    idir = layout.image_dir(tmp_path, "analysis")
    idir.mkdir()
    manifest = idir / image.MANIFEST_NAME
    manifest.write_text(json.dumps(asdict(fake)))
    with pytest.raises(IsolationUnavailable, match=f"from runtime {DS}, not analysis") as info:
        image.load_manifest(tmp_path, "analysis")
    assert "sandcell vm build --runtime analysis" in (info.value.fix or "")
    # The right name, but an older build of the runtime than this host's.
    manifest.write_text(json.dumps(asdict(replace(fake, runtime="analysis"))))
    with pytest.raises(IsolationUnavailable, match="rebuilt since") as info:
        image.load_manifest(tmp_path, "analysis")
    assert "sandcell vm build --runtime analysis" in (info.value.fix or "")


def test_no_vm_starts_on_an_image_replaced_since_it_was_verified(tmp_path: Path) -> None:
    """``sandcell vm build`` of a runtime a backend already verified: a snapshot of the old
    image must not resume on the new disk, so nothing starts on it until it is verified."""
    (tmp_path / "kernel").mkdir()
    (tmp_path / "kernel" / "vmlinuz").write_bytes(b"kernel")
    idir = layout.image_dir(tmp_path, DS)
    idir.mkdir()
    (idir / image.INITRD_NAME).write_bytes(b"initrd")
    (idir / image.IMAGE_NAME).write_bytes(b"old image")
    _runtime_or_skip(DS)
    fake = _fake_manifest(
        kernel_sha256=image.sha256_file(tmp_path / "kernel" / "vmlinuz"),
        initrd_sha256=image.sha256_file(idir / image.INITRD_NAME),
        image_sha256=image.sha256_file(idir / image.IMAGE_NAME),
        image_bytes=9,
        runtime_tree_sha256=python_runtime(DS).tree_sha256,
    )
    (idir / image.MANIFEST_NAME).write_text(json.dumps(asdict(fake)))
    files = image.verify(tmp_path, runtime=DS)
    assert not image.replaced(files)
    new = idir / ".new"
    new.write_bytes(b"new image")
    os.replace(new, idir / image.IMAGE_NAME)
    assert image.replaced(files)
    found = qemu.Qemu(path="/usr/bin/qemu-system-x86_64", version="7.2", version_text="x")
    guest = machine.Guest(files=files, qemu=found, accel="tcg", tsc_khz=None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(InfraError, match="rebuilt since"):
        machine.start(guest, machine.plan(guest, run_dir, memory_mib=256), run_dir)


# -- real VMs in the datascience image --------------------------------------------------------


@pytest.fixture(scope="module")
def ds_image() -> image.Manifest:
    """The datascience image, built once for the module (see module)."""
    status = probe()
    if not status.usable:
        backend_unavailable("microvm", status.detail)
    _runtime_or_skip(DS)
    if not os.access(layout.vm_dir(), os.W_OK):
        pytest.skip(f"building an image needs write access to {layout.vm_dir()}: run as root")
    try:
        image.verify(runtime=DS)  # .ci/run builds it (sandcell vm build --runtime datascience)
        return image.load_manifest(runtime=DS)
    except IsolationUnavailable:
        pass  # missing or stale here: built once for the module
    t0 = time.monotonic()
    manifest = image.build(runtime=DS)
    print(f"\ndatascience image: {manifest.image_bytes >> 20} MiB in {time.monotonic() - t0:.0f} s")
    return manifest


def _settled(backend: MicroVMBackend) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        stats = backend.warm_stats()
        assert stats is not None and stats.pool is not None
        if stats.pool.ready or stats.template_state.get("error"):
            return
        time.sleep(0.2)


@pytest.fixture(scope="module")
def ds_pool(
    ds_image: image.Manifest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Executor]:
    """An executor whose microVM pool is of the datascience image, numpy preloaded (one clone:
    idle TCG guests cost CPU)."""
    warm = WarmConfig(mode="pool", pool_size=1, runtime=DS, preload=PRELOAD)
    backend = MicroVMBackend(warm=warm)
    home = tmp_path_factory.mktemp("vm-ds-pool")
    with Executor(home=home, profile="unchecked", backend=backend) as ex:
        _settled(backend)
        yield ex


def test_a_cold_run_boots_the_runtimes_image(ds_image: image.Manifest, tmp_path: Path) -> None:
    backend = MicroVMBackend()
    with Executor(home=tmp_path, profile="unchecked", backend=backend) as ex:
        r = ex.run(RunRequest(code=IN_DS, runtime=DS))
    assert r.outcome is Outcome.OK, r.reason + r.stderr
    assert r.stdout.split() == IN_DS_OUT, "not the datascience image, or sandcell's packages in it"
    assert r.start.mode == "cold"
    assert r.enforcement is not None
    assert (
        f"runtime {DS}, sha256 {ds_image.image_sha256[:16]}"
        in (r.enforcement.layers["guest_image"])
    )


def test_a_pooled_run_in_the_runtimes_image(ds_pool: Executor, ds_image: image.Manifest) -> None:
    r = ds_pool.run(RunRequest(code=IN_DS, runtime=DS))
    assert r.outcome is Outcome.OK, r.reason + r.stderr
    assert r.stdout.split() == IN_DS_OUT
    assert r.start.mode == "pool", r.enforcement.layers if r.enforcement else r.reason
    assert set(r.start.preloaded) == set(PRELOAD)
    backend = ds_pool.backend
    assert isinstance(backend, MicroVMBackend)
    stats = backend.warm_stats()
    assert stats is not None
    snap_dir = Path(str(stats.template_state["snapshot_dir"]))
    snap = snapshot._load(snap_dir)
    assert snap is not None and snap.image_sha256 == ds_image.image_sha256
    assert snapshot.image_path(snap) == layout.image_dir(runtime=DS) / image.IMAGE_NAME


def test_a_default_pool_serves_another_runtime_cold(
    ds_image: image.Manifest, tmp_path: Path
) -> None:
    backend = MicroVMBackend(warm=WarmConfig(mode="pool", pool_size=1))
    with Executor(home=tmp_path, profile="unchecked", backend=backend) as ex:
        _settled(backend)
        r = ex.run(RunRequest(code=IN_DS, runtime=DS))
    assert r.outcome is Outcome.OK, r.reason + r.stderr
    assert r.stdout.split() == IN_DS_OUT
    assert r.start.mode == "cold"
    assert r.enforcement is not None
    note = r.enforcement.layers["warm_start"]
    assert "runtime default's image" in note and DS in note, note


def test_a_session_cell_in_the_runtime(ds_pool: Executor) -> None:
    with ds_pool.session(runtime=DS, limits=Limits(wall_time_s=120, memory_bytes=256 * MiB)) as s:
        first = s.run("import numpy as np\nx = np.array([0.0, 1.0, 2.0])")
        second = s.run("print(np.polyfit(x, [1, 3, 5], 1).round(3).tolist())")
    assert first.outcome is Outcome.OK, first.reason + first.stderr
    assert second.outcome is Outcome.OK, second.reason + second.stderr
    assert second.stdout == "[2.0, 1.0]\n"
    # The session's VM is the pool's clone of the datascience image (the layer says how it
    # started; a cell's own start is the session's).
    assert first.enforcement is not None
    layers = first.enforcement.layers
    assert "a pool start from snapshot" in layers["session"], layers["session"]
    assert f"runtime {DS}," in layers["guest_image"]
