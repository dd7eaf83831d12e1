"""``sandcell audit`` and ``sandcell approvals|approve|deny`` through a service.

Through a service a command sees what the key's tenant owns there: its run records, its approvals
(``/v1/audit``, ``/v1/approvals``); in-process it sees every record of the home. Runs, results and
record entries print exactly as in-process. Where the service's API shows less than the local
store (an approval's stored limits, inputs and environment), the command says so instead of
making it up. Tool calls waiting for a person (ids ``t...``) are listed, shown and decided through
``/v1/tool-approvals``, with the same lines as in-process.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandcell.cli.remote import Remote, Target
from sandcell.cli.remote_run import download, refuse_local_only
from sandcell.cli.run import report
from sandcell.errors import ConfigError
from sandcell.spec import result_from_dict

if TYPE_CHECKING:
    from sandcell.policy.tool_tickets import ToolTicket

__all__ = ["approvals_remote", "approve_remote", "audit_remote", "deny_remote"]


def audit_remote(args: argparse.Namespace, target: Target) -> int:
    from sandcell.cli.audit import print_entry

    remote = Remote(target)
    if args.audit_command == "list":
        rows = remote.json("GET", "/v1/audit", query={"limit": max(1, min(args.limit, 500))})
        summaries = [{k: r.get(k) for k in _SUMMARY} for r in rows]
        if args.json:
            print(json.dumps(summaries, ensure_ascii=False))
        else:
            for s in summaries:
                print(
                    f"{s['run_id']}  {s['started_at']}  {s['language']:<6} "
                    f"{s['outcome']:<13} {s['wall_ms']} ms"
                )
        return 0
    if args.audit_command == "show":
        answer = remote.call("GET", f"/v1/audit/{args.run_id}", accept=(404,))
        if answer.status == 404:
            print(f"sandcell: no run {args.run_id!r} at {target.where}", file=sys.stderr)
            return 1
        entry = answer.json()
        print_entry(
            seq=entry["seq"],
            hash_=entry["hash"],
            prev_hash=entry["prev_hash"],
            record=entry["record"],
            as_json=args.json,
        )
        return 0
    report = remote.json("GET", "/v1/audit/verify")
    if report["ok"]:
        print(f"ok: {report['records']} records, hash chain intact")
        return 0
    for p in report["problems"]:
        print(f"{p['kind']}: seq {p['seq']} run {p['run_id']}: {p['detail']}")
    others = int(report.get("other_problems") or 0)
    if others:
        print(f"{others} problems in records that are not this tenant's (the service's log)")
    return 1


# The fields of `audit list`, in-process and here alike (the service adds session_id).
_SUMMARY = ("run_id", "started_at", "language", "outcome", "wall_ms")


def _is_tool(ident: str) -> bool:
    from sandcell.policy.tool_tickets import is_tool_ticket_id

    return is_tool_ticket_id(ident)


def _tool_ticket(d: dict[str, Any]) -> ToolTicket:
    from sandcell.policy.tool_tickets import COLUMNS, ToolTicket

    # The service sends the arguments as shown (redacted), their hash, the request line and
    # whether they are intact; not the exact text, which stays in its store.
    fields: dict[str, Any] = {k: d.get(k) for k in COLUMNS}
    fields["request_line"] = d.get("request_line")
    fields["intact"] = bool(d.get("intact"))
    return ToolTicket(**fields)


_LISTED = 500
"""The most approvals of each kind ``approvals list`` shows through a service."""
_PAGES = 50
"""Pages followed at most: each looks at a bounded number of rows of the service's stores, so
the tenant's own may be a few pages in (behind other tenants' tool calls)."""


def _paged(remote: Remote, path: str, status: str) -> list[dict[str, Any]]:
    """Up to :data:`_LISTED` items of a paged listing, following ``X-Next-Cursor``."""
    found: list[dict[str, Any]] = []
    query: dict[str, str | int] = {"status": status, "limit": _LISTED}
    for _ in range(_PAGES):
        answer = remote.call("GET", path, query=query)
        found += answer.json()
        cursor = answer.headers.get("x-next-cursor")  # header names come lowercased
        if cursor is None or len(found) >= _LISTED:
            break
        query = {**query, "cursor": cursor, "limit": _LISTED - len(found)}
    return found[:_LISTED]


def approvals_remote(args: argparse.Namespace, target: Target) -> int:
    remote = Remote(target)
    if args.approvals_command == "list":
        status = "all" if args.all else "pending"
        listed = _paged(remote, "/v1/approvals", status)
        calls = [_tool_ticket(c) for c in _paged(remote, "/v1/tool-approvals", status)]
        if args.json:
            both = [{"kind": "run", **a} for a in listed] + [c.to_dict() for c in calls]
            both.sort(key=lambda d: str(d.get("created_at", "")), reverse=True)
            print(json.dumps(both, ensure_ascii=False))
        else:
            print(_render_both(listed, calls))
        return 0
    if _is_tool(args.id):
        from sandcell.policy.tool_tickets import render_tool_ticket

        call = _tool_ticket(remote.json("GET", f"/v1/tool-approvals/{args.id}"))
        if args.json:
            print(json.dumps(call.to_dict(), ensure_ascii=False))
        else:
            print(render_tool_ticket(call))
        return 0
    approval = remote.json("GET", f"/v1/approvals/{args.id}")
    if args.json:
        print(json.dumps({"kind": "run", **approval}, ensure_ascii=False))
    else:
        print(_render_approval(approval, target))
    return 0


def _render_list(listed: list[dict[str, Any]]) -> str:
    """The lines of ``approvals list``, as :func:`sandcell.policy.approvals.render_list` makes
    them from the local store."""
    from sandcell.policy.approvals import _finding_line

    if not listed:
        return "no approvals\n"
    out = []
    for a in listed:
        findings = a.get("findings") or []
        first = _finding_line(findings[0])[:72] if findings else "no findings"
        more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
        created = str(a["created_at"])[:19].replace("T", " ")
        out.append(f"{a['id']}  {created}  {a['language']:<6}  {a['status']:<8}  {first}{more}")
    return "\n".join(out) + "\n"


def _render_both(listed: list[dict[str, Any]], calls: list[ToolTicket]) -> str:
    """Runs and tool calls merged newest first, as in-process (``cli.approvals``)."""
    from sandcell.policy.tool_tickets import render_tool_list_lines

    if not calls:
        return _render_list(listed)
    run_lines = _render_list(listed).splitlines() if listed else []
    dated = [(str(a["created_at"]), line) for a, line in zip(listed, run_lines, strict=True)]
    dated += list(zip((c.created_at for c in calls), render_tool_list_lines(calls), strict=True))
    return "\n".join(line for _, line in sorted(dated, reverse=True)) + "\n"


def _decide_tool(args: argparse.Namespace, remote: Remote, *, approve: bool) -> int:
    """As ``sandcell approve|deny tID`` in-process: the call goes ahead, or is refused."""
    from sandcell.validation import neutralise

    if approve and (args.out is not None or args.backend is not None):
        raise ConfigError(
            f"{args.id} is a tool call, not a run: --out and --backend do not apply to it"
        )
    verb = "approve" if approve else "deny"
    call = _tool_ticket(
        remote.json("POST", f"/v1/tool-approvals/{args.id}/{verb}", body={"reason": args.reason})
    )
    if args.json:
        print(json.dumps(call.to_dict(), ensure_ascii=False))
    else:
        run = f" of run {call.run_id}" if call.run_id else ""
        then = "goes ahead" if approve else "is refused"
        print(neutralise(f"{call.status}: tool call {call.id} ({call.tool}{run}); the call {then}"))
    return 0


def _render_approval(a: dict[str, Any], target: Target) -> str:
    """``approvals show`` from what the service tells: the lines of
    :func:`~sandcell.policy.approvals.render_ticket` it has the fields for, and a line saying
    what it does not show."""
    from sandcell.policy.approvals import _finding_line, _visible

    p = a.get("profile") or {}
    lines = [
        f"approval  {a['id']}  {a['status']}",
        f"created   {a['created_at']}",
        f"profile   {p.get('name', '?')} ({p.get('source', '?')}, sha256 {p.get('sha256', '?')})",
        f"why       {a['reason_for_approval']}",
        f"language  {a['language']}",
        f"backend   {p.get('backend') or 'not recorded (the profile default when approved)'}",
        f"request   limits, inputs, env and stdin are not shown by the service at {target.where}",
    ]
    if a.get("decided_by"):
        lines.append(f"decided   {a['status']} by {a['decided_by']} at {a['decided_at']}")
        lines.append(f"reason    {a.get('decision_reason') or '-'}")
    if a.get("run_id"):
        lines.append(f"run       {a['run_id']}")
    if not a.get("intact", True):
        lines.append("WARNING   the stored request was changed after submission; it cannot run")
    lines = [_visible(line) for line in lines]
    findings = a.get("findings") or []
    lines.append(f"findings ({len(findings)})" if findings else "no findings")
    lines += ["  " + _finding_line(f) for f in findings]
    code = str(a["code"])
    code = code[:-1] if code.endswith("\n") else code
    code_lines = code.split("\n")
    width = len(str(len(code_lines)))
    lines.append("code")
    lines += [f"{n:>{width}} | {_visible(c)}" for n, c in enumerate(code_lines, 1)]
    return "\n".join(lines) + "\n"


def approve_remote(args: argparse.Namespace, target: Target) -> int:
    if _is_tool(args.id):
        return _decide_tool(args, Remote(target), approve=True)
    refuse_local_only(((f"--backend {args.backend}", args.backend is not None),), target)
    remote = Remote(target)
    reply = remote.json("POST", f"/v1/approvals/{args.id}/approve", body={"reason": args.reason})
    result = result_from_dict(reply["result"])
    copied: list[Path] = []
    if args.out is not None and result.artifacts:
        with tempfile.TemporaryDirectory(prefix="sandcell-download-") as tmp:
            store = download(remote, result.artifacts, Path(tmp))
            copied = store.copy_out(result.artifacts, args.out)
    return report(result, as_json=args.json, copied=copied, out=args.out)


def deny_remote(args: argparse.Namespace, target: Target) -> int:
    if _is_tool(args.id):
        return _decide_tool(args, Remote(target), approve=False)
    remote = Remote(target)
    body = remote.json("POST", f"/v1/approvals/{args.id}/deny", body={"reason": args.reason})
    if args.json:
        print(json.dumps(body, ensure_ascii=False))
    else:
        result = result_from_dict(body)
        print(f"denied: {result.reason} (recorded as run {result.run_id})")
    return 0
