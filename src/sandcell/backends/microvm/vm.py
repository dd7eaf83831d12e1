"""One QEMU process: started from a plan, watched, and always destroyed with its files.

The console (the guest's serial port on QEMU's stdout) is read by a thread that keeps only its
last :data:`CONSOLE_TAIL` bytes, for error messages: a guest cannot fill the host's disk or memory
through it. :meth:`VM.destroy` kills QEMU (SIGKILL: nothing of the guest is worth a clean shutdown),
reaps it and removes the VM's directory; it is safe to call at any point, more than once.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sandcell.backends.microvm import channel, qemu
from sandcell.backends.microvm.qmp import QMP
from sandcell.errors import InfraError

CONSOLE_TAIL = 8192


class VM:
    """A started QEMU process and its run directory."""

    def __init__(
        self,
        argv: Sequence[str],
        run_dir: Path,
        channel_path: Path,
        *,
        pass_fds: Sequence[int] = (),
    ) -> None:
        self.run_dir = run_dir
        self.channel_path = channel_path
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_bytes = 0
        self._lock = threading.Lock()
        self.chan: channel.Channel | None = None
        self.qmp: QMP | None = None
        """QEMU's control connection, for VMs restored from a snapshot."""
        self.plan: qemu.VMPlan | None = None
        """What QEMU was started with (set by ``machine.start``): a saved state names it."""
        self.image_sha256: str | None = None
        """The guest image's hash (set by ``machine.start``)."""
        self.cleanups: list[Callable[[], None]] = []
        """Called by :meth:`destroy` after QEMU is gone (the jail's cgroup, a snapshot lease)."""
        self.started_at = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                close_fds=True,
                pass_fds=tuple(pass_fds),
                start_new_session=True,
            )
        except OSError as exc:
            raise InfraError(f"cannot start QEMU: {exc}") from exc
        self._reader = threading.Thread(target=self._read_console, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_console(self) -> None:
        stream = self.proc.stdout
        if stream is None:
            return
        while True:
            data = os.read(stream.fileno(), 4096)
            if not data:
                return
            with self._lock:
                self._tail.append(data)
                self._tail_bytes += len(data)
                while self._tail_bytes > CONSOLE_TAIL and len(self._tail) > 1:
                    self._tail_bytes -= len(self._tail.popleft())

    def console(self) -> str:
        """The end of the guest's console (and QEMU's own messages), printable."""
        with self._lock:
            text = b"".join(self._tail)[-CONSOLE_TAIL:].decode("utf-8", "replace")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return " | ".join(lines[-6:])[-1500:]

    def pids(self) -> tuple[int, ...]:
        """QEMU's process and its descendants (the jail's bwrap and QEMU), for memory use."""
        found: list[int] = []
        todo = [self.proc.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                continue
        return tuple(found)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def connect(self, deadline: float) -> channel.Channel:
        """Connect to the agent's channel socket (QEMU creates it while it starts)."""
        while True:
            if not self.alive():
                raise InfraError(f"QEMU exited at start: {self.console() or 'no output'}")
            try:
                sock = channel.connect(
                    str(self.channel_path), min(deadline, time.monotonic() + 0.2)
                )
                break
            except channel.ChannelTimeout:
                if time.monotonic() >= deadline:
                    raise InfraError("QEMU did not open the agent channel in time") from None
        self.chan = channel.Channel(sock)
        return self.chan

    def kill(self, *, reap: bool = True) -> None:
        """Kill QEMU (and anything of its process group) and reap it (unless ``reap`` is false:
        :meth:`destroy` does it later); files stay."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if reap:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)

    def destroy(self) -> None:
        """Kill QEMU, reap it, close the channel and remove the run directory."""
        self.kill()
        if self.chan is not None:
            self.chan.close()
        if self.qmp is not None:
            self.qmp.close()
        if self.proc.stdout is not None:
            # The reader thread ends at EOF once QEMU is gone.
            self._reader.join(timeout=2)
            self.proc.stdout.close()
        while self.cleanups:
            with contextlib.suppress(Exception):
                self.cleanups.pop()()
        shutil.rmtree(self.run_dir, ignore_errors=True)


__all__ = ["CONSOLE_TAIL", "VM"]
