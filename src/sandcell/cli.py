"""The command line: a thin layer over :class:`sandcell.executor.Executor`.

``main(argv) -> int`` parses, builds a request, runs it and maps the outcome to an exit status
(see :mod:`sandcell.status`). Nothing here decides anything about isolation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from sandcell import status
from sandcell.errors import AuditError, ConfigError, SandcellError
from sandcell.spec import (
    LANGUAGES,
    IsolationMode,
    Limits,
    MiB,
    RunRequest,
    input_from_path,
    result_to_dict,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sandcell",
        description="Run untrusted code in a disposable sandbox with hard limits and a record.",
    )
    p.add_argument(
        "--home",
        type=Path,
        help="data directory for records and artifacts "
        "(default: $SANDCELL_HOME or the user data directory)",
    )
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a program in a fresh sandbox")
    r.add_argument("file", nargs="?", help="program file, or - to read the program from stdin")
    r.add_argument("-c", dest="code", help="program text")
    r.add_argument("--lang", choices=LANGUAGES, default="python")
    r.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="PATH",
        help="file or directory visible read-only under /inputs and the working dir",
    )
    r.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="GLOB",
        help="files to export, relative to the working directory (repeatable)",
    )
    r.add_argument("--out", type=Path, help="copy exported artifacts into this directory")
    r.add_argument("--timeout", type=float, metavar="SECONDS", help="wall-time limit")
    r.add_argument("--cpu-time", type=int, metavar="SECONDS", help="CPU-time limit per process")
    r.add_argument("--memory", type=int, metavar="MB", help="memory limit of the sandbox")
    r.add_argument("--pids", type=int, metavar="N", help="processes alive at once")
    r.add_argument("--open-files", type=int, metavar="N", help="open files per process")
    r.add_argument("--file-size", type=int, metavar="MB", help="largest file a process may write")
    r.add_argument("--workspace", type=int, metavar="MB", help="size of the working directory")
    r.add_argument("--max-stdout", type=int, metavar="BYTES", help="stdout cap")
    r.add_argument("--max-stderr", type=int, metavar="BYTES", help="stderr cap")
    r.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment variable for the program (nothing else is passed)",
    )
    r.add_argument(
        "--stdin",
        dest="stdin_file",
        metavar="FILE",
        help="feed this file (or - for this command's stdin) to the program",
    )
    r.add_argument(
        "--isolation",
        choices=[m.value for m in IsolationMode],
        default=IsolationMode.STRICT.value,
        help="'rlimits' is a weaker mode for hosts without cgroups; it is recorded",
    )
    r.add_argument("--no-landlock", action="store_true", help="do not apply Landlock")
    r.add_argument("--json", action="store_true", help="print one JSON object with the result")

    d = sub.add_parser("doctor", help="report what this host can enforce")
    d.add_argument("--json", action="store_true")

    a = sub.add_parser("audit", help="the run records")
    asub = a.add_subparsers(dest="audit_command", required=True)
    al = asub.add_parser("list", help="recent runs, newest first")
    al.add_argument("--limit", type=int, default=20)
    al.add_argument("--json", action="store_true")
    ash = asub.add_parser("show", help="one run's record")
    ash.add_argument("run_id")
    ash.add_argument("--json", action="store_true")
    asub.add_parser("verify", help="check the hash chain for changed, deleted or reordered records")
    return p


def _read_code(args: argparse.Namespace) -> str:
    if args.code is not None and args.file is not None:
        raise ConfigError("give the program either as FILE or with -c, not both")
    if args.code is not None:
        return str(args.code)
    if args.file is None:
        raise ConfigError("no program given: pass FILE, - (stdin) or -c CODE")
    if args.file == "-":
        return sys.stdin.read()
    path = Path(args.file)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"program file {args.file!r} does not exist") from None
    except UnicodeDecodeError:
        raise ConfigError(f"program file {args.file!r} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"cannot read program file {args.file!r}: {exc.strerror}") from None


def _request(args: argparse.Namespace) -> RunRequest:
    code = _read_code(args)
    limits = Limits().with_(
        wall_time_s=args.timeout,
        cpu_time_s=args.cpu_time,
        memory_bytes=args.memory * MiB if args.memory is not None else None,
        max_pids=args.pids,
        max_open_files=args.open_files,
        max_file_bytes=args.file_size * MiB if args.file_size is not None else None,
        workspace_bytes=args.workspace * MiB if args.workspace is not None else None,
        stdout_bytes=args.max_stdout,
        stderr_bytes=args.max_stderr,
    )
    env: dict[str, str] = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--env {item!r} must look like NAME=VALUE")
        env[name] = value
    stdin = b""
    if args.stdin_file == "-":
        if args.file == "-":
            raise ConfigError("stdin already carries the program; use --stdin FILE for its input")
        stdin = sys.stdin.buffer.read()
    elif args.stdin_file:
        try:
            stdin = Path(args.stdin_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read --stdin file {args.stdin_file!r}: {exc}") from None
    return RunRequest(
        code=code,
        language=args.lang,
        inputs=tuple(input_from_path(p) for p in args.input),
        exports=tuple(args.export),
        limits=limits,
        stdin=stdin,
        env=env,
        mode=IsolationMode(args.isolation),
        landlock=False if args.no_landlock else None,
    )


def _cmd_run(args: argparse.Namespace) -> int:
    from sandcell.executor import Executor

    request = _request(args)
    if args.out is not None and not request.exports:
        raise ConfigError("--out needs at least one --export GLOB to say what to copy out")
    with Executor(home=args.home) as ex:
        result = ex.run(request)
        copied: list[Path] = []
        if args.out is not None and result.artifacts:
            copied = ex.store.copy_out(result.artifacts, args.out)
    if args.json:
        body = result_to_dict(result)
        if args.out is not None:
            body["copied_to"] = [str(p) for p in copied]
        print(json.dumps(body, ensure_ascii=False))
    else:
        sys.stdout.write(result.stdout)
        sys.stdout.flush()
        sys.stderr.write(result.stderr)
        if result.outcome.value not in ("ok", "error"):
            print(
                f"sandcell: {result.outcome.value}: {result.reason} (run {result.run_id})",
                file=sys.stderr,
            )
        for rej in result.rejected_exports:
            print(f"sandcell: not exported: {rej.path}: {rej.reason}", file=sys.stderr)
        for path in copied:
            print(f"sandcell: exported {path}", file=sys.stderr)
    return status.exit_code_for(result)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from sandcell.doctor import diagnose, render

    report = diagnose()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render(report))
    return 0 if report.can_run else 1


def _cmd_audit(args: argparse.Namespace) -> int:
    from sandcell.audit import AuditLog
    from sandcell.executor import data_dir

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
                        f"{s['run_id']}  {s['started_at']}  {s['language']:<6} "
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
            if args.json:
                print(
                    json.dumps(
                        {
                            "seq": entry.seq,
                            "hash": entry.hash,
                            "prev_hash": entry.prev_hash,
                            "record": entry.record,
                        },
                        ensure_ascii=False,
                    )
                )
            else:
                print(json.dumps(entry.record, indent=2, ensure_ascii=False))
                print(f"# seq {entry.seq}, hash {entry.hash}")
            return 0
        report = log.verify()
        if report.ok:
            print(f"ok: {report.count} records, hash chain intact")
            return 0
        for p in report.problems:
            print(f"{p.kind}: seq {p.seq} run {p.run_id}: {p.detail}")
        return 1


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``sandcell``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _cmd_run(args)
        if args.command == "doctor":
            return _cmd_doctor(args)
        return _cmd_audit(args)
    except AuditError as exc:
        print(f"sandcell: audit: {exc}", file=sys.stderr)
        return status.EXIT_CONFIG
    except SandcellError as exc:
        print(f"sandcell: {exc}", file=sys.stderr)
        return status.exit_code_for_error(exc)
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    entry()
