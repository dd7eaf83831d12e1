"""What a check reports, and how a profile turns a list of findings into one decision.

A :class:`Finding` is one rule firing at one place in the code. :func:`decide` folds the findings
of a run into a :class:`Decision` for the profile's approval mode:

==============  ===================  =====================  ========
approval        any ``deny``         any ``warning``        else
==============  ===================  =====================  ========
``never``       deny                 allow (recorded)       allow
``on_findings`` deny                 approve                allow
``always``      deny                 approve                approve
==============  ===================  =====================  ========

``deny`` stops the run before it starts (outcome ``denied``); ``approve`` holds it for a person
(outcome ``awaiting_approval``). ``info`` findings are recorded and never change the verdict.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from sandcell.errors import ConfigError

Severity = Literal["info", "warning", "deny"]
"""How much a finding weighs: ``deny`` stops the run, ``warning`` may need approval."""
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "deny")

Verdict = Literal["allow", "deny", "approve"]
Approval = Literal["never", "on_findings", "always"]
APPROVAL_MODES: tuple[Approval, ...] = ("never", "on_findings", "always")

_SNIPPET_CHARS = 120

RULES: dict[str, str] = {
    "py.syntax": "Python that does not parse (deny: it cannot run)",
    "py.import": "an import outside the profile's allowlist",
    "py.process": "process creation: subprocess, os.system, os.exec*, os.fork, pty",
    "py.native": "native code: ctypes, cffi (deny)",
    "py.dynamic-code": "exec, eval, compile, __import__, importlib, breakpoint (deny if computed)",
    "py.reflection": "computed getattr on modules, __subclasses__, __globals__, globals() writes",
    "py.deserialize": "pickle, marshal and friends (import: warning; loads: deny)",
    "py.network": "network modules and URLs when the profile has no network",
    "py.path": "path literals outside the workspace and inputs",
    "py.package": "an import of a package neither in the runtime nor allowed from the wheel cache",
    "py.shell-escape": "a shell escape (`!cmd`) the checks cannot read, or one under a profile "
    "without Bash (deny); a literal one is checked by the shell rules",
    "sh.syntax": "shell that does not parse (deny: it cannot run)",
    "sh.network": "network tools and /dev/tcp when the profile has no network",
    "sh.package": "package managers: pip, apt-get, npm, conda...",
    "sh.pipe-to-shell": "downloaded code run by a shell or interpreter (deny)",
    "sh.write-outside": "writes outside the writable workspace",
    "sh.destroy": "rm -rf /, mkfs, dd to a device, fork bombs (deny)",
    "sh.background": "processes that outlive the command: &, nohup, setsid, disown",
    "sh.eval": "code known only at run time: eval, computed names, text piped into a shell",
    "js.syntax": "JavaScript or TypeScript that does not parse (deny: it cannot run)",
    "js.import": "a module outside the profile's allowlist (Node's safe built-ins and the "
    "runtime's locked packages)",
    "js.process": "processes and threads: child_process, cluster, worker_threads",
    "js.native": "native code: process.dlopen, process.binding, .node addons, wasi (deny)",
    "js.dynamic-code": "eval, Function, vm, string timers, the constructor chain, computed "
    "require()/import() (deny if computed)",
    "js.reflection": "computed keys into globalThis, process, module or require; Reflect and "
    "Proxy on them",
    "js.network": "network modules, fetch, WebSocket and URLs when the profile has no network",
    "js.path": "path literals outside the workspace and inputs",
    "js.inspector": "the inspector module and debugger flags (deny)",
}
"""Every rule id the checks emit, with what it is about; profiles refer to these ids."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One rule firing at one place in the checked code."""

    rule_id: str
    """Stable id of the rule, such as ``py.process`` or ``sh.network``; profiles refer to it."""
    severity: Severity
    """The rule's default weight for this occurrence; a profile may override it per rule."""
    line: int
    """1-based line of the code the finding points at."""
    column: int
    """1-based column, in characters (not bytes), on that line."""
    message: str
    """What was found, why it matters, and what to do instead."""
    snippet: str
    """The offending source line, stripped and cut to a readable length."""

    def to_dict(self) -> dict[str, object]:
        """The finding as plain JSON-ready values, for the run record and the wire."""
        return {
            "rule_id": self.rule_id,
            "severity": self.severity,
            "line": self.line,
            "column": self.column,
            "message": self.message,
            "snippet": self.snippet,
        }


@dataclass(frozen=True, slots=True)
class Decision:
    """The single verdict a profile gives a run's code, with the findings behind it."""

    verdict: Verdict
    """``allow`` runs it, ``deny`` stops it (outcome ``denied``), ``approve`` waits for a person
    (outcome ``awaiting_approval``)."""
    findings: tuple[Finding, ...]
    """The findings that were weighed, after overrides; disabled rules are left out."""
    reason: str
    """One sentence for a person: which rules decided it, or why nothing did."""


def outside_roots(path: str, roots: Sequence[str], *, benign: Collection[str] = ()) -> bool:
    """Whether a path literal points outside ``roots`` (shared by the Python and shell rules).

    ``~`` paths and relative paths that climb out (``../x``) are outside; ``benign`` absolute
    paths (``/dev/null`` and the like) never are.
    """
    if path.startswith("~"):
        return True
    norm = posixpath.normpath(path)
    if not path.startswith("/"):
        return norm == ".." or norm.startswith("../")
    norm = "/" + norm.lstrip("/")
    if norm in benign:
        return False
    return not any(norm == r or norm.startswith(r.rstrip("/") + "/") for r in roots)


def snippet_of(line_text: str) -> str:
    """A source line made fit for a finding: stripped and cut to a readable length."""
    text = line_text.strip()
    if len(text) > _SNIPPET_CHARS:
        text = text[: _SNIPPET_CHARS - 3] + "..."
    return text


def _rule_list(findings: Iterable[Finding]) -> str:
    ids: list[str] = []
    for f in findings:
        if f.rule_id not in ids:
            ids.append(f.rule_id)
    return ", ".join(ids)


def decide(
    findings: Sequence[Finding],
    *,
    approval: Approval,
    severity_overrides: Mapping[str, Severity] | None = None,
    disabled: Sequence[str] = (),
) -> Decision:
    """Fold findings into one decision under a profile's approval mode (table in the module doc).

    ``severity_overrides`` maps a rule id to the severity every finding of that rule gets (a
    profile may make ``py.network`` a ``deny``, or ``sh.background`` an ``info``); ``disabled``
    rule ids are dropped before weighing and do not appear in the decision.
    """
    if approval not in APPROVAL_MODES:
        raise ConfigError(f"approval must be one of {APPROVAL_MODES}, got {approval!r}")
    overrides = severity_overrides or {}
    for rule_id, severity in overrides.items():
        if severity not in SEVERITIES:
            raise ConfigError(
                f"severity override for {rule_id} must be one of {SEVERITIES}, got {severity!r}"
            )
    off = set(disabled)
    weighed = tuple(
        replace(f, severity=overrides[f.rule_id]) if f.rule_id in overrides else f
        for f in findings
        if f.rule_id not in off
    )
    denying = [f for f in weighed if f.severity == "deny"]
    warning = [f for f in weighed if f.severity == "warning"]
    if denying:
        first = denying[0]
        reason = (
            f"denied by {_rule_list(denying)}: line {first.line}: {first.message}"
            if len(denying) == 1
            else f"denied by {_rule_list(denying)} ({len(denying)} findings); first at line "
            f"{first.line}: {first.message}"
        )
        return Decision("deny", weighed, reason)
    if approval == "always":
        extra = f"; findings: {_rule_list(warning)}" if warning else ""
        return Decision("approve", weighed, f"this profile approves every run by hand{extra}")
    if warning:
        if approval == "on_findings":
            return Decision(
                "approve", weighed, f"needs approval: warnings from {_rule_list(warning)}"
            )
        return Decision(
            "allow",
            weighed,
            f"allowed; warnings from {_rule_list(warning)} recorded (approval is never asked)",
        )
    return Decision("allow", weighed, "no findings that need a decision")
