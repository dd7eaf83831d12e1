"""``sandcell session port ID PORT``: a local forward to a server the session's program started
inside its sandbox, on a port its profile lists (``[ingress] ports``). The forward listens on
127.0.0.1 of this host only, lives in the session's server and ends with the session; each
connection through it is recorded as the session's, ``by`` the caller."""

from __future__ import annotations

import argparse
import json

from sandcell.cli.session import checked, home_of
from sandcell.errors import InfraError
from sandcell.sessions import registry, server


def add_parsers(ss: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    port = ss.add_parser(
        "port",
        help="forward a local port (127.0.0.1) to a port of the session's sandbox; prints it",
    )
    port.add_argument("id")
    port.add_argument("port", type=int, help="the port in the sandbox ([ingress] ports)")
    port.add_argument(
        "--host-port", type=int, default=0, metavar="N", help="listen on this port (default: any)"
    )
    port.add_argument("--stop", action="store_true", help="stop the forward on --host-port")
    port.add_argument("--json", action="store_true", help="print a JSON object")


def forward(args: argparse.Namespace) -> int:
    from sandcell.policy.approvals import default_approver

    home, sid = home_of(args), registry.check_id(args.id)
    if args.stop:
        address = ["127.0.0.1", args.host_port]
        reply = checked(
            server.request(home, sid, {"op": "stop_forward", "address": address}, timeout_s=30)
        )
        if args.json:
            print(json.dumps({"id": sid, "stopped": bool(reply.get("stopped"))}))
        return 0 if reply.get("stopped") else 1
    request = {
        "op": "forward_port",
        "port": args.port,
        "host_port": args.host_port,
        "by": default_approver(),
    }
    reply = checked(server.request(home, sid, request, timeout_s=60))
    answered = reply.get("address")
    if not (isinstance(answered, list) and len(answered) == 2):
        raise InfraError(f"session {sid}'s server answered something else than an address")
    host, port = answered
    if args.json:
        print(json.dumps({"id": sid, "port": args.port, "host": host, "host_port": port}))
    else:
        print(f"{host}:{port}")
    return 0


__all__ = ["add_parsers", "forward"]
