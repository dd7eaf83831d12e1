"""``sandcell run``: build a request from the command line, run it, report it."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell import status
from sandcell.cli._own_lines import OwnLines
from sandcell.cli.options import add_backend_option, add_lang_option, check_out_dir
from sandcell.cli.remote import add_service_option, find_service
from sandcell.errors import ConfigError
from sandcell.spec import IsolationMode, MiB, RunRequest, RunResult, input_from_path

if TYPE_CHECKING:
    from sandcell.executor import Executor
    from sandcell.policy.profiles import Profile
    from sandcell.tools.approval import Approver

# The executor, the validation stack and the renderers are imported where they are used: a run
# through the service never needs them, and `sandcell run` should start fast either way.


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    r = sub.add_parser("run", help="run a program in a fresh sandbox")
    r.add_argument("file", nargs="?", help="program file, or - to read the program from stdin")
    r.add_argument("-c", dest="code", help="program text")
    add_lang_option(r)
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
    r.add_argument(
        "--out",
        type=Path,
        help="copy exported artifacts (and, with --display, figures) into this directory",
    )
    r.add_argument(
        "--display",
        action="store_true",
        help="python: show the last expression's value, tables and matplotlib figures as a "
        "notebook would; figures are saved under --out (default ./sandcell-outputs/RUN_ID)",
    )
    r.add_argument(
        "--runtime",
        metavar="NAME",
        help="the runtime to run in (sandcell runtime list; default: the profile's)",
    )
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
    add_backend_option(r)
    r.add_argument(
        "--start",
        choices=("cold", "template", "pool"),
        default=None,
        help="how a python run's sandbox starts: cold (default), forked from a template with "
        "numpy and pandas imported, or taken from a warm pool of such sandboxes; the record "
        "says which (and why a run started cold anyway)",
    )
    r.add_argument(
        "--profile",
        help="policy profile: a built-in name, a name from the profile directory, or a TOML path "
        "(default: $SANDCELL_PROFILE, else strict; see sandcell policy list)",
    )
    r.add_argument("--schema", metavar="FILE", help="JSON Schema the declared result must meet")
    r.add_argument(
        "--invariant",
        action="append",
        default=[],
        metavar="EXPR",
        help="a condition on the declared result, e.g. '0 <= result[\"rate\"] <= 100'",
    )
    r.add_argument(
        "--result-file",
        metavar="NAME",
        help="read the declared result from this file in the working directory (default: the "
        "last JSON line of stdout)",
    )
    r.add_argument(
        "--workdir-from",
        metavar="DIR",
        type=Path,
        help="a copy of DIR (checked, .git included) is the program's writable working "
        "directory; nothing is written back to DIR (see docs/changes.md)",
    )
    r.add_argument(
        "--export-diff",
        action="store_true",
        help="with --workdir-from: record what the program changed as changes.patch and "
        "changes.json (sandcell changes show RUN_ID)",
    )
    r.add_argument("--json", action="store_true", help="print one JSON object with the result")
    add_service_option(r)


def read_code(args: argparse.Namespace) -> str:
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


def requested_limits(args: argparse.Namespace) -> dict[str, float | None]:
    """The limits given on the command line, in :class:`Limits` field names (None: not given).

    Raises:
        ConfigError: naming the option, for a value that is not a positive finite number.
    """
    for option, value in (
        ("--timeout", args.timeout),
        ("--cpu-time", args.cpu_time),
        ("--memory", args.memory),
        ("--pids", args.pids),
        ("--open-files", args.open_files),
        ("--file-size", args.file_size),
        ("--workspace", args.workspace),
        ("--max-stdout", args.max_stdout),
        ("--max-stderr", args.max_stderr),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{option} must be a positive number, got {value:g}")
    mib = {"memory": args.memory, "file_size": args.file_size, "workspace": args.workspace}
    return {
        "wall_time_s": args.timeout,
        "cpu_time_s": args.cpu_time,
        "memory_bytes": mib["memory"] * MiB if mib["memory"] is not None else None,
        "max_pids": args.pids,
        "max_open_files": args.open_files,
        "max_file_bytes": mib["file_size"] * MiB if mib["file_size"] is not None else None,
        "workspace_bytes": mib["workspace"] * MiB if mib["workspace"] is not None else None,
        "stdout_bytes": args.max_stdout,
        "stderr_bytes": args.max_stderr,
    }


def parse_env(args: argparse.Namespace) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--env {item!r} must look like NAME=VALUE")
        env[name] = value
    return env


def read_stdin(args: argparse.Namespace) -> bytes:
    """What ``--stdin`` gives the program (nothing without it)."""
    if args.stdin_file == "-":
        if args.file == "-":
            raise ConfigError("stdin already carries the program; use --stdin FILE for its input")
        return sys.stdin.buffer.read()
    if args.stdin_file:
        try:
            return Path(args.stdin_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read --stdin file {args.stdin_file!r}: {exc}") from None
    return b""


def check_display(args: argparse.Namespace) -> None:
    if args.display and args.lang != "python":
        raise ConfigError("--display works for python programs only; drop it or use --lang python")


def build_request(args: argparse.Namespace, profile: Profile) -> RunRequest:
    code = read_code(args)
    check_display(args)
    # Refused here, not clamped, when above the profile's ceiling.
    limits = profile.limits_for(requested_limits(args))
    return RunRequest(
        code=code,
        language=args.lang,
        inputs=tuple(input_from_path(p) for p in args.input),
        exports=tuple(args.export),
        limits=limits,
        stdin=read_stdin(args),
        env=parse_env(args),
        mode=IsolationMode(args.isolation),
        landlock=False if args.no_landlock else None,
        display=args.display,
        runtime=args.runtime,
    )


def handle(args: argparse.Namespace) -> int:
    if args.out is not None and not args.export and not args.display:
        raise ConfigError(
            "--out needs at least one --export GLOB (or --display) to say what to copy out"
        )
    check_out_dir(args.out)
    workdir = getattr(args, "workdir_from", None)
    if getattr(args, "export_diff", False) and workdir is None:
        raise ConfigError("--export-diff needs --workdir-from DIR: the diff is against DIR")
    # The snapshot and the change set are made on this host: such a run never goes to a service.
    target = None if workdir is not None else find_service(args)
    if target is not None:
        from sandcell.cli.remote_run import run_remote

        return run_remote(args, target)
    from sandcell.executor import Executor

    schema = None
    if args.schema:
        from sandcell.validation import load_schema

        schema = load_schema(Path(args.schema))
    warm = None
    if args.start not in (None, "cold"):
        from sandcell.backends.warm import WarmConfig

        # One program per process: a replacement for the taken sandbox would only compete with
        # the run for CPU and be destroyed unused at exit.
        warm = WarmConfig(mode=args.start, pool_size=1, refill=False)
    stdin_used = args.file == "-" or args.stdin_file == "-"
    approver = terminal_approver() if terminal_can_answer(stdin_used=stdin_used) else None
    with Executor(
        home=args.home,
        profile=args.profile,
        warm=warm,
        backend=args.backend,
        tool_approver=approver,
    ) as ex:
        request = build_request(args, ex.profile)
        if workdir is not None:
            from sandcell.changes.run import run_in_workdir

            result = run_in_workdir(
                ex,
                request,
                workdir,
                export_diff=args.export_diff,
                schema=schema,
                invariants=tuple(args.invariant),
                result_file=args.result_file,
            )
        else:
            result = ex.run(
                request,
                schema=schema,
                invariants=tuple(args.invariant),
                result_file=args.result_file,
            )
        copied = (
            ex.store.copy_out(result.artifacts, args.out) if args.out and result.artifacts else []
        )
        rendered = ""
        if args.display and result.outputs:
            figures = [a for o in result.outputs for a in o.artifacts]
            if not args.json:
                from sandcell.cli.render import render_outputs

                out = args.out or Path("sandcell-outputs") / result.run_id
                rendered = render_outputs(result.outputs, ex.store, out)
            elif args.out is not None and figures:
                copied += ex.store.copy_out(figures, args.out)
        left_out = _left_out(ex, result.run_id) if workdir is not None else []
    code = report(result, as_json=args.json, copied=copied, out=args.out, rendered=rendered)
    if left_out:
        from sandcell.validation.terminal import neutralise

        # Said after the run's own output, so that a test that failed for want of one of these
        # credentials is explained where its failure is read.
        print(f"sandcell: left out of the copy of {workdir}:", file=sys.stderr)
        for item in left_out:
            print(neutralise(f"  {item}"), file=sys.stderr)
    return code


def _left_out(ex: Executor, run_id: str) -> list[str]:
    """What the run's record says the sandbox did not get of its working directory."""
    entry = ex.audit.get(run_id)
    workdir = entry.record.get("workdir") if entry is not None else None
    items = workdir.get("left_out") if isinstance(workdir, dict) else None
    return [
        f"{x.get('path')}: {x.get('why')}"
        for x in (items if isinstance(items, list) else [])
        if isinstance(x, dict)
    ]


def terminal_can_answer(*, stdin_used: bool) -> bool:
    """Whether a person at this terminal can answer a tool call's approval: stdin is a terminal
    that nothing of the run reads (``stdin_used``: the program text or its stdin come from it),
    and this process is in the terminal's foreground (reading it from the background would stop
    the process)."""
    if stdin_used or not sys.stdin.isatty():
        return False
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except OSError:
        return False


def terminal_approver() -> Approver:
    """Asks the person at the terminal (on stderr, answered on stdin) about each tool call that
    needs approval, one at a time; without an answer before the run's wall time the call is
    refused. Stdin is read unbuffered (``os.read``), so a question left unanswered when the run
    ends holds no lock the interpreter needs to exit."""
    import threading

    from sandcell.policy.approvals import default_approver
    from sandcell.policy.tool_tickets import args_preview, request_line
    from sandcell.tools.approval import ApprovalDecision, ApprovalRequest
    from sandcell.validation import neutralise

    lock = threading.Lock()
    who = f"terminal:{default_approver()}"

    def approve(request: ApprovalRequest) -> ApprovalDecision | None:
        args = request.args
        shown, sha256, size = args_preview(args)
        line = request_line(args)
        # The whole call, one argument per line, the request line first: the person approves
        # what runs, nothing cut.
        text = f"sandcell: {request.tool} (profile {request.profile}) needs approval\n"
        if line is not None:  # a line break in a path must not start a line of its own
            flat = line.replace("\r", "\\r").replace("\n", "\\n")
            text += f"sandcell:   request {flat}\n"
        text += f"sandcell:   arguments ({size} bytes, sha256 {sha256}):\n"
        text += "".join(f"sandcell:     {part}\n" for part in shown.split("\n"))
        with lock:
            sys.stderr.write(neutralise(text) + "sandcell: approve this call? [y/N] ")
            sys.stderr.flush()
            answer = _read_line(sys.stdin.fileno())
            if not sys.stderr.isatty():
                # The terminal echoed the answer; a file or pipe did not: end the question.
                sys.stderr.write("\n")
        if answer is None:
            return None
        return ApprovalDecision(
            approved=answer.strip().lower() in ("y", "yes"), approver=who, args_sha256=sha256
        )

    return approve


def _read_line(fd: int) -> str | None:
    """One line from ``fd`` (None at end of file)."""
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = os.read(fd, 1024)
        except OSError:
            return None
        if not chunk:
            return data.decode("utf-8", "replace") if data else None
        data += chunk
    return data.decode("utf-8", "replace")


def report(
    result: RunResult,
    *,
    as_json: bool,
    copied: list[Path],
    out: Path | None,
    rendered: str = "",
) -> int:
    """Print a result as ``run`` does (shared with ``approve``) and return the exit status.
    ``rendered``: the outputs as :func:`render_outputs` shows them, printed after stdout."""
    if as_json:
        from sandcell.spec import result_to_dict

        body = result_to_dict(result)
        if out is not None:
            body["copied_to"] = [str(p) for p in copied]
        print(json.dumps(body, ensure_ascii=False))
        return status.exit_code_for(result)
    # Escape and control sequences reach a terminal defanged; a pipe gets the bytes as they were.
    out_text = _defanged(result.stdout) if sys.stdout.isatty() else result.stdout
    err_text = _defanged(result.stderr) if sys.stderr.isatty() else result.stderr
    sys.stdout.write(out_text)
    if rendered:
        sys.stdout.write(("\n" if out_text and not out_text.endswith("\n") else "") + rendered)
    sys.stdout.flush()
    sys.stderr.write(err_text)
    say = OwnLines(after=err_text)
    if result.outcome.value not in ("ok", "error"):
        say(f"sandcell: {result.outcome.value}: {result.reason} (run {result.run_id})")
    policy = result.policy or {}
    findings = policy.get("findings") if result.outcome.value in _POLICY_OUTCOMES else None
    for f in findings if isinstance(findings, list) else []:
        say(f"sandcell: {f['rule_id']} ({f['severity']}) line {f['line']}: {f['message']}")
    validation = result.validation or {}
    errors = validation.get("errors")
    for err in errors if isinstance(errors, list) else []:
        say(f"sandcell: invalid result: {err}")
    for leak in result.leaks:
        say(f"sandcell: redacted {leak['kind']} in {leak['stream']}")
    for rej in result.rejected_exports:
        say(f"sandcell: not exported: {rej.path}: {rej.reason}")
    for path in copied:
        say(f"sandcell: exported {path}")
    outside = None
    if result.network is not None or result.tools is not None:
        from sandcell.cli.outside_lines import outside_summary

        outside = outside_summary(result.network, result.tools)
    if outside is not None:
        say(f"sandcell: outside: {outside} (sandcell audit show {result.run_id})")
    return status.exit_code_for(result)


_POLICY_OUTCOMES = ("denied", "awaiting_approval")


def _defanged(text: str) -> str:
    from sandcell.validation import neutralise

    return neutralise(text)
