"""A minimal QMP client: QEMU's JSON control socket, for saving and restoring snapshots."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable
from typing import Any

from sandcell.errors import InfraError


class QMP:
    """One connection to QEMU's QMP socket, capabilities negotiated."""

    def __init__(
        self, path: str, deadline: float, *, alive: Callable[[], bool] | None = None
    ) -> None:
        """``alive``: whether QEMU still runs; a QEMU killed before it opened the socket (a pool
        closing during a restore) then fails at once instead of at the deadline."""
        while True:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                self.sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                self.sock.close()
                if alive is not None and not alive():
                    raise InfraError("QEMU exited before it opened its control socket") from None
                if time.monotonic() >= deadline:
                    raise InfraError(f"QEMU did not open its control socket {path}") from None
                time.sleep(0.005)
        self.buf = b""
        self.events: list[dict[str, Any]] = []
        try:
            self._message(deadline)  # the greeting
            self.execute("qmp_capabilities", deadline=deadline)
        except BaseException:
            # Nobody holds this connection yet (a pool closing kills QEMU mid-restore): close
            # it here, or it is left to the garbage collector.
            self.sock.close()
            raise

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise InfraError("QEMU did not answer on its control socket")
            r, _, _ = select.select([self.sock], [], [], left)
            if not r:
                continue
            data = self.sock.recv(1 << 16)
            if not data:
                raise InfraError("QEMU closed its control socket")
            self.buf += data
            if len(self.buf) > 1 << 22:
                raise InfraError("QEMU's control socket sent too much")
        line, _, self.buf = self.buf.partition(b"\n")
        msg = json.loads(line)
        if not isinstance(msg, dict):
            raise InfraError("QEMU sent a malformed control message")
        return msg

    def execute(self, command: str, *, deadline: float, **arguments: Any) -> Any:
        req: dict[str, Any] = {"execute": command}
        if arguments:
            req["arguments"] = arguments
        self.sock.sendall(json.dumps(req).encode() + b"\n")
        while True:
            msg = self._message(deadline)
            if "event" in msg:
                self.events.append(msg)
                continue
            if "error" in msg:
                raise InfraError(
                    f"QEMU refused {command}: {msg['error'].get('desc', msg['error'])}"
                )
            return msg.get("return")

    def send_fd(self, name: str, fd: int, *, deadline: float) -> None:
        """Hand QEMU a descriptor under ``name`` (``getfd``), e.g. for ``migrate uri=fd:name``."""
        req = json.dumps({"execute": "getfd", "arguments": {"fdname": name}}).encode() + b"\n"
        socket.send_fds(self.sock, [req], [fd])
        while True:
            msg = self._message(deadline)
            if "event" in msg:
                self.events.append(msg)
                continue
            if "error" in msg:
                raise InfraError(f"QEMU refused the descriptor: {msg['error']}")
            return

    def wait_migration(self, deadline: float) -> None:
        """Until the migration (either side) completed; InfraError if it failed."""
        while True:
            info = self.execute("query-migrate", deadline=deadline) or {}
            status = info.get("status")
            if status == "completed":
                return
            if status in ("failed", "cancelled"):
                why = info.get("error-desc")
                raise InfraError(f"the VM state transfer {status}" + (f": {why}" if why else ""))
            if time.monotonic() >= deadline:
                raise InfraError("the VM state transfer did not finish in time")
            time.sleep(0.002)

    def close(self) -> None:
        self.sock.close()


__all__ = ["QMP"]
