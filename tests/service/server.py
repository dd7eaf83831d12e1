"""Start and stop a real ``sandcell serve`` process on a free loopback port."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx2

from sandcell.service.tenants import TenantStore

REPO = Path(__file__).resolve().parents[2]
_SERVING = re.compile(r"serving on http://127\.0\.0\.1:(\d+)")


@dataclass
class ServiceProcess:
    """One ``sandcell serve`` process on ``home``; its log is in ``home/serve.log``."""

    home: Path
    args: Sequence[str] = ()
    proc: subprocess.Popen[str] | None = None
    port: int = 0
    log: list[str] = field(default_factory=list)
    env: Mapping[str, str] = field(default_factory=dict)
    """More environment for the process (e.g. ``SANDCELL_DATABASE_URL`` for a replica)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def socket(self) -> Path:
        return self.home / "service.sock"

    def start(self, timeout: float = 60.0) -> ServiceProcess:
        env = {
            **os.environ,
            "SANDCELL_HOME": str(self.home),
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        env.pop("SANDCELL_BACKEND", None)
        with (self.home / "serve.log").open("a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sandcell", "serve", "--port", "0", *self.args],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        deadline = time.monotonic() + timeout
        found, seen = self._serving_line(deadline)
        if found is None:
            # A failed start leaves no process behind (a caller may never call stop()).
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"the service did not start; its output: {seen!r}\n"
                f"{(self.home / 'serve.log').read_text()[-4000:]}"
            )
        self.port = int(found.group(1))
        while time.monotonic() < deadline:
            try:
                if httpx2.get(f"{self.url}/healthz", timeout=5).status_code == 200:
                    return self
            except httpx2.TransportError:
                time.sleep(0.1)
        self.proc.kill()
        self.proc.wait()
        raise AssertionError("the service never answered /healthz")

    def _serving_line(self, deadline: float) -> tuple[re.Match[str] | None, list[str]]:
        """The "serving on" line of its standard output, and the lines before it; None at its
        end of output, or at ``deadline``, when the process is killed (which ends its output)."""
        assert self.proc is not None and self.proc.stdout is not None
        seen: list[str] = []
        timer = threading.Timer(max(deadline - time.monotonic(), 0.0), self.proc.kill)
        timer.start()
        try:
            for line in iter(self.proc.stdout.readline, ""):
                found = _SERVING.search(line)
                if found is not None:
                    return found, seen
                seen.append(line)
        finally:
            timer.cancel()
        return None, seen

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120.0) -> int:
        """Stop it with ``sig``; its exit status (uvicorn ends a graceful stop by re-raising
        the signal it caught, so a clean SIGTERM stop is -SIGTERM)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code

    def client(self, key: str | None, **kwargs: object) -> httpx2.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx2.Client(base_url=self.url, headers=headers, timeout=120, **kwargs)  # type: ignore[arg-type]


def sse_events(stream: httpx2.Response) -> Iterator[tuple[str, dict[str, object]]]:
    """The Server-Sent Events of a streamed response: (event, its JSON data), as they come."""
    kind = "message"
    for line in stream.iter_lines():
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield kind, json.loads(line.removeprefix("data: "))


def add_tenant(
    home: Path, name: str, *, profiles: Sequence[str] = ("strict",), **quotas: int
) -> str:
    """A tenant in the service store of ``home`` (what ``sandcell tenants add`` does); its key."""
    values = {
        "max_concurrent": 4,
        "runs_per_minute": 600,
        "cpu_seconds_per_day": 3600,
        "max_stored_bytes": 64 * 1024 * 1024,
        **quotas,
    }
    with TenantStore.in_home(home) as store:
        _, key = store.add(name, profiles=profiles, **values)
    return key


def add_approver(home: Path, tenant: str, name: str = "reviewer") -> str:
    """An approver key of ``tenant`` (what ``sandcell tenants add-approver`` does)."""
    with TenantStore.in_home(home) as store:
        return store.add_approver(tenant, name)
