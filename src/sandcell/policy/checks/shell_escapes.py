"""Shell escapes in Python: the Bash programs a Python cell runs through ``_sandcell_shell``.

A notebook's ``!ls`` (and ``%%bash``) reaches the sandbox as a call of the kernel's
:data:`SHELL_ESCAPE` function with the program as a literal string (see
:mod:`sandcell.e2b.ipython`). Each such program is checked by the shell rules exactly as a Bash
run of it would be, and needs a profile that allows Bash: what the checks read is what runs.
Any other use of the name (a computed program, an alias, a lookup by attribute or by string)
would run a program the checks never read, so it is a ``deny`` finding of its own.

Like every check this is defence in depth: code that reaches the function through reflection
the Python rules do not follow can run what it likes, with no more power than a subprocess of
the sandbox has anyway.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from sandcell.policy.checks.findings import Finding, snippet_of

__all__ = ["SHELL_ESCAPE", "ShellEscape", "misused", "shell_escapes"]

SHELL_ESCAPE = "_sandcell_shell"
"""The kernel's shell-escape function (the display module defines it in ``builtins``)."""
_KEYWORDS = frozenset({"capture", "check"})


@dataclass(frozen=True, slots=True)
class ShellEscape:
    """One Bash program a Python cell runs, and where."""

    program: str
    line: int
    """1-based line of the call in the Python source."""


def _literal_call(node: ast.Call) -> str | None:
    """The program of a well-formed escape call: one literal string, constant keywords."""
    if len(node.args) != 1 or not isinstance(node.args[0], ast.Constant):
        return None
    program = node.args[0].value
    if not isinstance(program, str):
        return None
    for kw in node.keywords:
        if kw.arg not in _KEYWORDS or not isinstance(kw.value, ast.Constant):
            return None
        if not isinstance(kw.value.value, bool):
            return None
    return program


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # the Python rules report why (py.syntax)


def shell_escapes(code: str) -> tuple[ShellEscape, ...]:
    """The well-formed escape calls of ``code``, in source order (none if it does not parse)."""
    tree = _parse(code) if SHELL_ESCAPE in code else None
    if tree is None:
        return ()
    found: list[ShellEscape] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == SHELL_ESCAPE
        ):
            program = _literal_call(node)
            if program is not None:
                found.append(ShellEscape(program=program, line=node.lineno))
    return tuple(sorted(found, key=lambda e: e.line))


def misused(code: str) -> list[Finding]:
    """``deny`` findings for every use of :data:`SHELL_ESCAPE` other than a literal call."""
    tree = _parse(code) if SHELL_ESCAPE in code else None
    if tree is None:
        return []
    lines = code.splitlines()
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == SHELL_ESCAPE
            and _literal_call(node) is not None
        ):
            allowed.add(id(node.func))
    findings: list[Finding] = []
    for node in ast.walk(tree):
        named = (
            (isinstance(node, ast.Name) and node.id == SHELL_ESCAPE and id(node) not in allowed)
            or (isinstance(node, ast.Attribute) and node.attr == SHELL_ESCAPE)
            or (isinstance(node, ast.Constant) and node.value == SHELL_ESCAPE)
            or (isinstance(node, ast.alias) and SHELL_ESCAPE in (node.name, node.asname))
            or (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and node.name == SHELL_ESCAPE
            )
            or (isinstance(node, ast.arg) and node.arg == SHELL_ESCAPE)
        )
        if not named:
            continue
        line = getattr(node, "lineno", 1)
        column = getattr(node, "col_offset", 0) + 1
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        findings.append(
            Finding(
                "py.shell-escape",
                "deny",
                line,
                column,
                f"{SHELL_ESCAPE} runs a shell escape; it may only be called with the program as "
                "a literal string (as `!cmd` is translated), so that the shell checks read what "
                "runs: write the command literally, or run it with Bash",
                snippet_of(text),
            )
        )
    return sorted(findings, key=lambda f: (f.line, f.column))
