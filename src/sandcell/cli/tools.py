"""``sandcell tools list|call``: a profile's governed tools, for people, through the gateway.

The same checks as a run's calls (:meth:`ToolGateway.execute`), with the person at the terminal
as the approver: a call that needs approval asks on the terminal, and is refused when stdin is
not one. Credentials are read from this shell's environment, as a run's gateway reads the host's.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path

from sandcell import status
from sandcell.errors import ConfigError
from sandcell.policy.profiles import DEFAULT_PROFILE, load_profile
from sandcell.tools.approval import ApprovalDecision, ApprovalRequest, Approver
from sandcell.tools.protocol import Request, encode
from sandcell.validation import neutralise


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("tools", help="list or call a profile's governed tools")
    tsub = p.add_subparsers(dest="tools_command", required=True)
    for name, text in (("list", "the operations a profile allows"), ("call", "call one")):
        t = tsub.add_parser(name, help=text)
        t.add_argument(
            "--profile", default=None, help="default: $SANDCELL_PROFILE, else strict, as for run"
        )
        t.add_argument("--profile-dir", type=Path, help="default: $SANDCELL_PROFILES")
        if name == "call":
            t.add_argument("name", help="tool.operation, as `sandcell tools list` shows it")
            t.add_argument("--json", default="{}", metavar="ARGS", help="arguments, an object")
        else:
            t.add_argument("--json", action="store_true", help="print JSON")


def handle(args: argparse.Namespace) -> int:
    from sandcell.tools.gateway import ToolGateway

    name = args.profile or os.environ.get("SANDCELL_PROFILE") or DEFAULT_PROFILE
    profile = load_profile(name, profile_dir=args.profile_dir)
    if args.tools_command == "call":
        try:
            call_args = json.loads(args.json)
        except ValueError as exc:
            raise ConfigError(f"--json is not JSON: {exc}") from None
        if not isinstance(call_args, dict):
            raise ConfigError('--json must be a JSON object, like \'{"query": "refund"}\'')
        request = Request(op="call", tool=args.name, args=call_args)
    else:
        request = Request(op="list")
    gateway = ToolGateway(profile=profile.name, tools=profile.tools, approver=_terminal_approver())
    try:
        answer = gateway.execute(request, request_bytes=len(encode(request.args)))
    finally:
        gateway.stop()
    if not answer["ok"]:
        print(f"sandcell: tools: {neutralise(str(answer['error']))}", file=sys.stderr)
        decision = gateway.report.records[-1].decision
        return status.EXIT_DENIED if decision in ("refused", "denied") else 1
    result = answer["result"]
    if request.op == "list" and not args.json:
        entries = result if isinstance(result, list) else []
        if not entries:
            print(f"profile {profile.name} allows no tools")
        for entry in entries:
            line = f"{entry['name']}  [approval: {entry.get('approval', '?')}]"
            print(neutralise(line))
            text = entry.get("description") or entry.get("error") or ""
            if text:
                print(neutralise(f"    {text}"))
        return 0
    print(neutralise(json.dumps(result, indent=1, ensure_ascii=False)))
    return 0


def _terminal_approver() -> Approver:
    def approve(request: ApprovalRequest) -> ApprovalDecision | None:
        if not sys.stdin.isatty():
            return None
        shown = neutralise(json.dumps(request.args, ensure_ascii=False))
        print(
            f"{request.tool} needs approval; arguments (sha256 {request.args_sha256}): {shown}",
            file=sys.stderr,
        )
        # The prompt goes to stderr: stdout carries only the result, for pipes.
        print("approve? [y/N] ", end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline().strip().lower()
        return ApprovalDecision(
            approved=answer in ("y", "yes"),
            approver=f"cli:{getpass.getuser()}",
            args_sha256=request.args_sha256,
        )

    return approve
