"""``sandcell doctor``: what this host can enforce, and how to fix what is missing."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser("doctor", help="report what this host can enforce")
    d.add_argument("--json", action="store_true")


def handle(args: argparse.Namespace) -> int:
    from sandcell.doctor import diagnose, render

    report = diagnose()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render(report))
    return 0 if report.can_run else 1
