"""``sandcell approvals list|show``, ``sandcell approve ID`` and ``sandcell deny ID``.

Two kinds of ticket wait here: runs the policy held for approval (approving one runs it) and
governed tool calls a running program is waiting on (ids starting with ``t``; approving one lets
the call go ahead in that run). Both are listed together and decided with the same commands.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.cli.options import add_backend_option, check_out_dir
from sandcell.cli.remote import add_service_option, find_service
from sandcell.cli.run import report, terminal_approver, terminal_can_answer
from sandcell.errors import ConfigError
from sandcell.home import data_dir

if TYPE_CHECKING:
    from sandcell.policy.approvals import Ticket, ToolTicket

# The stores, the executor and the renderers are imported where they are used: through a
# service none of them is needed.


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a = sub.add_parser("approvals", help="runs and tool calls waiting for a person")
    asub = a.add_subparsers(dest="approvals_command", required=True)
    al = asub.add_parser("list", help="waiting runs and tool calls (newest first)")
    al.add_argument("--all", action="store_true", help="every status, not only pending")
    al.add_argument("--json", action="store_true")
    add_service_option(al)
    ash = asub.add_parser(
        "show", help="one waiting run (its code, findings and profile) or tool call"
    )
    ash.add_argument("id", help="the approval id, or a unique prefix of at least 6 characters")
    ash.add_argument("--json", action="store_true")
    add_service_option(ash)

    ap = sub.add_parser(
        "approve",
        help="approve a waiting run (it runs, reported like `run`) or a waiting tool call",
    )
    ap.add_argument("id")
    ap.add_argument("--reason", default="", help="why (recorded)")
    ap.add_argument("--out", type=Path, help="copy the run's exported artifacts here")
    # The run happens on the rung it was submitted for; naming another one is refused.
    add_backend_option(ap)
    ap.add_argument("--json", action="store_true")
    add_service_option(ap)

    dn = sub.add_parser("deny", help="deny a waiting run or tool call")
    dn.add_argument("id")
    dn.add_argument("--reason", required=True, help="why (recorded)")
    dn.add_argument("--json", action="store_true")
    add_service_option(dn)


def handle_approvals(args: argparse.Namespace) -> int:
    target = find_service(args)
    if target is not None:
        from sandcell.cli.remote_records import approvals_remote

        return approvals_remote(args, target)
    from sandcell.policy.approvals import ApprovalStore, render_ticket
    from sandcell.policy.tool_tickets import is_tool_ticket_id, render_tool_ticket

    home = args.home or data_dir()
    with ApprovalStore(home / "approvals.sqlite3") as store:
        if args.approvals_command == "list":
            status = None if args.all else "pending"
            tickets = store.list(status)
            calls = store.list_tools(status)
            if args.json:
                listed = [_summary(t.to_dict()) for t in tickets] + [c.to_dict() for c in calls]
                print(json.dumps(_newest_first(listed), ensure_ascii=False))
            else:
                print(_render_both(tickets, calls))
            return 0
        if is_tool_ticket_id(args.id):
            call = store.get_tool(args.id)
            if args.json:
                print(json.dumps(call.to_dict(), ensure_ascii=False))
            else:
                print(render_tool_ticket(call))
            return 0
        ticket = store.get(args.id)
        if args.json:
            print(json.dumps(ticket.to_dict(), ensure_ascii=False))
        else:
            print(render_ticket(ticket))
        return 0


def _newest_first(listed: list[dict[str, object]]) -> list[dict[str, object]]:
    return sorted(listed, key=lambda d: str(d.get("created_at", "")), reverse=True)


def _render_both(tickets: list[Ticket], calls: list[ToolTicket]) -> str:
    from sandcell.policy.approvals import render_list
    from sandcell.policy.tool_tickets import render_tool_list_lines

    if not calls:
        return render_list(tickets)
    run_lines = render_list(tickets).splitlines() if tickets else []
    # Both kinds' lines start with id then created_at: merged newest first.
    dated = [(t.created_at, line) for t, line in zip(tickets, run_lines, strict=True)]
    dated += list(zip((c.created_at for c in calls), render_tool_list_lines(calls), strict=True))
    return "\n".join(line for _, line in sorted(dated, reverse=True)) + "\n"


def _summary(d: dict[str, object]) -> dict[str, object]:
    # The list shows what to decide on; env values stay out of it (`show` has the whole ticket).
    request = d.get("request")
    return {
        "kind": "run",
        **{k: v for k, v in d.items() if k != "request"},
        "language": request.get("language") if isinstance(request, dict) else None,
    }


def handle_approve(args: argparse.Namespace) -> int:
    check_out_dir(args.out)
    target = find_service(args)
    if target is not None:
        from sandcell.cli.remote_records import approve_remote

        return approve_remote(args, target)
    from sandcell.executor import Executor
    from sandcell.policy.tool_tickets import is_tool_ticket_id

    if is_tool_ticket_id(args.id):
        return _decide_tool(args, approve=True)
    check_out_dir(args.out)
    # The approved run's own tool calls that need approval: asked here when a person is.
    approver = terminal_approver() if terminal_can_answer(stdin_used=False) else None
    with Executor(home=args.home, backend=args.backend, tool_approver=approver) as ex:
        result = ex.run_approved(args.id, reason=args.reason)
        copied = (
            ex.store.copy_out(result.artifacts, args.out) if args.out and result.artifacts else []
        )
    return report(result, as_json=args.json, copied=copied, out=args.out)


def handle_deny(args: argparse.Namespace) -> int:
    target = find_service(args)
    if target is not None:
        from sandcell.cli.remote_records import deny_remote

        return deny_remote(args, target)
    from sandcell.executor import Executor
    from sandcell.policy.tool_tickets import is_tool_ticket_id

    if is_tool_ticket_id(args.id):
        return _decide_tool(args, approve=False)
    with Executor(home=args.home) as ex:
        result = ex.deny_approval(args.id, reason=args.reason)
    if args.json:
        from sandcell.spec import result_to_dict

        print(json.dumps(result_to_dict(result), ensure_ascii=False))
    else:
        print(f"denied: {result.reason} (recorded as run {result.run_id})")
    return 0


def _decide_tool(args: argparse.Namespace, *, approve: bool) -> int:
    """Approve or deny a tool call; the run waiting on it goes on (or gets the refusal)."""
    if approve and (args.out is not None or args.backend is not None):
        raise ConfigError(
            f"{args.id} is a tool call, not a run: --out and --backend do not apply to it"
        )
    from sandcell.policy.approvals import ApprovalStore, default_approver
    from sandcell.validation import neutralise

    home = args.home or data_dir()
    with ApprovalStore(home / "approvals.sqlite3") as store:
        if approve:
            call = store.approve_tool(args.id, by=default_approver(), reason=args.reason)
        else:
            call = store.deny_tool(args.id, by=default_approver(), reason=args.reason)
    if args.json:
        print(json.dumps(call.to_dict(), ensure_ascii=False))
    else:
        run = f" of run {call.run_id}" if call.run_id else ""
        then = "goes ahead" if approve else "is refused"
        print(neutralise(f"{call.status}: tool call {call.id} ({call.tool}{run}); the call {then}"))
    return 0
