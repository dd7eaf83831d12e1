"""``sandcell audit``: list, show and verify the run records."""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from collections.abc import Mapping
from typing import Any

from sandcell.cli.remote import add_service_option, find_service


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a = sub.add_parser("audit", help="the run records")
    asub = a.add_subparsers(dest="audit_command", required=True)
    al = asub.add_parser("list", help="recent runs, newest first")
    al.add_argument("--limit", type=int, default=20)
    al.add_argument("--json", action="store_true")
    add_service_option(al)
    ash = asub.add_parser(
        "show", help="one run's record, then its connection attempts and tool calls, one a line"
    )
    ash.add_argument("run_id")
    ash.add_argument("--json", action="store_true")
    add_service_option(ash)
    av = asub.add_parser(
        "verify", help="check the hash chain for changed, deleted or reordered records"
    )
    add_service_option(av)
    from sandcell.cli.audit_replay import add_parsers

    add_parsers(asub)


def handle(args: argparse.Namespace) -> int:
    if args.audit_command in ("replay", "compare"):
        # They decide themselves where they run (a replay goes to a reachable service).
        from sandcell.cli import audit_replay
        from sandcell.home import data_dir

        run = (
            audit_replay.handle_replay
            if args.audit_command == "replay"
            else audit_replay.handle_compare
        )
        return run(args, args.home or data_dir())
    target = find_service(args)
    if target is not None:
        from sandcell.cli.remote_records import audit_remote

        return audit_remote(args, target)
    from sandcell.audit import AuditLog
    from sandcell.home import data_dir

    home = args.home or data_dir()
    with AuditLog(home / "audit.sqlite3") as log:
        if args.audit_command == "list":
            entries = log.list(limit=args.limit)
            if args.json:
                print(json.dumps([_summary(e.record) for e in entries], ensure_ascii=False))
            else:
                for e in entries:
                    s = _summary(e.record)
                    print(
                        # An entry that is not a run (a change set applied) has no language.
                        f"{s['run_id']}  {s['started_at']}  {s['language'] or '-':<6} "
                        f"{s['outcome']:<13} {s['wall_ms']} ms"
                    )
            return 0
        if args.audit_command == "show":
            entry = log.get(args.run_id)
            if entry is None:
                print(
                    f"sandcell: no run {args.run_id!r} in {home / 'audit.sqlite3'}", file=sys.stderr
                )
                return 1
            print_entry(
                seq=entry.seq,
                hash_=entry.hash,
                prev_hash=entry.prev_hash,
                record=entry.record,
                as_json=args.json,
            )
            return 0
        report = log.verify()
        if report.ok:
            print(f"ok: {report.count} records, hash chain intact")
            return 0
        for p in report.problems:
            print(f"{p.kind}: seq {p.seq} run {p.run_id}: {p.detail}")
        return 1


def print_entry(
    *, seq: int, hash_: str, prev_hash: str, record: Mapping[str, Any], as_json: bool
) -> None:
    """Print one record as ``audit show`` does (shared with the service's answer)."""
    from sandcell.cli.boundary_line import boundary_line
    from sandcell.cli.outside_lines import connection_rows, tool_call_rows

    if as_json:
        body = {"seq": seq, "hash": hash_, "prev_hash": prev_hash, "record": record}
        print(json.dumps(body, ensure_ascii=False))
        return
    print(_terminal_json(record))
    print(f"# seq {seq}, hash {hash_}")
    print(f"# boundary: {boundary_line(record)}")
    if record.get("replay_of"):
        replay = record.get("replay")
        exact = isinstance(replay, Mapping) and replay.get("exact")
        print(
            f"# replay of {record.get('replay_of')}"
            + ("" if exact else " (not exact, see replay.notes)")
        )
    for line in connection_rows(record.get("network")):
        print(f"# {line}")
    for line in tool_call_rows(record.get("tools")):
        print(f"# {line}")


def _terminal_json(record: object) -> str:
    """The record as indented JSON that cannot drive a terminal: JSON escapes the C0 controls
    itself, and every other control, format (bidi overrides, zero-width) or separator character
    from the sandbox becomes a ``\\uXXXX`` escape, so the text is still the same JSON."""
    text = json.dumps(record, indent=2, ensure_ascii=False)
    return "".join(
        json.dumps(ch)[1:-1]
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp") and ch != "\n"
        else ch
        for ch in text
    )


def _summary(record: object) -> dict[str, object]:
    r = record if isinstance(record, dict) else {}
    usage = r.get("usage") if isinstance(r.get("usage"), dict) else {}
    assert isinstance(usage, dict)
    return {
        "run_id": r.get("run_id"),
        "started_at": r.get("started_at"),
        "language": r.get("language"),
        "outcome": r.get("outcome"),
        "wall_ms": usage.get("wall_ms"),
    }
