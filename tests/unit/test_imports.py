"""The house is clear: no module of sandcell needs another to have been imported first.

Two checks. Statically, the graph of module-level imports between sandcell's modules has no
cycle (imports under ``TYPE_CHECKING`` and inside functions are not followed at import time, so
they are left out). Dynamically, every module imports on its own, in an interpreter where no
other sandcell module was loaded: a circle that the static check misses (``import a.b`` running
``a/__init__``) still fails there.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
import textwrap
from pathlib import Path

import sandcell

from .background import Check, result, started_early

SRC = Path(sandcell.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    found = {"sandcell": SRC / "__init__.py"}
    for info in pkgutil.walk_packages([str(SRC)], prefix="sandcell."):
        spec = importlib.util.find_spec(info.name)
        if spec is not None and spec.origin is not None:
            found[info.name] = Path(spec.origin)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """sandcell modules that ``name`` imports while it is being imported."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and not _is_type_checking(node):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                out.add(base)
                out.update(f"{base}.{a.name}" for a in node.names)

    visit(tree.body)
    # Importing a.b.c runs a/__init__ and a/b/__init__ first.
    deps: set[str] = set()
    for target in out:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            candidate = ".".join(parts[:i])
            if candidate in modules and candidate != name:
                deps.add(candidate)
    return deps


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := walk(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)) is not None:
            return found
    return None


def test_cycle_finder_finds_a_cycle() -> None:
    # The check below is only as good as this: a known circle is reported.
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_module_level_imports_have_no_cycle() -> None:
    modules = _modules()
    assert "sandcell.executor" in modules and "sandcell.sessions.session" in modules
    graph = {name: _top_level_imports(name, path, modules) for name, path in modules.items()}
    # A package's __init__ runs before any of its modules, and re-exports some of them: an
    # edge from a module to a package it lies in is not a circle the interpreter trips over.
    for name, deps in graph.items():
        parts = name.split(".")
        deps.difference_update(".".join(parts[:i]) for i in range(1, len(parts)))
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_old_circle_is_gone() -> None:
    modules = _modules()
    circle = ["sandcell.executor", "sandcell.packages", "sandcell.policy.gate"]
    for name in ["sandcell.packages.wheel_cache", "sandcell.packages.runtime_lock", *circle[1:]]:
        deps = _top_level_imports(name, modules[name], modules)
        assert "sandcell.executor" not in deps, f"{name} imports the executor"
    source = modules["sandcell.packages.wheel_cache"].read_text(encoding="utf-8")
    assert "sandcell.executor" not in source, "the wheel cache reaches into the executor"


_CHILD = textwrap.dedent(
    """
    import importlib, importlib.machinery, os, shutil, sys, tempfile, traceback

    # Compiling sandcell's sources is the same work in every child: the parent compiles each one
    # once (below, while it loads them all) and its forks reuse the code object instead of
    # compiling it again (no .pyc is written: PYTHONDONTWRITEBYTECODE is honoured). A code object
    # is immutable; each child still runs every module body afresh.
    codes = {}
    get_code = importlib.machinery.SourceFileLoader.get_code

    def cached_get_code(loader, fullname):
        if fullname != "sandcell" and not fullname.startswith("sandcell."):
            return get_code(loader, fullname)
        if loader.path not in codes:
            codes[loader.path] = get_code(loader, fullname)
        return codes[loader.path]

    importlib.machinery.SourceFileLoader.get_code = cached_get_code
    names = sys.argv[1:]
    for name in names:
        __import__(name)
    loaded = [m for m in sys.modules if m == "sandcell" or m.startswith("sandcell.")]
    for m in loaded:
        del sys.modules[m]
    out_dir = tempfile.mkdtemp(prefix="sandcell-imports-")

    def child(name):
        try:
            importlib.import_module(name)
        except BaseException:
            with open(os.path.join(out_dir, name), "w") as f:
                traceback.print_exc(file=f)
            os._exit(1)
        os._exit(0)

    # Each module in its own forked child; as many children at once as there are CPUs.
    failed, running, todo = [], {}, list(names)
    while todo or running:
        while todo and len(running) < (os.cpu_count() or 1):
            name = todo.pop(0)
            pid = os.fork()
            if pid == 0:
                child(name)
            running[pid] = name
        pid, status = os.wait()
        name = running.pop(pid)
        if os.waitstatus_to_exitcode(status) != 0:
            failed.append(name)
    for name in failed:
        path = os.path.join(out_dir, name)
        sys.stderr.write(open(path).read() if os.path.exists(path) else name + ": no traceback\\n")
    shutil.rmtree(out_dir)
    print("FAILED:" + ",".join(sorted(failed)))
    """
)


def _import_each_alone() -> list[str]:
    names = sorted(_modules())
    # Modules that run something when imported as a program, not as a library.
    names = [n for n in names if not n.endswith("__main__")]
    return [sys.executable, "-c", _CHILD, *names]


IMPORT_EACH_ALONE = Check(
    "every module imported alone",
    _import_each_alone,
    cwd=SRC.parents[1],
    env={"PYTHONDONTWRITEBYTECODE": "1"},
)
"""About a minute of CPU: started when the suite is collected, read by the test below."""


@started_early(IMPORT_EACH_ALONE)
def test_every_module_imports_alone() -> None:
    """Each module in a fresh sandcell state: the third-party libraries are loaded once in the
    parent (it is sandcell's own order that matters), then every module is imported in a forked
    child in which no sandcell module exists yet."""
    proc = result(IMPORT_EACH_ALONE)
    assert proc.returncode == 0, proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("FAILED:"), proc.stdout[-2000:]
    assert last == "FAILED:", f"{last}\n{proc.stderr[-6000:]}"
