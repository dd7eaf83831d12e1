"""``sandcell run``: build a request from the command line, run it, report it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sandcell import status
from sandcell.errors import ConfigError
from sandcell.spec import (
    LANGUAGES,
    IsolationMode,
    Limits,
    MiB,
    RunRequest,
    input_from_path,
    result_to_dict,
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def build_request(args: argparse.Namespace) -> RunRequest:
    code = read_code(args)
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


def handle(args: argparse.Namespace) -> int:
    from sandcell.executor import Executor

    request = build_request(args)
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
