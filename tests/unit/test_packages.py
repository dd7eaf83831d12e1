"""The wheel cache and package resolution, offline: wheels are built here, in ``tmp_path``."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from sandcell.errors import ConfigError
from sandcell.packages import (
    WheelCache,
    check_runtime_lock,
    imports_of,
    normalize_name,
    resolve_packages,
    runtime_imports,
    write_runtime_lock,
)


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    where: Path,
    name: str = "tinypkg",
    version: str = "1.0",
    *,
    files: Mapping[str, bytes] | None = None,
    top_level: Sequence[str] | None = None,
    requires: Sequence[str] = (),
    meta_name: str | None = None,
    bad_record: bool = False,
    raw: Sequence[tuple[zipfile.ZipInfo, bytes]] = (),
) -> Path:
    """A wheel: ``files``, a dist-info (METADATA, WHEEL, top_level.txt, RECORD) and ``raw``
    entries added as they are (unsafe ones included), in that order."""
    dist = f"{name.replace('-', '_')}-{version}"
    module = name.replace("-", "_")
    entries: dict[str, bytes] = dict(files or {f"{module}/__init__.py": b"VALUE = 1\n"})
    meta = f"Metadata-Version: 2.1\nName: {meta_name or name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    entries[f"{dist}.dist-info/METADATA"] = meta.encode()
    entries[f"{dist}.dist-info/WHEEL"] = (
        b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if top_level is not None:
        entries[f"{dist}.dist-info/top_level.txt"] = "".join(f"{t}\n" for t in top_level).encode()
    record = "".join(
        f"{path},{_digest(b'tampered' if bad_record else data)},{len(data)}\n"
        for path, data in entries.items()
    )
    entries[f"{dist}.dist-info/RECORD"] = (record + f"{dist}.dist-info/RECORD,,\n").encode()
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for entry, data in entries.items():
            zf.writestr(zipfile.ZipInfo(entry, (2024, 1, 1, 0, 0, 0)), data)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zipfile warns about a duplicate name, as it should
            for info, data in raw:
                zf.writestr(info, data)
    return path


@pytest.fixture
def cache(tmp_path: Path) -> WheelCache:
    return WheelCache(tmp_path / "cache")


def _lock(cache: WheelCache) -> dict[str, dict[str, object]]:
    data: dict[str, dict[str, object]] = json.loads((cache.root / "lock.json").read_text())
    return data


# -- adding wheels ------------------------------------------------------------------------------


def test_prepare_files_extracts_and_records(cache: WheelCache, tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path / "in",
        "Tiny_Pkg",
        "1.0",
        files={
            "tiny_pkg/__init__.py": b"VALUE = 1\n",
            "tiny_pkg/sub/mod.py": b"X = 2\n",
            "tiny_helper.py": b"Y = 3\n",
            "LICENSE": b"not importable\n",
            "evil.pth": b"import os\n",
            "Tiny_Pkg-1.0.data/scripts/tool": b"#!/bin/sh\n",
            "Tiny_Pkg-1.0.data/purelib/tiny_extra.py": b"Z = 4\n",
        },
    )
    [pkg] = cache.prepare_files([wheel])
    assert pkg.name == "tiny-pkg"
    assert pkg.version == "1.0"
    assert pkg.imports == ("tiny_extra", "tiny_helper", "tiny_pkg")
    assert pkg.path == cache.root / "site" / "tiny-pkg-1.0"
    extracted = sorted(p.relative_to(pkg.path).as_posix() for p in pkg.path.rglob("*"))
    assert extracted == [
        "Tiny_Pkg-1.0.dist-info",
        "Tiny_Pkg-1.0.dist-info/METADATA",
        "Tiny_Pkg-1.0.dist-info/RECORD",
        "Tiny_Pkg-1.0.dist-info/WHEEL",
        "tiny_extra.py",
        "tiny_helper.py",
        "tiny_pkg",
        "tiny_pkg/__init__.py",
        "tiny_pkg/sub",
        "tiny_pkg/sub/mod.py",
    ]
    assert stat.S_IMODE((pkg.path / "tiny_pkg" / "sub").stat().st_mode) == 0o755
    assert stat.S_IMODE((pkg.path / "tiny_helper.py").stat().st_mode) == 0o644
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert _lock(cache) == {
        "tiny-pkg": {
            "version": "1.0",
            "wheel": wheel.name,
            "sha256": sha,
            "imports": ["tiny_extra", "tiny_helper", "tiny_pkg"],
            "requires": [],
            "requires_if": [],
            "extracted": "site/tiny-pkg-1.0",
        }
    }
    assert (cache.root / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()
    assert cache.verify() == []


def test_top_level_txt_names_the_imports(cache: WheelCache, tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path, "py-thing", "2.1", files={"thing/__init__.py": b""}, top_level=["thing"]
    )
    [pkg] = cache.prepare_files([wheel])
    assert pkg.imports == ("thing",)
    assert cache.lookup("thing") == pkg
    assert cache.lookup("py_thing") is None
    assert cache.get("PY_Thing") == pkg


def test_second_prepare_is_a_no_op(cache: WheelCache, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path)
    first = cache.prepare_files([wheel])
    lock_before = (cache.root / "lock.json").read_bytes()
    mtime = (first[0].path / "tinypkg" / "__init__.py").stat().st_mtime_ns
    assert cache.prepare_files([wheel]) == first
    assert (cache.root / "lock.json").read_bytes() == lock_before
    assert (first[0].path / "tinypkg" / "__init__.py").stat().st_mtime_ns == mtime
    assert sorted(p.name for p in (cache.root / "site").iterdir()) == ["tinypkg-1.0"]


def test_a_pinned_entry_already_cached_is_not_downloaded(cache: WheelCache, tmp_path: Path) -> None:
    cache.prepare_files([make_wheel(tmp_path)])
    # A python that cannot run proves pip is not started for a pin the cache already has.
    [pkg] = cache.prepare(["TinyPkg == 1.0.0"], python="/nonexistent/python")
    assert (pkg.name, pkg.version) == ("tinypkg", "1.0")


def test_upgrade_replaces_the_old_version(cache: WheelCache, tmp_path: Path) -> None:
    old = cache.prepare_files([make_wheel(tmp_path / "a", version="1.0")])[0]
    new = cache.prepare_files([make_wheel(tmp_path / "b", version="2.0")])[0]
    assert _lock(cache)["tinypkg"]["version"] == "2.0"
    assert not old.path.exists()
    assert new.path.is_dir()
    assert sorted(p.name for p in (cache.root / "wheels").iterdir()) == [
        "tinypkg-2.0-py3-none-any.whl"
    ]


def test_same_version_with_other_bytes_is_refused(cache: WheelCache, tmp_path: Path) -> None:
    cache.prepare_files([make_wheel(tmp_path / "a")])
    other = make_wheel(tmp_path / "b", files={"tinypkg/__init__.py": b"VALUE = 666\n"})
    with pytest.raises(ConfigError, match="lock recorded"):
        cache.prepare_files([other])


def test_two_packages_providing_one_import_are_refused(cache: WheelCache, tmp_path: Path) -> None:
    cache.prepare_files([make_wheel(tmp_path, "alpha", files={"shared/__init__.py": b""})])
    with pytest.raises(ConfigError, match="already provided by cached package alpha"):
        cache.prepare_files([make_wheel(tmp_path, "beta", files={"shared/__init__.py": b""})])
    assert list(_lock(cache)) == ["alpha"]


def test_remove(cache: WheelCache, tmp_path: Path) -> None:
    [pkg] = cache.prepare_files([make_wheel(tmp_path)])
    assert cache.remove("TinyPkg")
    assert not pkg.path.exists()
    assert _lock(cache) == {}
    assert not cache.remove("tinypkg")


@pytest.mark.parametrize(
    "requirement",
    ["six", "six>=1.16", "six==1.*", "six[extra]==1.16.0", "six==1.16.0; python_version>'3'"],
)
def test_unpinned_requirements_are_refused_before_any_download(
    cache: WheelCache, requirement: str
) -> None:
    with pytest.raises(ConfigError, match="pin it to one version"):
        cache.prepare(["tomli==2.0.1", requirement], python="/nonexistent/python")
    assert not (cache.root / "lock.json").exists()


# -- refusing unsafe or inconsistent wheels -----------------------------------------------------


def _symlink_entry() -> tuple[zipfile.ZipInfo, bytes]:
    info = zipfile.ZipInfo("tinypkg/link.py")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info, b"/etc/passwd"


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ((zipfile.ZipInfo("../evil.py"), b"print('escaped')\n"), "climbing out"),
        ((zipfile.ZipInfo("tinypkg/../../evil.py"), b"x\n"), "climbing out"),
        ((zipfile.ZipInfo("/tmp/evil.py"), b"x\n"), "absolute path"),
        (_symlink_entry(), "symbolic link"),
        ((zipfile.ZipInfo("tinypkg/__init__.py"), b"shadow\n"), "duplicate entry"),
    ],
)
def test_unsafe_entries_refuse_the_whole_wheel(
    cache: WheelCache, tmp_path: Path, entry: tuple[zipfile.ZipInfo, bytes], reason: str
) -> None:
    wheel = make_wheel(tmp_path / "in" / "deep", raw=[entry])
    with pytest.raises(ConfigError, match=f"{reason}.*nothing extracted"):
        cache.prepare_files([wheel])
    assert not (cache.root / "lock.json").exists()
    assert list((cache.root / "site").iterdir()) == []
    assert list((cache.root / "wheels").iterdir()) == []
    assert not list(tmp_path.rglob("evil.py"))
    assert not (Path("/tmp") / "evil.py").exists()


def test_record_mismatch_is_refused(cache: WheelCache, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not match its RECORD"):
        cache.prepare_files([make_wheel(tmp_path, bad_record=True)])
    assert list((cache.root / "site").iterdir()) == []


def test_metadata_must_match_the_file_name(cache: WheelCache, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="says it is otherpkg"):
        cache.prepare_files([make_wheel(tmp_path, meta_name="otherpkg")])


@pytest.mark.parametrize("filename", ["tinypkg-1.0.zip", "tinypkg.whl", "a-b-c.whl"])
def test_bad_wheel_names_are_refused(cache: WheelCache, tmp_path: Path, filename: str) -> None:
    path = tmp_path / filename
    path.write_bytes(make_wheel(tmp_path / "src").read_bytes())
    with pytest.raises(ConfigError, match="not a wheel file name"):
        cache.prepare_files([path])


def test_not_a_zip_is_refused(cache: WheelCache, tmp_path: Path) -> None:
    path = tmp_path / "tinypkg-1.0-py3-none-any.whl"
    path.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="not a readable wheel"):
        cache.prepare_files([path])


# -- verification -------------------------------------------------------------------------------


def test_verify_reports_changes(cache: WheelCache, tmp_path: Path) -> None:
    [pkg] = cache.prepare_files([make_wheel(tmp_path)])
    (pkg.path / "tinypkg" / "__init__.py").write_text("VALUE = 666\n")
    (pkg.path / "tinypkg" / "extra.py").write_text("")
    (cache.root / "wheels" / pkg.wheel).write_bytes(b"swapped")
    problems = cache.verify()
    assert any("tinypkg/__init__.py was changed" in p for p in problems), problems
    assert any("tinypkg/extra.py is not in its RECORD" in p for p in problems), problems
    assert any("no longer has its sha256" in p for p in problems), problems


def test_verify_reports_missing_pieces(cache: WheelCache, tmp_path: Path) -> None:
    [pkg] = cache.prepare_files([make_wheel(tmp_path)])
    (cache.root / "wheels" / pkg.wheel).unlink()
    (pkg.path / "tinypkg" / "__init__.py").unlink()
    problems = cache.verify()
    assert any("wheel" in p and "is missing" in p for p in problems), problems
    assert any("tinypkg/__init__.py is missing" in p for p in problems), problems


def test_a_damaged_cache_is_repaired_by_adding_again(cache: WheelCache, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path)
    [pkg] = cache.prepare_files([wheel])
    (pkg.path / "tinypkg" / "__init__.py").write_text("VALUE = 666\n")
    cache.prepare_files([wheel])
    assert cache.verify() == []
    assert (pkg.path / "tinypkg" / "__init__.py").read_text() == "VALUE = 1\n"


def test_a_damaged_lock_is_a_config_error(cache: WheelCache) -> None:
    cache.root.mkdir(parents=True)
    (cache.root / "lock.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"lock\.json is unreadable"):
        cache.packages()
    assert "unreadable" in cache.verify()[0]


# -- imports and resolution ---------------------------------------------------------------------


def test_imports_of() -> None:
    code = (
        "import os, numpy as np\n"
        "import xml.etree.ElementTree as ET\n"
        "from pandas.io import json as pj\n"
        "from . import sibling\n"
        "import importlib\n"
        "m = importlib.import_module('tomli._parser')\n"
        "n = __import__('yaml')\n"
        "o = importlib.import_module(name)\n"
        "p = importlib.import_module('.rel', 'pkg')\n"
        "def f():\n"
        "    import scipy.stats\n"
    )
    assert imports_of(code) == {
        "os", "numpy", "xml", "pandas", "importlib", "tomli", "yaml", "scipy"
    }  # fmt: skip
    assert imports_of("import (") == frozenset()
    assert imports_of("") == frozenset()


def test_normalize_name() -> None:
    assert normalize_name("Foo_Bar.baz--Qux") == "foo-bar-baz-qux"


def test_runtime_imports_cover_stdlib_and_site_packages() -> None:
    names = runtime_imports()
    assert {"json", "os", "numpy", "pandas", "matplotlib", "dateutil", "sandcell"} <= names
    assert "tinypkg" not in names


def test_resolution_of_the_four_cases(cache: WheelCache, tmp_path: Path) -> None:
    allowed = cache.prepare_files([make_wheel(tmp_path, "tinypkg")])[0]
    cache.prepare_files([make_wheel(tmp_path, "other-pkg", files={"other/__init__.py": b""})])
    code = "import json\nimport numpy\nimport tinypkg\nimport other\nimport nowhere_mod.sub\n"
    res = resolve_packages(imports_of(code), allowed_packages=["TinyPkg"], cache=cache, code=code)
    assert res.paths == (allowed.path,)
    assert res.packages == (allowed,)
    by_line = {f.line: f for f in res.findings}
    assert sorted(by_line) == [4, 5]
    assert all(f.rule_id == "py.package" and f.severity == "deny" for f in res.findings)
    assert by_line[4].message == (
        "package other-pkg is in the wheel cache but not in this profile's allowed_packages; "
        "add it to the profile or use one that allows it"
    )
    assert by_line[4].snippet == "import other"
    assert by_line[5].message.startswith(
        "nowhere_mod is not in the runtime or the wheel cache; nothing is installed at run "
        "time: prepare it ahead of time with `sandcell packages add nowhere_mod==VERSION`"
    )
    assert by_line[5].column == 1


def test_resolution_without_code_and_with_local_modules(cache: WheelCache) -> None:
    res = resolve_packages({"helper", "statistics"}, allowed_packages=[], cache=cache)
    assert [(f.line, f.column, f.snippet) for f in res.findings] == [(1, 1, "")]
    res = resolve_packages({"helper"}, allowed_packages=[], cache=cache, local={"helper"})
    assert res.findings == ()
    assert res.paths == ()


def test_resolution_follows_recorded_requirements(cache: WheelCache, tmp_path: Path) -> None:
    app = make_wheel(tmp_path, "app", requires=["Lib_Dep>=1", "numpy", "docs-only; extra == 'doc'"])
    [app_pkg] = cache.prepare_files([app])
    assert app_pkg.requires == ("lib-dep", "numpy")
    res = resolve_packages({"app"}, allowed_packages=["app"], cache=cache)
    [finding] = res.findings
    assert "package app needs lib-dep" in finding.message
    [dep] = cache.prepare_files(
        [make_wheel(tmp_path, "lib-dep", files={"libdep/__init__.py": b""})]
    )
    res = resolve_packages({"app"}, allowed_packages=["app"], cache=cache)
    assert "in the wheel cache but not in" in res.findings[0].message
    res = resolve_packages({"app"}, allowed_packages=["app", "lib-dep"], cache=cache)
    assert res.findings == ()
    assert res.paths == (app_pkg.path, dep.path)


def test_runtime_lock_round_trip(tmp_path: Path) -> None:
    lock = tmp_path / "runtime.lock"
    write_runtime_lock(lock)
    lines = lock.read_text().splitlines()
    assert any(line.startswith("numpy==2.4.6  # record-sha256:") for line in lines), lines
    assert check_runtime_lock(lock) == []
    lock.write_text(
        "\n".join(
            line.replace("numpy==2.4.6", "numpy==1.0.0") for line in lines if "pandas" not in line
        )
        + "\nghost==1.0  # record-sha256:00\n"
    )
    problems = check_runtime_lock(lock)
    assert "numpy is 2.4.6 in the runtime, 1.0.0 in the lock" in problems
    assert "pandas is in the runtime but not in the lock" in problems
    assert "ghost==1.0 is in the lock but not in the runtime" in problems


def test_files_missing_from_record_are_refused(cache: WheelCache, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, raw=[(zipfile.ZipInfo("tinypkg/unlisted.py"), b"x = 1\n")])
    with pytest.raises(ConfigError, match=r"unlisted\.py is not listed in its RECORD"):
        cache.prepare_files([wheel])


def test_verify_checks_the_tree_against_the_kept_wheel(cache: WheelCache, tmp_path: Path) -> None:
    # Editing a file and its RECORD line together does not fool verify: the kept wheel, whose
    # hash the lock pins, has the RECORD that counts.
    [pkg] = cache.prepare_files([make_wheel(tmp_path)])
    new = b"VALUE = 666\n"
    (pkg.path / "tinypkg" / "__init__.py").write_bytes(new)
    record = next(pkg.path.glob("*.dist-info")) / "RECORD"
    lines = [
        f"tinypkg/__init__.py,{_digest(new)},{len(new)}" if line.startswith("tinypkg/") else line
        for line in record.read_text().splitlines()
    ]
    record.write_text("\n".join(lines) + "\n")
    assert any("tinypkg/__init__.py was changed" in p for p in cache.verify())
