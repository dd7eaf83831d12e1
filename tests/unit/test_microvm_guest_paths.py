"""The guest image holds the runtime at the namespaces backend's neutral paths: no path of the
host's install is a name in the image's tree, and the bytecode names the sources where the guest
has them. (tests/escapes/test_host_files.py checks the same from inside a running guest.)"""

from __future__ import annotations

import marshal
import os
import py_compile
import sys
from pathlib import Path

from sandcell.backends.microvm import image


def _names_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def test_the_root_plan_places_the_runtime_at_neutral_paths() -> None:
    plan = image.plan_root()
    host_install = {sys.prefix, os.path.realpath(sys.prefix)}
    base = os.path.realpath(sys.base_prefix)
    if not base.startswith("/usr"):
        host_install.add(base)
    guest_paths = [
        *plan.trees,
        *plan.files,
        *plan.dirs,
        *(link for link, _ in plan.links),
        *(path for path, _, _ in plan.generated),
        *(dest for _, dest in plan.moved),
    ]
    named = [p for p in guest_paths for h in host_install if _names_under(p, h)]
    assert named == []
    interpreter = dict((p, d) for p, d, _ in plan.generated)[image.INTERPRETER_FILE].decode()
    if sys.prefix != sys.base_prefix:
        assert interpreter == "/opt/sandcell/venv/bin/python"
        assert any(dest.startswith("/opt/sandcell/venv/lib/") for _, dest in plan.moved)
        cfg = dict((p, d) for p, d, _ in plan.generated)["/opt/sandcell/venv/pyvenv.cfg"]
        assert sys.prefix.encode() not in cfg
    assert image.guest_path(os.path.realpath(sys.executable), plan.moved).startswith("/")


def test_moved_bytecode_names_the_guest_path(tmp_path: Path) -> None:
    src = tmp_path / "home" / "alice" / ".venv" / "site-packages"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    pyc = Path(py_compile.compile(str(src / "pkg" / "mod.py"), doraise=True))
    foreign = pyc.with_name("mod.cpython-99.pyc")
    foreign.write_bytes(b"\x00\x00\r\n" + bytes(12) + b"not this interpreter's")
    root = tmp_path / "root"
    dest = "/opt/sandcell/venv/lib/site-packages"

    image._copy_moved(str(src), dest, root)

    staged = root / dest.lstrip("/") / "pkg" / "__pycache__"
    code = marshal.loads((staged / pyc.name).read_bytes()[16:])
    assert code.co_filename == f"{dest}/pkg/mod.py"
    inner = [c for c in code.co_consts if hasattr(c, "co_filename")]
    assert inner and all(c.co_filename == f"{dest}/pkg/mod.py" for c in inner)
    assert not (staged / foreign.name).exists()
    assert (root / dest.lstrip("/") / "pkg" / "mod.py").read_text().startswith("def f")
    assert str(tmp_path).encode() not in (staged / pyc.name).read_bytes()
