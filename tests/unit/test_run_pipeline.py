"""One run pipeline (issue 22): the executor, sessions and replay meet in it, not in each other.

The executor imports sessions and replay at module level (the graph stays free of cycles:
``test_imports.py``); none of the three imports another inside a function, where a circle would
be hidden until the function runs. Imports under ``TYPE_CHECKING`` (types only) are allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sandcell

SRC = Path(sandcell.__file__).resolve().parent
GROUPS = ("sandcell.executor", "sandcell.sessions", "sandcell.replay")


def _group(name: str) -> str | None:
    return next((g for g in GROUPS if name == g or name.startswith(g + ".")), None)


def _modules() -> dict[str, Path]:
    found = {"sandcell.executor": SRC / "executor.py"}
    for package in ("sessions", "replay"):
        for path in (SRC / package).glob("*.py"):
            stem = "" if path.stem == "__init__" else f".{path.stem}"
            found[f"sandcell.{package}{stem}"] = path
    return found


def _imports_in_functions(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import inside a function of ``path``, relative ones resolved."""
    out: list[tuple[int, str]] = []
    for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                out += [(node.lineno, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                out.append((node.lineno, base))
                out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def test_the_three_import_each_other_at_module_level_only() -> None:
    modules = _modules()
    assert len(modules) > 5 and "sandcell.sessions.session" in modules
    found = []
    for name, path in sorted(modules.items()):
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for line, target in _imports_in_functions(path, package):
            other = _group(target)
            if other is not None and other != _group(name):
                found.append(f"{path.relative_to(SRC)}:{line} imports {target}")
    assert not found, "in-function imports between executor, sessions and replay:\n" + "\n".join(
        found
    )


def test_the_finder_sees_an_import_in_a_function(tmp_path: Path) -> None:
    # The check above is only as good as this.
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from ..executor import Executor\n", encoding="utf-8")
    assert (2, "sandcell.executor") in _imports_in_functions(path, "sandcell.sessions")
