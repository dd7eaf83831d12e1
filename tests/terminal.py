"""A real terminal for tests of interactive commands: a tmux server of its own, driven with
``send-keys`` and read with ``capture-pane``, waiting for the expected text (never a fixed
sleep)."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

DEADLINE_S = 60.0
"""How long an expected text may take to show before the test fails (never reached when the
command works: it ends a test that would otherwise hang)."""


class Tmux:
    """A tmux server of its own: one 100x30 window of a plain bash, with ``SANDCELL_HOME`` set to
    ``home`` and ``env`` added to its environment (no other ``SANDCELL_`` variable)."""

    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        self.socket = f"sandcell-test-{uuid.uuid4().hex[:8]}"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
        env = {**clean, "SANDCELL_HOME": str(home), "PS1": "$ ", "TERM": "xterm", **(env or {})}
        self._env = env
        self.tmux("new-session", "-d", "-s", "t", "-x", "100", "-y", "30", "bash --norc -i")

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args],
            env=self._env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout

    def type(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-t", "t")

    def wait_for(self, text: str) -> str:
        deadline = time.monotonic() + DEADLINE_S
        while text not in (shown := self.screen()):
            assert time.monotonic() < deadline, (text, shown)
            time.sleep(0.05)
        return shown

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, check=False)
