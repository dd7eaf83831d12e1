"""Escapes through unix sockets: host services listening on a path or in the abstract namespace.

The sandbox has a private /tmp (a path socket there is not visible), its own network namespace
(abstract sockets are per network namespace) and Landlock's abstract-socket scoping where the
kernel has it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.conftest import wasm_cannot

from sandcell import ConfigError

if TYPE_CHECKING:
    from .conftest import Attack, Listener


def _connect(address: str, label: str) -> str:
    return f"""
    def connect():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect({address})
            return s.recv(16) or "connected"
        finally:
            s.close()
    attempt({label!r}, connect, ok=(errno.ENOENT, errno.ECONNREFUSED, errno.EPERM, errno.EACCES))
    """


def test_blocks_host_unix_socket_in_tmp(
    attack: Attack, unix_listener_factory: Callable[[str | bytes], Listener]
) -> None:
    wasm_cannot(attack.sandbox, "unix_sockets")
    path = f"/tmp/sandcell-escape-{secrets.token_hex(6)}.sock"
    lst = unix_listener_factory(path)
    try:
        res = attack.run(_connect(repr(path), "connect to a host socket in /tmp"))
        attack.expect_blocked(res, attempts=1)
        assert not lst.stop(), f"[{attack.identity}] ESCAPE: {lst.seen}"
    finally:
        os.unlink(path)


def test_blocks_abstract_unix_socket(
    attack: Attack, unix_listener_factory: Callable[[str | bytes], Listener]
) -> None:
    wasm_cannot(attack.sandbox, "unix_sockets")
    name = f"\0sandcell-test-{secrets.token_hex(6)}"
    lst = unix_listener_factory(name)
    res = attack.run(_connect(repr(name), "connect to a host abstract socket"))
    attack.expect_blocked(res, attempts=1)
    assert not lst.stop(), f"[{attack.identity}] ESCAPE: {lst.seen}"


def test_blocks_unix_socket_in_input_dir(
    attack: Attack, tmp_path: Path, unix_listener_factory: Callable[[str | bytes], Listener]
) -> None:
    """A directory given as an input may hold a live socket (a dev server's, an agent's): the
    read-only mount does not stop connect(2), so something else must."""
    shared = tmp_path / "project"
    shared.mkdir(mode=0o755)
    (shared / "README").write_text("inputs\n")
    lst = unix_listener_factory(str(shared / "agent.sock"))
    # Refused before anything runs: the input check names the socket.
    with pytest.raises(ConfigError, match=r"unix socket .*agent\.sock"):
        attack.run(
            _connect(repr("/inputs/project/agent.sock"), "connect to a host socket in an input"),
            inputs=[shared],
        )
    assert not lst.stop(), f"[{attack.identity}] ESCAPE: {lst.seen}"
