"""``sandcell approvals list|show``, ``sandcell approve ID`` and ``sandcell deny ID``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sandcell.cli.options import add_backend_option, check_out_dir
from sandcell.cli.run import report
from sandcell.executor import Executor, data_dir
from sandcell.policy.approvals import ApprovalStore, render_list, render_ticket


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a = sub.add_parser("approvals", help="runs waiting for a person")
    asub = a.add_subparsers(dest="approvals_command", required=True)
    al = asub.add_parser("list", help="waiting runs (newest first)")
    al.add_argument("--all", action="store_true", help="every status, not only pending")
    al.add_argument("--json", action="store_true")
    ash = asub.add_parser("show", help="one waiting run: its code, findings and profile")
    ash.add_argument("id", help="the approval id, or a unique prefix of at least 6 characters")
    ash.add_argument("--json", action="store_true")

    ap = sub.add_parser("approve", help="approve a waiting run, run it and report like `run`")
    ap.add_argument("id")
    ap.add_argument("--reason", default="", help="why (recorded)")
    ap.add_argument("--out", type=Path, help="copy the run's exported artifacts here")
    # The run happens on the rung it was submitted for; naming another one is refused.
    add_backend_option(ap)
    ap.add_argument("--json", action="store_true")

    dn = sub.add_parser("deny", help="deny a waiting run")
    dn.add_argument("id")
    dn.add_argument("--reason", required=True, help="why (recorded)")
    dn.add_argument("--json", action="store_true")


def handle_approvals(args: argparse.Namespace) -> int:
    home = args.home or data_dir()
    with ApprovalStore(home / "approvals.sqlite3") as store:
        if args.approvals_command == "list":
            tickets = store.list(None if args.all else "pending")
            if args.json:
                print(json.dumps([_summary(t.to_dict()) for t in tickets], ensure_ascii=False))
            else:
                print(render_list(tickets))
            return 0
        ticket = store.get(args.id)
        if args.json:
            print(json.dumps(ticket.to_dict(), ensure_ascii=False))
        else:
            print(render_ticket(ticket))
        return 0


def _summary(d: dict[str, object]) -> dict[str, object]:
    # The list shows what to decide on; env values stay out of it (`show` has the whole ticket).
    request = d.get("request")
    return {
        **{k: v for k, v in d.items() if k != "request"},
        "language": request.get("language") if isinstance(request, dict) else None,
    }


def handle_approve(args: argparse.Namespace) -> int:
    check_out_dir(args.out)
    with Executor(home=args.home, backend=args.backend) as ex:
        result = ex.run_approved(args.id, reason=args.reason)
        copied = (
            ex.store.copy_out(result.artifacts, args.out) if args.out and result.artifacts else []
        )
    return report(result, as_json=args.json, copied=copied, out=args.out)


def handle_deny(args: argparse.Namespace) -> int:
    with Executor(home=args.home) as ex:
        result = ex.deny_approval(args.id, reason=args.reason)
    if args.json:
        from sandcell.spec import result_to_dict

        print(json.dumps(result_to_dict(result), ensure_ascii=False))
    else:
        print(f"denied: {result.reason} (recorded as run {result.run_id})")
    return 0
