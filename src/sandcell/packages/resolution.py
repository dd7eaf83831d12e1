"""A run's imports, resolved against the runtime, the wheel cache and the profile.

Installing a package is running code, so nothing is installed while a run runs: an import the
runtime lacks is served from the wheel cache only if the profile allows the package, otherwise it
is denied with a ``py.package`` finding placed on the import line.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sandcell.packages.wheel_cache import CachedPackage, WheelCache
from sandcell.packages.wheels import normalize_name
from sandcell.policy.checks.findings import Finding, snippet_of
from sandcell.spec import DEFAULT_RUNTIME

__all__ = ["Resolution", "imports_of", "resolve_packages"]


def _import_sites(code: str) -> dict[str, tuple[int, int, str]]:
    """Top-level module -> (line, column, snippet) of its first import in ``code``."""
    try:
        tree = ast.parse(code)
        nodes = list(ast.walk(tree))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    lines = code.splitlines()
    sites: dict[str, tuple[int, int, str]] = {}

    def add(module: str, node: ast.stmt | ast.expr) -> None:
        top = module.split(".", 1)[0]
        if not top.isidentifier():
            return  # a relative import_module(".x") or a non-name
        text = lines[node.lineno - 1] if 0 < node.lineno <= len(lines) else ""
        # ast columns are UTF-8 byte offsets; findings count characters.
        col = len(text.encode()[: node.col_offset].decode(errors="replace")) + 1
        if top not in sites or (node.lineno, col) < sites[top][:2]:
            sites[top] = (node.lineno, col, snippet_of(text))

    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            add(node.module, node)
        elif isinstance(node, ast.Call) and node.args:
            fn = node.func
            called = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", "")
            value = node.args[0].value if isinstance(node.args[0], ast.Constant) else None
            if called in ("import_module", "__import__") and isinstance(value, str):
                add(value, node)
    return sites


_CACHED_CODE_CHARS = 64 * 1024
"""Programs up to this size have their imports kept, as the policy gate keeps its findings."""


def imports_of(code: str) -> frozenset[str]:
    """Top-level modules that Python ``code`` imports: ``import``, ``from ... import`` (not
    relative ones) and ``importlib.import_module``/``__import__`` of a constant name. Code that
    does not parse imports nothing (the checks report the syntax error)."""
    if len(code) > _CACHED_CODE_CHARS:
        return frozenset(_import_sites(code))
    return _kept_imports(code)


@lru_cache(maxsize=128)
def _kept_imports(code: str) -> frozenset[str]:
    # A function of the text alone: a program run again (a retry, a pooled loop of one snippet)
    # is not parsed again on the run's path.
    return frozenset(_import_sites(code))


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a run gets from the wheel cache, and what is denied."""

    paths: tuple[Path, ...]
    """Extracted directories to mount read-only and put on ``sys.path``, in name order."""
    packages: tuple[CachedPackage, ...]
    findings: tuple[Finding, ...]
    """``py.package`` denials: imports neither in the runtime nor allowed from the cache."""


def resolve_packages(
    code_imports: Collection[str],
    *,
    allowed_packages: Collection[str],
    cache: WheelCache,
    code: str = "",
    local: Collection[str] = (),
    runtime: str | None = None,
) -> Resolution:
    """Resolve a run's top-level imports: the standard library and the runtime need nothing;
    a cached package listed in ``allowed_packages`` is mounted, with the cached packages it
    requires; anything else is a ``deny`` finding. ``code``, when given, places the findings
    on the import lines; ``local`` names modules the run brings itself (its own input files);
    ``runtime`` is the run's runtime (None: ``default``).
    """
    if not set(code_imports) - sys.stdlib_module_names - set(local):
        # Nothing but the standard library: no need to read the runtime's package metadata,
        # which costs a command line run more than the run itself.
        return Resolution(paths=(), packages=(), findings=())
    allowed = {normalize_name(p) for p in allowed_packages}
    from sandcell.runtimes.offer import offer

    runtime_offer = offer(runtime)
    known = runtime_offer.importable | set(local)
    if set(code_imports) <= known:
        # The common case, on every run: nothing to look up in the cache.
        return Resolution(paths=(), packages=(), findings=())
    in_runtime = runtime_offer.distribution_names
    where = "the runtime" if runtime in (None, DEFAULT_RUNTIME) else f"the runtime {runtime!r}"
    cached = {p.name: p for p in cache.packages()}
    by_import = {i: p for p in cached.values() for i in p.imports}
    sites = _import_sites(code) if code else {}
    used: dict[str, CachedPackage] = {}
    findings: list[Finding] = []

    def deny(module: str, message: str) -> None:
        line, column, snippet = sites.get(module, (1, 1, ""))
        findings.append(Finding("py.package", "deny", line, column, message, snippet))

    def use(pkg: CachedPackage, module: str) -> None:
        used[pkg.name] = pkg
        for dep in (*pkg.requires, *pkg.requires_if):
            if dep in used or dep in in_runtime:
                continue
            if dep in cached and dep in allowed:
                use(cached[dep], module)
            elif dep in pkg.requires:
                where = "is in the wheel cache but not in" if dep in cached else "is not in"
                deny(module, f"package {pkg.name} needs {dep}, which {where} this profile's "
                     f"allowed_packages or the cache; add it with `sandcell packages add "
                     f"{dep}==VERSION` and allow it in the profile")  # fmt: skip

    for module in sorted(set(code_imports)):
        pkg = by_import.get(module)
        if module in known or (pkg is not None and pkg.name in used):
            continue
        if pkg is None:
            deny(module, f"{module} is not in {where} or the wheel cache; nothing is "
                 "installed at run time: prepare it ahead of time with `sandcell packages add "
                 f"{module}==VERSION` and allow it in the profile"
                 + _elsewhere(module, runtime))  # fmt: skip
        elif pkg.name not in allowed:
            deny(module, f"package {pkg.name} is in the wheel cache but not in this profile's "
                 "allowed_packages; add it to the profile or use one that allows it")  # fmt: skip
        else:
            use(pkg, module)
    chosen = tuple(used[n] for n in sorted(used))
    return Resolution(tuple(p.path for p in chosen), chosen, tuple(findings))


def _elsewhere(module: str, runtime: str | None) -> str:
    """Where a denied import would be found: the built runtimes that have it (read only on a
    denial, so a run that imports what it has pays nothing)."""
    from sandcell.errors import SandcellError
    from sandcell.runtimes.store import list_runtimes

    try:
        names = [
            s.manifest.name
            for s in list_runtimes()
            # A Python import: the node runtime's npm packages (a "yaml" there too) do not count.
            if s.manifest.kind == "python"
            and module in s.manifest.imports
            and s.manifest.name != runtime
        ]
    except SandcellError:
        return ""
    if not names:
        return ""
    built = ", ".join(names)
    return f", or run in a runtime that has it: --runtime {names[0]} (built here: {built})"
