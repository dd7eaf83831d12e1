"""Escapes through inherited file descriptors: the program starts with stdin, stdout and stderr
only; nothing the sandboxing process had open (a database, a secret file, bwrap's pipes) reaches it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .conftest import Attack


def test_blocks_inherited_descriptors(attack: Attack) -> None:
    body = """
    fds = sorted(int(n) for n in os.listdir("/proc/self/fd"))
    # listdir's own descriptor is the lowest free one, 3, and is closed again by now.
    extra = {}
    for fd in fds:
        if fd > 3:
            try:
                extra[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError as exc:
                extra[fd] = errname(exc)
    if extra or fds[:3] != [0, 1, 2]:
        breach(f"open descriptors {fds}: {extra}")
    else:
        blocked("find an inherited descriptor", f"only {fds}")
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=1)


def test_blocks_leaked_host_descriptor(
    attack: Attack, tmp_path: Path, run_with_host_state: Callable[..., dict[str, object]]
) -> None:
    """A file the sandboxing process holds open without close-on-exec (a root-only secret) is not
    reachable inside, by number or by scanning every descriptor."""
    secret = f"leaked-{secrets.token_hex(12)}"
    path = tmp_path / "secret.txt"
    path.write_text(secret)
    path.chmod(0o600)
    fd = os.open(path, os.O_RDONLY)
    os.set_inheritable(fd, True)
    try:
        body = f"""
        needle = {secret!r}.encode()
        attempt("fstat the leaked descriptor {fd}", lambda: os.fstat({fd}), ok=(errno.EBADF,))
        found = []
        for n in range(3, 1024):
            try:
                data = os.pread(n, 4096, 0)
            except OSError:
                continue
            if needle in data:
                found.append(n)
        if found:
            breach(f"the secret is readable through descriptors {{found}}")
        else:
            blocked("scan descriptors 3-1023 for the secret", "not found")
        attempt("open the secret by its host path", lambda: open({str(path)!r}).read(),
                ok=(errno.ENOENT, errno.EACCES))
        """
        res = run_with_host_state(body, env={}, pass_fds=(fd,))
        out = attack.expect_blocked(res, attempts=3)
        assert secret not in out
    finally:
        os.close(fd)
