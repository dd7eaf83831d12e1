"""Tenant-supplied checks, evaluated where a limit can stop them.

A JSON Schema and a textual invariant come from whoever submits a run, and are evaluated on the
host, after the run. In the service's process they could take everyone's time: a schema
``pattern`` such as ``^(a+)+$`` backtracks for minutes on 30 characters, and the regular
expression engine holds the interpreter lock the whole while, so no other request is answered.

So they run in worker processes (:mod:`sandcell.validation._confined_worker`) with their own
limits: a CPU-time budget per check, which the kernel enforces (SIGXCPU), an address-space limit,
and a wall-time limit the parent enforces for a worker that stopped answering. The calling thread
only waits on a pipe, without the interpreter lock. A check that goes over a limit fails the
result (``invalid_output``) with a sentence saying which limit, and its worker is replaced.

Workers are started on first use and kept for the next checks, at most
:attr:`ConfinementLimits.workers` at once; a caller beyond that waits for one to be free. Runs that
declare no schema and no textual invariant never start one. A pydantic model and a Python
callable are the caller's own code and stay in the caller's process.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sandcell.errors import ConfigError, SandcellError

__all__ = ["ConfinedChecks", "ConfinedVerdict", "ConfinementLimits", "default_checks"]

_HEADER = struct.Struct(">I")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfinementLimits:
    """What one check may spend."""

    cpu_seconds: float = 5.0
    """CPU time for one check (schema and invariants together). Validating a result of a few
    MiB against an ordinary schema takes well under a second."""
    memory_bytes: int = 1 << 30
    """Address space of a worker process."""
    wall_seconds: float = 120.0
    """A worker that has not answered by then is killed, whatever its CPU time: it is stopped or
    starved, and the caller must not wait for ever. Far above ``cpu_seconds`` so that a loaded
    host does not fail a check that would pass."""
    workers: int = 4
    """Worker processes at most; more callers wait for a free one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfinedVerdict:
    """What the worker found."""

    schema_errors: tuple[str, ...]
    """The schema's complaints, or the one line saying which limit the check went over."""
    invariant_failures: tuple[str | None, ...] | None
    """Per textual invariant, in order, why it failed (None: it holds); None when the invariants
    were not evaluated (the schema failed, or the check went over a limit)."""


class _WorkerGone(SandcellError):
    """The worker died or was killed; the message is the line the result reports."""


class _Worker:
    def __init__(self, limits: ConfinementLimits) -> None:
        self.limits = limits
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sandcell.validation._confined_worker",
                str(limits.memory_bytes),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            # Not the service's process group: a Ctrl-C to the service is the service's to handle.
            start_new_session=True,
        )

    def ask(self, data: bytes) -> dict[str, object]:
        """Send one encoded request and wait for the reply."""
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(_HEADER.pack(len(data)) + data)
            self.process.stdin.flush()
        except BrokenPipeError:
            raise _WorkerGone(self._death()) from None
        deadline = time.monotonic() + self.limits.wall_seconds
        header = self._read(_HEADER.size, deadline)
        reply: dict[str, object] = json.loads(self._read(_HEADER.unpack(header)[0], deadline))
        return reply

    def _read(self, size: int, deadline: float) -> bytes:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        data = b""
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while len(data) < size:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    self.kill()
                    raise _WorkerGone(
                        f"the check did not finish within {self.limits.wall_seconds:g} s"
                    )
                chunk = os.read(fd, size - len(data))
                if not chunk:
                    raise _WorkerGone(self._death())
                data += chunk
        return data

    def _death(self) -> str:
        code = self.process.wait()
        if code == -signal.SIGXCPU:
            return (
                f"the check took more than {self.limits.cpu_seconds:g} s of CPU time (a "
                "pattern that backtracks, or a result too large for the schema); simplify "
                "the schema's patterns or the invariants"
            )
        return f"the check ended without an answer (exit status {code}); it may have run out " + (
            f"of its {self.limits.memory_bytes // 2**20} MiB of memory"
        )

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


class ConfinedChecks:
    """A pool of worker processes that evaluate schemas and textual invariants."""

    def __init__(self, limits: ConfinementLimits | None = None) -> None:
        self.limits = limits or ConfinementLimits()
        self._idle: list[_Worker] = []
        self._started = 0
        self._busy = 0
        self._closed = False
        self._lock = threading.Condition()

    @property
    def busy(self) -> int:
        """Checks being evaluated now."""
        with self._lock:
            return self._busy

    def check(
        self,
        value: object,
        *,
        schema: Mapping[str, object] | None,
        invariants: Sequence[str],
        subject: object,
    ) -> ConfinedVerdict:
        """Check ``value`` against ``schema``, then, if it passed, the textual ``invariants``
        on ``subject``.

        Raises:
            ConfigError: when the schema cannot be used (a ``$ref`` that does not resolve).
        """
        request: dict[str, object] = {
            "op": "check",
            "schema": schema,
            "value": value,
            "invariants": list(invariants),
        }
        # The result can be MiBs: sent once, unless the invariants see another form of it.
        if invariants and subject is not value:
            request["subject"] = subject
        return self._ask(request)

    def check_schema(self, schema: Mapping[str, object]) -> None:
        """Check that ``schema`` is a valid JSON Schema (:func:`~sandcell.validation.check_schema`)
        in a worker: a schema of a few MiB takes seconds to check.

        Raises:
            ConfigError: when it is not, or when checking it went over a limit.
        """
        if not isinstance(schema, Mapping):
            raise ConfigError(
                f"invalid JSON Schema: it must be a JSON object, got {type(schema).__name__}"
            )
        verdict = self._ask({"op": "check_schema", "schema": schema})
        if verdict.schema_errors:
            raise ConfigError(
                f"invalid JSON Schema: {verdict.schema_errors[0].removeprefix('$: ')}"
            )

    def _ask(self, request: Mapping[str, object]) -> ConfinedVerdict:
        try:
            data = json.dumps({**request, "cpu_seconds": self.limits.cpu_seconds}, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ConfigError(
                f"a schema or result that is not plain JSON cannot be checked: {exc}"
            ) from None
        worker = self._acquire()
        try:
            reply = worker.ask(data.encode())
        except _WorkerGone as exc:
            worker.kill()
            self._release(None)
            return ConfinedVerdict(schema_errors=(f"$: {exc}",), invariant_failures=None)
        except BaseException:
            worker.kill()
            self._release(None)
            raise
        if reply.get("memory"):
            worker.kill()
            self._release(None)
            return ConfinedVerdict(
                schema_errors=(
                    f"$: the check ran out of its {self.limits.memory_bytes // 2**20} MiB of "
                    "memory",
                ),
                invariant_failures=None,
            )
        self._release(worker)
        if "config_error" in reply:
            raise ConfigError(str(reply["config_error"]))
        errors = reply.get("schema_errors") or []
        failures = reply.get("invariants")
        assert isinstance(errors, list)
        return ConfinedVerdict(
            schema_errors=tuple(str(e) for e in errors),
            invariant_failures=None
            if failures is None
            else tuple(None if f is None else str(f) for f in failures),  # type: ignore[attr-defined]
        )

    def _acquire(self) -> _Worker:
        with self._lock:
            while True:
                if self._closed:
                    raise ConfigError("the checks' worker pool is closed")
                if self._idle:
                    worker = self._idle.pop()
                    if worker.process.poll() is None:
                        self._busy += 1
                        return worker
                    worker.kill()
                    self._started -= 1
                    continue
                if self._started < self.limits.workers:
                    self._started += 1
                    self._busy += 1
                    break
                self._lock.wait()
        try:
            return _Worker(self.limits)
        except BaseException:
            self._release(None)
            raise

    def _release(self, worker: _Worker | None) -> None:
        with self._lock:
            self._busy -= 1
            if worker is None or self._closed:
                self._started -= 1
                if worker is not None:
                    worker.kill()
            else:
                self._idle.append(worker)
            self._lock.notify()

    def close(self) -> None:
        """End the idle workers; a check in progress ends its worker when it returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._lock.notify_all()
        for worker in idle:
            worker.kill()


class _Default:
    """The process's pool, made on first use."""

    lock = threading.Lock()
    checks: ConfinedChecks | None = None


def default_checks() -> ConfinedChecks:
    """The process's pool, started on first use and closed at exit."""
    with _Default.lock:
        if _Default.checks is None:
            _Default.checks = ConfinedChecks()
            atexit.register(_Default.checks.close)
        return _Default.checks
