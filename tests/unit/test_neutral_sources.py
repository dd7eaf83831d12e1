"""The plans that keep host paths out of what a sandbox can read about its mounts and runtime:
overlays of the bound host sources (mountinfo), the bytecode rewritten with neutral source paths,
and the install records covered. Pure or on temporary files; no sandbox is started here (the
escape suite's tests/escapes/test_host_files.py attacks the result from inside)."""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import py_compile
import sys
import types
from pathlib import Path

import pytest

from sandcell.backends.host import neutral_bytecode, neutral_sources
from sandcell.backends.namespaces.template import TemplateSpec, build_template_argv
from sandcell.runtimes import Runtime
from sandcell.runtimes.view import host_hooks

HOME = "/home/alice/proj"


def test_a_directory_gets_its_own_overlay_with_the_mount_point_as_empty_layer() -> None:
    sp = f"{HOME}/.venv/lib/python3.11/site-packages"
    src = neutral_sources.plan([(sp, sp, True)], "/runs/r1/view")
    target = "/runs/r1/view/0/site-packages"
    assert src.overlays == (neutral_sources.Overlay(layers=(sp, target), target=target),)
    assert src.of(sp) == target
    assert src.directories == ("/runs/r1/view", "/runs/r1/view/0", target)


def test_a_file_is_bound_from_inside_an_overlay_of_its_directory() -> None:
    paths = [
        (f"{HOME}/data/a.csv", f"{HOME}/data/a.csv", False),
        (f"{HOME}/data/b.csv", f"{HOME}/data/b.csv", False),
        ("/runs/etc", "/runs/etc", True),
        ("/runs/etc/runtime-1/f0", "/runs/etc/runtime-1/f0", False),
    ]
    src = neutral_sources.plan(paths, "/v")
    # One overlay per directory: the two inputs share theirs, the support file is inside etc's.
    assert [o.layers[0] for o in src.overlays] == ["/runs/etc", f"{HOME}/data"]
    assert src.of(f"{HOME}/data/a.csv") == "/v/1/data/a.csv"
    assert src.of(f"{HOME}/data/b.csv") == "/v/1/data/b.csv"
    assert src.of("/runs/etc/runtime-1/f0") == "/v/0/etc/runtime-1/f0"
    # What was not planned is bound from where it is.
    assert src.of("/usr") == "/usr"
    assert not [p for _, p in src.moved if "alice" in p]


def test_a_symlinked_input_is_planned_as_what_it_names() -> None:
    src = neutral_sources.plan([("/in/link.csv", f"{HOME}/real.csv", False)], "/v")
    assert src.overlays[0].layers[0] == HOME
    assert src.of("/in/link.csv") == "/v/0/proj/real.csv"


def test_a_bytecode_tree_is_stacked_above_its_directory() -> None:
    sp = f"{HOME}/.venv/lib/python3.11/site-packages"
    src = neutral_sources.plan([(sp, sp, True)], "/v", layers={sp: "/runs/.bytecode-k"})
    assert src.overlays[0].layers == ("/runs/.bytecode-k", sp)
    assert neutral_sources.helper_args(src) == [
        "--overlay",
        "/v/0/site-packages",
        "/runs/.bytecode-k",
        sp,
    ]


def test_gather_skips_missing_paths_and_resolves_links(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    got = neutral_sources.gather([tmp_path / "d", tmp_path / "link", tmp_path / "missing"])
    assert got == [
        (str(tmp_path / "d"), str(tmp_path / "d"), True),
        (str(tmp_path / "link"), str(tmp_path / "f"), False),
    ]


def test_runtime_sources_leave_paths_under_usr_alone(tmp_path: Path) -> None:
    mounts = [
        ("/usr", "/usr"),
        ("/usr/bin/python3.11", "/opt/sandcell/venv/bin/python"),
        (str(tmp_path), "/opt/sandcell/venv/lib/python3.11/site-packages"),
    ]
    moved, layers = neutral_sources.runtime_sources(mounts, tmp_path.parent)
    assert moved == [str(tmp_path)]
    assert layers == {}  # no bytecode in it: no layer


def _runtime(mounts: tuple[tuple[str, str], ...]) -> Runtime:
    return Runtime(
        name="python-3.11",
        language="python",
        interpreter="/x/bin/python",
        python="/x/bin/python",
        ro_dirs=(),
        symlinks=(),
        identity="test",
        sha256="0",
        mounts=mounts,
        sandbox_python="/opt/sandcell/venv/bin/python",
    )


def test_template_binds_its_sources_from_the_overlays() -> None:
    sp = f"{HOME}/.venv/lib/python3.11/site-packages"
    runtime = _runtime((("/usr", "/usr"), (sp, "/opt/sandcell/venv/lib/python3.11/site-packages")))
    paths = [
        ("/runs/w/control", "/runs/w/control", True),
        ("/runs/etc", "/runs/etc", True),
        (sp, sp, True),
    ]
    src = neutral_sources.plan(paths, "/runs/w/view")
    spec = TemplateSpec(
        bwrap="/bwrap",
        runtime=runtime,
        control_dir=Path("/runs/w/control"),
        etc_dir=Path("/runs/etc"),
        env={},
        preload=(),
        seccomp_fd=None,
        control_fd=3,
        sources=src,
    )
    argv = build_template_argv(spec)
    sources = [argv[i + 1] for i, a in enumerate(argv) if a == "--ro-bind"]
    assert src.of("/runs/w/control") in sources
    assert src.of("/runs/etc") + "/passwd" in sources
    assert src.of(sp) in sources and src.of(sp).startswith("/runs/w/view/")
    assert not [s for s in sources if "alice" in s or s.startswith(("/runs/etc", "/runs/w/c"))]


# -- bytecode -----------------------------------------------------------------------------------


def _pyc(source: str, filename: str) -> bytes:
    code = compile(source, filename, "exec")
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") * 3
    return header + marshal.dumps(code)


def _filenames(code: types.CodeType) -> set[str]:
    names = {code.co_filename}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _filenames(c)
    return names


def test_rewrite_names_the_sandbox_path_in_every_code_object() -> None:
    data = _pyc("def f():\n    def g():\n        pass\nclass C:\n    pass\n", f"{HOME}/m.py")
    new = neutral_bytecode.rewrite(data, "/opt/sandcell/venv/m.py")
    assert new is not None and new[:16] == data[:16]
    assert _filenames(marshal.loads(new[16:])) == {"/opt/sandcell/venv/m.py"}


def test_rewrite_refuses_another_interpreters_bytecode() -> None:
    data = _pyc("x = 1\n", f"{HOME}/m.py")
    assert neutral_bytecode.rewrite(b"\0\0\r\n" + data[4:], "/x.py") is None
    assert neutral_bytecode.rewrite(data[:20], "/x.py") is None


def test_tree_mirrors_pycache_with_neutral_names(tmp_path: Path) -> None:
    site = tmp_path / "home" / "alice" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("X = 1\n")
    py_compile.compile(str(site / "pkg" / "__init__.py"), doraise=True)
    (site / "pkg" / "__pycache__" / "stale.cpython-10.pyc").write_bytes(b"\0\0\0\0" * 8)
    cache = tmp_path / "runs"
    cache.mkdir()
    tree = neutral_bytecode.tree_for(str(site), "/opt/sandcell/venv/sp", cache)
    assert tree is not None and Path(tree).parent == cache
    out = Path(tree) / "pkg" / "__pycache__"
    names = sorted(p.name for p in out.iterdir())
    # The other interpreter's file is not carried over: absent in the view.
    assert names == [f"__init__.{sys.implementation.cache_tag}.pyc"]
    code = marshal.loads((out / names[0]).read_bytes()[16:])
    assert _filenames(code) == {"/opt/sandcell/venv/sp/pkg/__init__.py"}
    try:
        opaque = os.getxattr(out, "user.overlay.opaque")
    except OSError:
        pytest.skip("this filesystem has no user extended attributes")
    assert opaque == b"y"
    # Built once: the same tree answers again, and its owner is recorded beside it.
    assert neutral_bytecode.tree_for(str(site), "/opt/sandcell/venv/sp", cache) == tree
    assert Path(tree + ".source").read_text().startswith(str(site))


# -- install records ----------------------------------------------------------------------------


def test_install_records_naming_the_host_are_covered(tmp_path: Path) -> None:
    sp = tmp_path / "site-packages"
    local, remote, plain = (sp / f"{n}-1.0.dist-info" for n in ("local", "remote", "plain"))
    for d in (local, remote, plain):
        d.mkdir(parents=True)
        (d / "RECORD").write_text(f"{d.name.split('-')[0]}/__init__.py,,\n")
    (local / "direct_url.json").write_text(
        json.dumps({"url": f"file://{HOME}", "dir_info": {"editable": True}})
    )
    (remote / "direct_url.json").write_text(
        json.dumps({"url": "https://example.org/remote-1.0.tar.gz", "archive_info": {}})
    )
    (plain / "RECORD").write_text(f"plain/__init__.py,,\n{HOME}/.venv/share/plain/x,,\n")
    (sp / "legacy.egg-link").write_text(f"{HOME}/legacy\n.\n")
    masked = host_hooks([str(sp)], [str(sp), "/usr"])
    assert sorted(masked) == sorted(
        [str(local / "direct_url.json"), str(plain / "RECORD"), str(sp / "legacy.egg-link")]
    )


def test_bytecode_cache_is_private_to_the_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fallback = tmp_path / "runs" / "etc"
    got = neutral_bytecode.cache_dir(fallback)
    assert got == tmp_path / "cache" / "sandcell" / "bytecode"
    assert got.stat().st_mode & 0o777 == 0o700
    # A cache others can write to would let them put code into every sandbox: not used.
    got.chmod(0o777)
    assert neutral_bytecode.cache_dir(fallback) == fallback
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert neutral_bytecode.cache_dir(fallback) == fallback
