"""``sandcell audit replay RUN_ID`` and ``sandcell audit compare RUN_A RUN_B``.

Exit status of ``replay``: 0 when the replay ran and every compared field matched, 1 when
something differed, 125 while the replay waits for approval, 123 when it was denied, 78 when the
run cannot be replayed as recorded (the message says why and what to do). ``compare``: 0 when the
two records match, 1 when they differ.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sandcell.backends.registry import LADDER
from sandcell.cli.remote import add_service_option, find_service
from sandcell.home import bulk_dir


def add_parsers(asub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ar = asub.add_parser(
        "replay",
        help="run a recorded run again as recorded (code, limits, profile, inputs, backend) "
        "and compare outcome, exit status, output and artifacts",
    )
    ar.add_argument("run_id")
    ar.add_argument(
        "--use-current-profile",
        action="store_true",
        help="replay under the profile as it is now when it changed since the run (recorded)",
    )
    ar.add_argument(
        "--backend",
        choices=LADDER,
        default=None,
        help="replay on this backend instead of the recorded one (recorded as an override)",
    )
    ar.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a value for an environment variable the run had (values are never recorded)",
    )
    ar.add_argument("--json", action="store_true")
    add_service_option(ar)
    ac = asub.add_parser("compare", help="compare two run records (e.g. a run and its replay)")
    ac.add_argument("original")
    ac.add_argument("other")
    ac.add_argument("--json", action="store_true")


def handle_replay(args: argparse.Namespace, home: Path) -> int:
    from sandcell.cli.run import parse_env

    env = parse_env(args)
    target = find_service(args)
    if target is not None:
        from sandcell.cli.remote import Remote

        body = {
            "use_current_profile": args.use_current_profile,
            "backend": args.backend,
            "env": env,
        }
        answer = Remote(target).json("POST", f"/v1/runs/{args.run_id}/replay", body=body)
        outcome = str((answer.get("result") or {}).get("outcome"))
        return _show(answer["replay"], outcome, as_json=args.json)
    return _replay_here(args, home, env)


def _show(report: dict[str, object], outcome: str, *, as_json: bool) -> int:
    """Print a report (its JSON form) and return the exit status (see the module docstring)."""
    from sandcell import status
    from sandcell.replay.render import report_lines

    if as_json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        print("\n".join(report_lines(report)))
    if outcome == "awaiting_approval":
        return status.EXIT_AWAITING_APPROVAL
    if report.get("pending") is not None:
        return status.EXIT_DENIED
    return 0 if report.get("matched") else 1


def _replay_here(args: argparse.Namespace, home: Path, env: dict[str, str]) -> int:
    from sandcell.artifacts.store import ArtifactStore
    from sandcell.audit import AuditLog
    from sandcell.errors import IsolationUnavailable
    from sandcell.executor import Executor
    from sandcell.packages.wheel_cache import WheelCache
    from sandcell.replay import ReplayRefused, build_plan, load_original

    # Planned first, so that a refusal (changed profile or input, unknown run) comes before any
    # sandbox is started, and the executor is built for the run's own profile and backend.
    with AuditLog(home / "audit.sqlite3") as log:
        original = load_original(log, args.run_id)
    plan = build_plan(
        original,
        store=ArtifactStore(bulk_dir(home) / "artifacts"),
        wheels=WheelCache(home / "wheels"),
        use_current_profile=args.use_current_profile,
        backend=args.backend,
        env=env,
    )
    try:
        ex = Executor(home=home, backend=plan.backend, profile=plan.profile)
    except IsolationUnavailable as exc:
        raise ReplayRefused(
            f"run {plan.run_id} is replayed on backend {plan.backend!r}, unavailable here: "
            f"{exc}; or replay it on another backend with --backend NAME (the replay's record "
            "says so)"
        ) from None
    with ex:
        report = ex.replay(
            str(original["run_id"]),
            use_current_profile=args.use_current_profile,
            backend=args.backend,
            env=env,
        )
    return _show(report.to_dict(), report.result.outcome.value, as_json=args.json)


def handle_compare(args: argparse.Namespace, home: Path) -> int:
    from sandcell.audit import AuditLog
    from sandcell.replay import compare_records, load_original
    from sandcell.replay.render import comparison_lines

    with AuditLog(home / "audit.sqlite3") as log:
        first = load_original(log, args.original)
        second = load_original(log, args.other)
    comparison = compare_records(first, second)
    if args.json:
        body = {"original": first.get("run_id"), "other": second.get("run_id")}
        print(json.dumps({**body, **comparison.to_dict()}, ensure_ascii=False))
    else:
        print(f"{first.get('run_id')} vs {second.get('run_id')}")
        print("\n".join(comparison_lines(comparison.to_dict())))
    return 0 if comparison.matched else 1
