"""``sandcell session show ID``: what a session is, live or paused, and the latest samples of
its resources (CPU %, memory and disk used of their limits) from its server's watchdog."""

from __future__ import annotations

import argparse
import json

from sandcell.cli.remote import add_service_option
from sandcell.cli.session import checked, home_of
from sandcell.cli.session_render import expiry, metrics_table, size
from sandcell.errors import InfraError
from sandcell.sessions import SessionEnded, registry, server


def add_parsers(ss: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    show = ss.add_parser("show", help="a session's settings and its latest resource samples")
    show.add_argument("id")
    show.add_argument(
        "--samples", type=int, default=5, metavar="N", help="latest samples shown (default 5)"
    )
    show.add_argument("--json", action="store_true", help="print a JSON object (every sample)")
    add_service_option(show)


def show(args: argparse.Namespace) -> int:
    home, sid = home_of(args), registry.check_id(args.id)
    try:
        info = checked(server.request(home, sid, {"op": "info"}, timeout_s=30))["info"]
        samples = checked(server.request(home, sid, {"op": "metrics"}, timeout_s=30))["metrics"]
    except SessionEnded:
        paused = server.paused_state(home, sid)
        if paused is None:
            raise
        return print_paused(args, sid, paused.summary())
    if not isinstance(info, dict) or not isinstance(samples, list):
        raise InfraError(f"session {sid}'s server answered something else than its info")
    return print_live(args, sid, info, samples)


def print_paused(args: argparse.Namespace, sid: str, state: dict[str, object]) -> int:
    """Print a paused session as ``session show`` does (``state``: its saved state's summary)."""
    if args.json:
        print(json.dumps({"id": sid, "state": "paused", "saved": state}))
        return 0
    print(f"session {sid}: paused ({state['mode']}), {size(state['stored_bytes'])}")
    print(f"  profile {state['profile']}, backend {state['backend']}, cells {state['cells']}")
    print(f"  paused at {state['created_at']}, expires {expiry(state['expires_at'])}")
    print(f"  resume it with `sandcell session resume {sid}`")
    return 0


def print_live(
    args: argparse.Namespace, sid: str, info: dict[str, object], samples: list[object]
) -> int:
    """Print a live session as ``session show`` does: its info, then its latest samples."""
    if args.json:
        print(json.dumps({"id": sid, "state": "live", "info": info, "metrics": samples}))
        return 0
    print(f"session {sid}: live, profile {info['profile']}, backend {info['backend']}")
    print(
        f"  cells {info['cells']}, created {info['created_at']}, idle timeout "
        f"{info['idle_timeout_s']:g} s ({info.get('on_idle', 'end')} then), max lifetime "
        f"{info['max_lifetime_s']:g} s"
    )
    if info.get("parent"):
        print(f"  from session {info['parent']}")
    shown = [m for m in samples if isinstance(m, dict)][-max(args.samples, 1) :]
    if not shown:
        print("  no resource samples yet")
        return 0
    for line in metrics_table(shown):
        print(f"  {line}")
    return 0


__all__ = ["add_parsers", "print_live", "print_paused", "show"]
