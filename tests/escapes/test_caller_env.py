"""Escapes through the caller's environment: nothing of the sandboxing process's environment (API
keys, tokens) reaches the sandbox, in os.environ or anywhere under /proc."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .conftest import Attack

SECRET_NAME = "SANDCELL_TEST_SECRET"


def _secret() -> str:
    return f"s3cr3t-{secrets.token_hex(12)}"


def test_blocks_secret_in_os_environ(
    attack: Attack, run_with_host_state: Callable[..., dict[str, object]]
) -> None:
    secret = _secret()
    wasm = attack.sandbox.backend == "wasm"
    body = f"""
    hits = [k for k, v in os.environ.items() if {secret!r} in v or k == {SECRET_NAME!r}]
    if hits:
        breach(f"secret in os.environ: {{hits!r}}")
    else:
        blocked("secret in os.environ", "absent")
    import subprocess
    try:
        env_out = subprocess.run(["env"], capture_output=True, text=True).stdout
    except OSError as exc:
        if not {wasm!r}:
            raise
        # The wasm rung has no processes (Pyodide's subprocess refuses with ENOTSUP): no child
        # exists that could be handed the environment.
        blocked("start a child to read its environment", errname(exc))
        env_out = None
    if env_out is None:
        pass
    elif {secret!r} in env_out or {SECRET_NAME!r} in env_out:
        breach("secret in a child's environment")
    else:
        blocked("secret in a child's environment", "absent")
    """
    res = run_with_host_state(body, env={SECRET_NAME: secret, "AWS_SECRET_ACCESS_KEY": secret})
    out = attack.expect_blocked(res, attempts=2)
    assert secret not in out and secret not in str(res.get("stderr"))


def test_blocks_secret_in_proc_environ(
    attack: Attack, run_with_host_state: Callable[..., dict[str, object]]
) -> None:
    """/proc/1/environ (the sandbox init, bwrap), /proc/self/environ and every other process's
    environ and cmdline readable inside."""
    secret = _secret()
    body = f"""
    needle = {secret!r}.encode()
    for path in ("/proc/1/environ", "/proc/self/environ", "/proc/1/cmdline"):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            blocked(f"read {{path}}", errname(exc))
        else:
            (breach if needle in data else blocked)(f"secret in {{path}}", "absent")
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for leaf in ("environ", "cmdline"):
            try:
                with open(f"/proc/{{pid}}/{{leaf}}", "rb") as f:
                    if needle in f.read():
                        found.append(f"/proc/{{pid}}/{{leaf}}")
            except OSError:
                pass
    if found:
        breach(f"secret in {{found!r}}")
    else:
        blocked("secret in any /proc/*/environ or cmdline", "absent")
    """
    res = run_with_host_state(body, env={SECRET_NAME: secret})
    out = attack.expect_blocked(res, attempts=4)
    assert secret not in out
