"""The command line: a thin layer over :class:`sandcell.executor.Executor`.

``main(argv) -> int`` parses, dispatches to one module per command and maps the outcome to an
exit status (see :mod:`sandcell.status`). Nothing here decides anything about isolation or policy.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

# command -> (module under sandcell.cli, its handler). A module is imported only when its command
# is the one asked for: every module pulls in part of sandcell (the executor, the validation
# stack, the service), and a command line call should pay only for its own.
_COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "handle"),
    "doctor": ("doctor", "handle"),
    "audit": ("audit", "handle"),
    "check": ("policy", "handle_check"),
    "policy": ("policy", "handle_policy"),
    "approvals": ("approvals", "handle_approvals"),
    "approve": ("approvals", "handle_approve"),
    "deny": ("approvals", "handle_deny"),
    "changes": ("changes", "handle"),
    "packages": ("packages", "handle"),
    "runtime": ("runtime", "handle"),
    "batch": ("batch", "handle"),
    "ask": ("ask", "handle"),
    "session": ("session", "handle"),
    "pool": ("pool", "handle"),
    "vm": ("vm", "handle"),
    "wasm": ("wasm", "handle"),
    "tools": ("tools", "handle"),
    "mcp": ("mcp", "handle"),
    "serve": ("serve", "handle"),
    "tenants": ("tenants", "handle"),
    "cluster": ("cluster", "handle"),
    "db": ("db", "handle"),
}
# The order of the commands in --help; modules that add several commands at once.
_MODULES = (
    "run",
    "doctor",
    "audit",
    "batch",
    "ask",
    "session",
    "pool",
    "vm",
    "wasm",
    "tools",
    "mcp",
    "serve",
    "tenants",
    "cluster",
    "db",
    "policy",
    "approvals",
    "changes",
    "packages",
    "runtime",
)
_SEVERAL = {"policy", "approvals", "packages"}


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"sandcell.cli.{name}")


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that module's commands (what one call needs)."""
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
    for name in _MODULES if only is None else (only,):
        module = _module(name)
        if name in _SEVERAL:
            module.add_parsers(sub)
        else:
            module.add_parser(sub)
    return p


def _command_of(argv: Sequence[str]) -> str | None:
    """The command word of ``argv`` when it is a known one (after ``--home DIR``), else None."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--home":
            i += 2
            continue
        if arg.startswith("--home="):
            i += 1
            continue
        return arg if arg in _COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``sandcell``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(argv)
    args = _parser(None if command is None else _COMMANDS[command][0]).parse_args(argv)
    module_name, handler_name = _COMMANDS[args.command]
    handler: Callable[[argparse.Namespace], int] = getattr(_module(module_name), handler_name)
    return guarded(lambda: handler(args))


def guarded(call: Callable[[], int]) -> int:
    """``call()``'s exit status, or the one for the error it raised, said on stderr as every
    command says it (also for the fast entry, :mod:`sandcell._entry`)."""
    from sandcell import status
    from sandcell.errors import AuditError, SandcellError

    try:
        return call()
    except AuditError as exc:
        print(f"sandcell: audit: {exc}", file=sys.stderr)
        return status.EXIT_CONFIG
    except SandcellError as exc:
        print(f"sandcell: {exc}", file=sys.stderr)
        return status.exit_code_for_error(exc)
    except BrokenPipeError:
        # Output piped into `head` and the like: not an error of the run.
        return 0
    except KeyboardInterrupt:
        return 130
