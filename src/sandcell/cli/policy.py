"""``sandcell policy list|show`` and ``sandcell check``: profiles, and checks without a run."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from sandcell import status
from sandcell.cli.options import add_lang_option
from sandcell.cli.run import read_code
from sandcell.executor import data_dir
from sandcell.packages import WheelCache
from sandcell.policy.gate import admit
from sandcell.policy.profiles import (
    DEFAULT_PROFILE,
    list_profiles,
    load_profile,
    render_list,
    render_matrix,
)
from sandcell.spec import RunRequest
from sandcell.validation import neutralise

_VERDICT_EXIT = {"allow": 0, "deny": status.EXIT_DENIED, "approve": status.EXIT_AWAITING_APPROVAL}


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("policy", help="the policy profiles")
    psub = p.add_subparsers(dest="policy_command", required=True)
    pl = psub.add_parser("list", help="built-in profiles and those in the profile directory")
    pl.add_argument("--profile-dir", type=Path, help="default: $SANDCELL_PROFILES")
    pl.add_argument("--json", action="store_true")
    ps = psub.add_parser("show", help="one profile's permission matrix")
    ps.add_argument("name", help="a built-in name, a profile-directory name, or a TOML path")
    ps.add_argument("--profile-dir", type=Path)
    ps.add_argument("--json", action="store_true")

    c = sub.add_parser(
        "check", help="the findings and the decision for a program, without running it"
    )
    c.add_argument("file", nargs="?", help="program file, or - for stdin")
    c.add_argument("-c", dest="code", help="program text")
    add_lang_option(c)
    c.add_argument(
        "--profile",
        default=None,
        help="policy profile (default: $SANDCELL_PROFILE, else strict, as for run)",
    )
    c.add_argument("--json", action="store_true")


def handle_policy(args: argparse.Namespace) -> int:
    if args.policy_command == "list":
        summaries = list_profiles(args.profile_dir)
        if args.json:
            print(json.dumps([asdict(s) for s in summaries]))
        else:
            print(render_list(summaries))
        return 0
    profile = load_profile(args.name, profile_dir=args.profile_dir)
    if args.json:
        print(json.dumps(profile.to_record()))
    else:
        print(render_matrix(profile))
    return 0


def handle_check(args: argparse.Namespace) -> int:
    # The same default profile and the same gate as `run`, so check says what run would decide.
    profile = load_profile(args.profile or os.environ.get("SANDCELL_PROFILE") or DEFAULT_PROFILE)
    request = RunRequest(code=read_code(args), language=args.lang)
    home = args.home or data_dir()
    decision = admit(request, profile, cache=WheelCache(home / "wheels")).decision
    if args.json:
        print(
            json.dumps(
                {
                    "profile": profile.to_record(),
                    "verdict": decision.verdict,
                    "reason": decision.reason,
                    "findings": [f.to_dict() for f in decision.findings],
                },
                ensure_ascii=False,
            )
        )
    else:
        for f in decision.findings:
            print(neutralise(f"{f.line}:{f.column}: {f.rule_id} [{f.severity}] {f.message}"))
            if f.snippet:
                print("    " + neutralise(f.snippet))
        print(
            f"decision: {decision.verdict} ({decision.reason}) under profile {profile.name!r}",
            file=sys.stderr if decision.findings else sys.stdout,
        )
    return _VERDICT_EXIT[decision.verdict]
