"""The floor plan of the backends (issue 22), read from the imports with ``ast``.

A rung (a package ``sandcell/backends/<rung>/`` named in the ladder) imports the shared host layer
(``backends/host/``), the contracts (``backends/base.py``, the cell contract ``backends/cell/`` with
its channel, loop and verdict), ``backends/warm.py`` and non-backend sandcell packages, never
another rung, except where :data:`BUILDS_ON` names the lower rung a rung is built on (wasm on
namespaces). Outside the rungs, only the registry (``backends/registry.py``) builds a rung by name,
and a CLI command that manages one rung's own artefacts may import that rung (``sandcell vm``: the
microVM image; ``sandcell wasm``: the wasm rung's Pyodide). Every import counts: at module level,
inside functions, under ``TYPE_CHECKING``, and ``importlib.import_module`` with a literal name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import sandcell
from sandcell.backends.registry import LADDER

SRC = Path(sandcell.__file__).parent
RUNGS = frozenset(LADDER)

ALLOWED_OUTSIDE: dict[str, frozenset[str]] = {
    "sandcell.backends.registry": RUNGS,
    "sandcell.cli.vm": frozenset({"microvm"}),
    "sandcell.cli.wasm": frozenset({"wasm"}),
}
"""Modules outside the rungs that may import a rung, and which."""

BUILDS_ON: dict[str, frozenset[str]] = {
    # The wasm rung is a namespaces sandbox with a WebAssembly wall inside it (see the docstring
    # of sandcell/backends/wasm/__init__.py): it subclasses NamespacesBackend and reuses its plan.
    "wasm": frozenset({"namespaces"}),
}
"""The one documented exception to "no rung imports another": a rung built on a lower one."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _imported(tree: ast.AST, module: str, package: bool) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of everything ``tree`` imports, relative imports resolved; for
    ``from X import a``, both ``X`` and ``X.a`` (``a`` may be a submodule)."""
    here = module.split(".") if package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def _rung_of(dotted: str) -> str | None:
    """The rung a dotted module name belongs to, or None."""
    parts = dotted.split(".")
    if len(parts) >= 3 and parts[:2] == ["sandcell", "backends"] and parts[2] in RUNGS:
        return parts[2]
    return None


def _offences() -> list[str]:
    found: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        home = _rung_of(module)
        allowed = ALLOWED_OUTSIDE.get(module, frozenset())
        below = BUILDS_ON.get(home, frozenset()) if home else frozenset()
        seen: set[tuple[int, str]] = set()
        for line, name in _imported(tree, module, _is_package(path)):
            rung = _rung_of(name)
            if rung is None or rung == home or (home is None and rung in allowed):
                continue
            if rung in below:
                continue
            if (line, rung) in seen:
                continue
            seen.add((line, rung))
            where = f"{path.relative_to(SRC.parent)}:{line}"
            what = f"rung {home!r} imports rung {rung!r}" if home else f"imports rung {rung!r}"
            found.append(f"{where}: {what} ({name})")
    return found


def test_the_rungs_are_the_ladder() -> None:
    on_disk = {p.parent.name for p in (SRC / "backends").glob("*/__init__.py")} - {
        "host",
        "inside",
        "cell",
    }
    assert on_disk == RUNGS, "a backend package that is not a rung: name it here or in the ladder"


def test_no_rung_imports_another_and_only_the_registry_imports_a_rung() -> None:
    offences = _offences()
    assert not offences, "imports across the floor plan:\n" + "\n".join(offences)


def test_the_reader_sees_every_kind_of_import(tmp_path: Path) -> None:
    source = (
        "import sandcell.backends.gvisor.runsc\n"
        "from sandcell.backends import microvm\n"
        "from ..namespaces import session\n"
        "def f():\n"
        "    from sandcell.backends.gvisor import sweep\n"
        "    importlib.import_module('sandcell.backends.microvm.layout')\n"
    )
    names = {
        rung
        for _, name in _imported(ast.parse(source), "sandcell.backends.host.x", package=False)
        if (rung := _rung_of(name)) is not None
    }
    assert names == {"gvisor", "microvm", "namespaces"}


def test_only_the_documented_rungs_build_on_another() -> None:
    # The exception stays narrow: named rungs, each building on a lower rung of the ladder only.
    assert set(BUILDS_ON) <= RUNGS
    for rung, lower in BUILDS_ON.items():
        assert lower <= RUNGS
        assert all(LADDER.index(b) < LADDER.index(rung) for b in lower), (rung, lower)


def test_the_reader_finds_a_rung_importing_another(tmp_path: Path) -> None:
    # The check that no other rung imports another must still see such an import.
    source = "from sandcell.backends.namespaces import NamespacesBackend\n"
    names = {
        rung
        for _, name in _imported(ast.parse(source), "sandcell.backends.gvisor", package=True)
        if (rung := _rung_of(name)) is not None
    }
    assert names == {"namespaces"} and "gvisor" not in BUILDS_ON
