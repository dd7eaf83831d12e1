"""``sandcell changes show|approve|deny|apply RUN_ID``: the change set of a ``--workdir-from
--export-diff`` run, a decision bound to its exact hash, and the governed apply."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.errors import ConfigError
from sandcell.home import bulk_dir, data_dir
from sandcell.validation.terminal import neutralise

if TYPE_CHECKING:
    from sandcell.artifacts import ArtifactStore
    from sandcell.audit import AuditLog
    from sandcell.changes.approvals import ChangeApprovals
    from sandcell.changes.diff import Change
    from sandcell.changes.record import RecordedChanges


_TAIL_LINES = 15
"""Lines of the run's output ``changes show`` prints (the tests' report)."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("changes", help="the change set of a --workdir-from run; approve, apply")
    csub = c.add_subparsers(dest="changes_command", required=True)
    show = csub.add_parser("show", help="the diff, files touched, the run's outcome, findings")
    show.add_argument("run_id")
    show.add_argument("--json", action="store_true", help="the change set as JSON")
    for name, what in (("approve", "approve"), ("deny", "deny")):
        d = csub.add_parser(name, help=f"{what} applying this exact change set")
        d.add_argument("run_id")
        d.add_argument(
            "--sha256",
            metavar="HASH",
            help="the change-set hash you reviewed (from changes show); refused if it differs",
        )
        d.add_argument("--reason", default="", help="why (kept with the decision)")
    ap = csub.add_parser("apply", help="apply an approved change set to a directory")
    ap.add_argument("run_id")
    ap.add_argument("--to", required=True, type=Path, metavar="DIR", help="the target directory")
    ap.add_argument("--approval", metavar="ID", help="the approval to use (default: the latest)")
    ap.add_argument(
        "--profile",
        help="profile deciding whether applying needs approval (default: $SANDCELL_PROFILE, "
        'else strict; only a profile with approval = "never" applies without one)',
    )
    ap.add_argument("--json", action="store_true")


def _stores(args: argparse.Namespace) -> tuple[AuditLog, ArtifactStore, ChangeApprovals]:
    from sandcell.artifacts import ArtifactStore
    from sandcell.audit import AuditLog
    from sandcell.changes.approvals import FILENAME, ChangeApprovals

    home = args.home or data_dir()
    return (
        AuditLog(home / "audit.sqlite3"),
        ArtifactStore(bulk_dir(home) / "artifacts"),
        ChangeApprovals(home / FILENAME),
    )


def handle(args: argparse.Namespace) -> int:
    from sandcell.changes.record import load

    audit, store, approvals = _stores(args)
    try:
        rec = load(audit, store, args.run_id)
        cmd = args.changes_command
        if cmd == "show":
            return _show(rec, approvals, as_json=args.json)
        if cmd in ("approve", "deny"):
            return _decide(rec, approvals, args, approve=cmd == "approve")
        return _apply(rec, approvals, audit, args)
    except ConfigError as exc:
        # Messages name paths and link targets the sandboxed program chose.
        exc.args = (neutralise(str(exc)),)
        raise
    finally:
        audit.close()
        approvals.close()


def _show(rec: RecordedChanges, approvals: ChangeApprovals, *, as_json: bool) -> int:
    latest = approvals.latest(rec.run_id, rec.changeset_sha256)
    summary = {
        "run_id": rec.run_id,
        "outcome": rec.outcome,
        "exit_code": rec.record.get("exit_code"),
        "stdout": rec.record.get("stdout"),
        "stderr": rec.record.get("stderr"),
        "source": rec.source,
        "changeset_sha256": rec.changeset_sha256,
        "patch_sha256": rec.body.get("patch_sha256"),
        "changes": [c.to_dict() for c in rec.changes],
        "findings": [dict(f) for f in rec.findings],
        "approval": None if latest is None else latest.to_dict(),
    }
    if as_json:
        print(json.dumps(summary, indent=2))
        return 0
    # Everything below but the hashes was written by the sandboxed program (the patch, paths,
    # link targets, its output): a control character in it could recolour, move the cursor over
    # or hide lines of what the reviewer reads, on a terminal or in a pager, so each is shown as
    # a visible escape (src/sandcell/validation/terminal.py).
    lines = [f"run {rec.run_id}: outcome {rec.outcome} (exit {summary['exit_code']})"]
    lines.append(f"working directory: {rec.source}")
    for stream in ("stdout", "stderr"):
        text = str(rec.record.get(stream) or "")
        if text.strip():
            # Split at newlines only: a carriage return is shown, not taken as a line end.
            tail = text.rstrip("\n").split("\n")[-_TAIL_LINES:]
            lines.append(f"{stream} (last {len(tail)} lines):")
            lines += [f"  | {line}" for line in tail]
    lines.append(f"change set sha256: {rec.changeset_sha256}")
    lines.append(f"files touched ({len(rec.changes)}):")
    for c in rec.changes:
        note = "" if c.applicable else "  [NOT APPLICABLE: " + "; ".join(c.flags) + "]"
        src = f"{c.old_path} -> " if c.old_path else ""
        lines.append(f"  {c.action:<11} {src}{c.path}{_binary(c)}{note}")
    findings = rec.findings
    lines.append(f"checks on the diff: {len(findings)} finding(s)")
    for f in findings:
        lines.append(
            f"  {f.get('severity')} {f.get('check')} {f.get('what')} at {f.get('path')}:"
            f"{f.get('line')}: {f.get('detail')}"
        )
    status = "none" if latest is None else f"{latest.status} by {latest.decided_by} ({latest.id})"
    lines += [f"approval: {status}", ""]
    sys.stdout.write(neutralise("\n".join(lines) + "\n"))
    sys.stdout.write(neutralise(rec.patch.decode("utf-8", errors="replace")))
    return 0


def _binary(c: Change) -> str:
    if not c.binary:
        return ""
    if c.new is None or c.new.kind != "file":
        return " (binary)"
    return f" (binary, {c.new.size} bytes, sha256 {c.new.sha256})"


def _decide(
    rec: RecordedChanges, approvals: ChangeApprovals, args: argparse.Namespace, *, approve: bool
) -> int:
    from sandcell.policy.approvals import default_approver

    if args.sha256 and args.sha256 != rec.changeset_sha256:
        raise ConfigError(
            f"run {rec.run_id}'s change set is {rec.changeset_sha256}, not {args.sha256}: "
            "review it again with sandcell changes show"
        )
    if approve and not all(c.applicable for c in rec.changes):
        raise ConfigError(
            f"run {rec.run_id}'s change set has changes that can never be applied (see "
            "changes show); it cannot be approved"
        )
    decided = approvals.decide(
        rec.run_id, rec.changeset_sha256, approve=approve, by=default_approver(), reason=args.reason
    )
    print(
        f"{decided.status}: {decided.id} for change set {rec.changeset_sha256} of run {rec.run_id}"
    )
    return 0


def _apply(
    rec: RecordedChanges, approvals: ChangeApprovals, audit: AuditLog, args: argparse.Namespace
) -> int:
    from sandcell.changes.apply import apply
    from sandcell.policy.approvals import default_approver
    from sandcell.policy.profiles import DEFAULT_PROFILE, load_profile

    store_profile = args.profile or os.environ.get("SANDCELL_PROFILE") or DEFAULT_PROFILE
    profile = load_profile(store_profile)
    report = apply(
        rec,
        args.to.resolve(),
        approvals=approvals,
        audit=audit,
        needs_approval=profile.approval != "never",
        allow_binary=profile.workdir.binary_changes == "allow",
        profile_name=profile.name,
        applied_by=default_approver(),
        approval_id=args.approval,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "apply_id": report.apply_id,
                    "target": report.target,
                    "applied": list(report.applied),
                    "before_sha256": report.before_sha256,
                    "after_sha256": report.after_sha256,
                    "as_expected": report.as_expected,
                    "approval": dict(report.approval),
                },
                indent=2,
            )
        )
    else:
        print(
            f"applied {len(report.applied)} change(s) of run {rec.run_id} to {report.target} "
            f"(recorded as {report.apply_id}); state {report.before_sha256[:16]}… -> "
            f"{report.after_sha256[:16]}…"
            + ("" if report.as_expected else " (NOT the expected state: see the audit record)")
        )
    return 0 if report.as_expected else 1
