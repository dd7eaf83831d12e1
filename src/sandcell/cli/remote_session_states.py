"""``sandcell session pause|resume|fork|snapshot|snapshots|snapshot-delete|delete|show`` through
a service: its saved-session API (``/v1/sessions/{id}/pause`` and the rest, docs/service.md),
printed by the same functions as this machine's sessions.

A mode left out is the best the session's rung offers, as here: memory, else files (the service
refuses a mode the rung lacks with 422 before it saves anything, so asking again costs nothing).
"""

from __future__ import annotations

import argparse
from typing import Any

from sandcell.cli.remote import Remote
from sandcell.cli.session_show import print_live, print_paused
from sandcell.cli.session_states import (
    paused_row,
    print_deleted,
    print_forks,
    print_saved,
    print_snapshots,
)
from sandcell.client.errors import ServiceError
from sandcell.errors import ConfigError
from sandcell.sessions import PauseMode, PauseRefused

_REFUSED = 422
"""The service's answer to a mode the session's rung cannot save."""


def handle_remote_states(args: argparse.Namespace, remote: Remote) -> int:
    match args.session_command:
        case "pause":
            state = _saving(remote, f"/v1/sessions/{args.id}/pause", {}, args.mode)
            return print_saved(args, f"paused session {args.id}", args.id, state)
        case "resume":
            info = remote.json("POST", f"/v1/sessions/{args.id}/resume", body={})
            return _emit_id(args, str(info["id"]))
        case "fork":
            body: dict[str, object] = {"n": args.n}
            forked = _saving(remote, f"/v1/sessions/{args.id}/fork", body, args.mode)
            children = [str(s["id"]) for s in forked["sessions"]]
            return print_forks(args, args.id, children)
        case "snapshot":
            body = {"name": args.name, "ttl_s": args.ttl}
            state = _saving(remote, f"/v1/sessions/{args.id}/snapshots", body, args.mode)
            return print_saved(args, f"snapshot {args.name} of session {args.id}", args.id, state)
        case "snapshots":
            return print_snapshots(args, list(remote.json("GET", "/v1/snapshots")))
        case "snapshot-delete":
            gone = remote.json("DELETE", f"/v1/snapshots/{args.name}")
            return print_deleted(args, f"snapshot {args.name}", gone)
        case "delete":
            gone = remote.json("DELETE", f"/v1/paused/{args.id}")
            return print_deleted(args, f"paused session {args.id}", gone)
        case "show":
            return _show(args, remote)
    raise ConfigError(f"unknown session command {args.session_command!r}")


def paused_rows(remote: Remote) -> list[dict[str, object]]:
    """The tenant's paused sessions as rows of ``session list``."""
    return [paused_row(s) for s in remote.json("GET", "/v1/paused")]


def _saving(remote: Remote, path: str, body: dict[str, object], mode: str | None) -> dict[str, Any]:
    """POST a pause, fork or snapshot in ``mode``; none: memory, else files where the rung
    refuses memory."""
    if mode is not None:
        return dict(remote.json("POST", path, body={**body, "mode": mode}))
    answer = remote.call(
        "POST", path, body={**body, "mode": PauseMode.MEMORY.value}, accept=(_REFUSED,)
    )
    if answer.status != _REFUSED:
        return dict(answer.json())
    try:
        return dict(remote.json("POST", path, body={**body, "mode": PauseMode.FILES.value}))
    except ServiceError as exc:
        raise PauseRefused(str(exc)) from None


def _show(args: argparse.Namespace, remote: Remote) -> int:
    live = remote.call("GET", f"/v1/sessions/{args.id}", accept=(404,))
    if live.status == 404:
        return print_paused(args, args.id, dict(remote.json("GET", f"/v1/paused/{args.id}")))
    samples = list(remote.json("GET", f"/v1/sessions/{args.id}/metrics"))
    return print_live(args, args.id, dict(live.json()), samples)


def _emit_id(args: argparse.Namespace, sid: str) -> int:
    import json

    print(json.dumps({"id": sid}) if args.json else sid)
    return 0


__all__ = ["handle_remote_states", "paused_rows"]
