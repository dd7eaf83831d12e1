"""The command line: a thin layer over :class:`sandcell.executor.Executor`.

``main(argv) -> int`` parses, dispatches to one module per command and maps the outcome to an
exit status (see :mod:`sandcell.status`). Nothing here decides anything about isolation or policy.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from sandcell import status
from sandcell.cli import (
    approvals,
    ask,
    audit,
    batch,
    doctor,
    mcp,
    packages,
    policy,
    pool,
    run,
    serve,
    session,
    tenants,
    tools,
    vm,
)
from sandcell.errors import AuditError, SandcellError

_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": run.handle,
    "doctor": doctor.handle,
    "audit": audit.handle,
    "check": policy.handle_check,
    "policy": policy.handle_policy,
    "approvals": approvals.handle_approvals,
    "approve": approvals.handle_approve,
    "deny": approvals.handle_deny,
    "packages": packages.handle,
    "batch": batch.handle,
    "ask": ask.handle,
    "session": session.handle,
    "pool": pool.handle,
    "vm": vm.handle,
    "tools": tools.handle,
    "mcp": mcp.handle,
    "serve": serve.handle,
    "tenants": tenants.handle,
}


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
    for module in (run, doctor, audit, batch, ask, session, pool, vm, tools, mcp, serve, tenants):
        module.add_parser(sub)
    policy.add_parsers(sub)
    approvals.add_parsers(sub)
    packages.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``sandcell``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
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


def entry() -> None:
    sys.exit(main())
