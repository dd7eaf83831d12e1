"""``sandcell mcp``: serve sandcell's tools to an MCP client (a desktop or IDE assistant) over
stdio. stdout carries the protocol, so nothing else is printed there; errors go to stderr."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from sandcell.cli.options import add_backend_option
from sandcell.errors import ConfigError
from sandcell.spec import IsolationMode


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    m = sub.add_parser(
        "mcp", help="serve run, session, profile and artifact tools over MCP (stdio)"
    )
    m.add_argument(
        "--profile",
        help="policy profile of runs that name none (default: $SANDCELL_PROFILE, else strict)",
    )
    m.add_argument(
        "--allow-profile",
        action="append",
        default=[],
        metavar="NAME",
        help="another profile a client may name for a run (repeatable; default: only --profile's)",
    )
    add_backend_option(m)
    m.add_argument(
        "--start",
        choices=("cold", "template", "pool"),
        default="cold",
        help="how python sandboxes start: cold (default), from a template, or from a warm pool",
    )
    m.add_argument(
        "--input-root",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="let clients name host files under DIR as inputs (repeatable; default: none, "
        "inputs are sent inline)",
    )
    m.add_argument(
        "--approval-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long a run waits for the client's user to answer an approval question "
        "(default 600); unanswered, it stays pending for sandcell approve",
    )
    m.add_argument(
        "--no-elicitation",
        action="store_true",
        help="never ask the client's user to approve a run; every run that needs approval waits "
        "for sandcell approve",
    )
    m.add_argument(
        "--isolation",
        choices=[mode.value for mode in IsolationMode],
        default=IsolationMode.STRICT.value,
        help="'rlimits' is the weaker mode for hosts without cgroups; it is recorded",
    )
    m.add_argument(
        "--max-sessions",
        type=int,
        default=4,
        metavar="N",
        help="open sessions one client may hold at once (default 4)",
    )


def handle(args: argparse.Namespace) -> int:
    try:
        import mcp.server.mcpserver  # noqa: F401 - only to say what is missing, early
    except ImportError:
        raise ConfigError(
            "sandcell mcp needs the MCP SDK; install it with: pip install 'sandcell[tools]'"
        ) from None
    import anyio

    from sandcell.executor import Executor
    from sandcell.mcp import McpSettings, serve_stdio
    from sandcell.policy.profiles import load_profile

    if not (math.isfinite(args.approval_timeout) and args.approval_timeout > 0):
        raise ConfigError("--approval-timeout must be a positive number of seconds")
    if args.max_sessions < 1:
        raise ConfigError("--max-sessions must be at least 1")
    for root in args.input_root:
        if not root.is_dir():
            raise ConfigError(f"--input-root {str(root)!r} is not a directory")
    settings = McpSettings(
        input_roots=tuple(args.input_root),
        profiles=tuple(args.allow_profile),
        approval_timeout_s=args.approval_timeout,
        max_sessions_per_client=args.max_sessions,
        elicit_approvals=not args.no_elicitation,
        mode=IsolationMode(args.isolation),
    )
    warm = None
    if args.start != "cold":
        from sandcell.backends.warm import WarmConfig

        warm = WarmConfig(mode=args.start, pool_size=1)
    with Executor(home=args.home, profile=args.profile, backend=args.backend, warm=warm) as ex:
        for name in args.allow_profile:
            load_profile(name)  # an unknown or broken one is refused now, not at a client's call
        anyio.run(serve_stdio, ex, settings)
    return 0


__all__ = ["add_parser", "handle"]
