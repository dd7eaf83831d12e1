"""Static checks of the code before it runs: findings with rule ids and locations.

Checks are defence in depth, not a boundary. They read the code as written (the Python syntax
tree, a real parse of the shell) and report what it plainly reaches for: processes, native code,
dynamic code, the network, package managers, paths outside the workspace. Determined code can
evade them (``docs/checks-evasions.md`` records which tricks are caught and which are not), so
nothing relies on them alone: the sandbox (namespaces, seccomp, Landlock, cgroups, no network)
is the boundary, and holds whatever the checks miss.

:func:`check` runs the checks for one language; :func:`decide` turns the findings into the
profile's verdict: allow, deny (outcome ``denied``) or approve (outcome ``awaiting_approval``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import assert_never

from sandcell.policy.checks.findings import (
    APPROVAL_MODES,
    RULES,
    SEVERITIES,
    Approval,
    Decision,
    Finding,
    Severity,
    Verdict,
    decide,
    snippet_of,
)
from sandcell.policy.checks.js_rules import NODE_SAFE_BUILTINS, check_javascript
from sandcell.policy.checks.python_rules import SAFE_STDLIB, check_python
from sandcell.policy.checks.shell_escapes import misused, shell_escapes
from sandcell.policy.checks.shell_rules import check_shell
from sandcell.spec import Language

__all__ = [
    "APPROVAL_MODES",
    "NODE_SAFE_BUILTINS",
    "RULES",
    "SAFE_STDLIB",
    "SEVERITIES",
    "Approval",
    "Decision",
    "Finding",
    "Severity",
    "Verdict",
    "check",
    "check_javascript",
    "check_python",
    "check_shell",
    "decide",
]


def check(
    code: str,
    language: Language,
    *,
    allowed_imports: Collection[str] | None,
    network: bool,
    bash: bool = True,
) -> list[Finding]:
    """Findings for ``code`` in ``language``, in source order.

    ``allowed_imports`` is the profile's package allowlist for the language (``None``: any
    import; for JavaScript and TypeScript, Node's safe built-ins are added to it);
    ``network`` says whether the profile gives the run a network; ``bash`` whether it allows
    Bash programs. A Python cell's shell escapes (:mod:`.shell_escapes`) are checked as the
    Bash programs they are, their findings placed at the escape's line.
    """
    if language == "python":
        findings = check_python(code, allowed_imports=allowed_imports, network=network)
        escapes = _escape_findings(code, network=network, bash=bash)
        return sorted(findings + escapes, key=lambda f: f.line) if escapes else findings
    if language == "bash":
        return check_shell(code, network=network)
    if language == "javascript":
        return check_javascript(
            code, typescript=False, allowed_imports=allowed_imports, network=network
        )
    if language == "typescript":
        return check_javascript(
            code, typescript=True, allowed_imports=allowed_imports, network=network
        )
    assert_never(language)


def _escape_findings(code: str, *, network: bool, bash: bool) -> list[Finding]:
    found = misused(code)
    for escape in shell_escapes(code):
        if not bash:
            found.append(
                Finding(
                    "py.shell-escape",
                    "deny",
                    escape.line,
                    1,
                    "this profile does not allow Bash programs, and a shell escape (`!cmd`, "
                    "`%%bash`) is one: do it in Python, or use a profile that allows Bash",
                    snippet_of(escape.program.split("\n", 1)[0]),
                )
            )
            continue
        for f in check_shell(escape.program, network=network):
            found.append(replace(f, line=escape.line + f.line - 1))
    return sorted(found, key=lambda f: (f.line, f.column))
