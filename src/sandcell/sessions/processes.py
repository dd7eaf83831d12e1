"""Background processes, terminals and directory watches of a session, on every rung.

>>> with Executor() as ex, ex.session() as s:                        # doctest: +SKIP
...     p = s.spawn("for i in 1 2 3; do echo $i; sleep 0.2; done")
...     s.run("x = 1")                       # cells run while it runs
...     b"".join(o.stdout for o in s.follow(p.pid))
b'1\\n2\\n3\\n'

A process manager (``backends/inside/_procs.py``) lives in the session's kernel, installed by the
first operation through a cell in a private scope (:data:`SCOPE`); every operation after is one
such cell whose stdout is one JSON reply. The processes are children of the kernel: inside the
sandbox, its limits (pids, memory, CPU) and its Landlock domain, and they end with the session. A
memory pause, snapshot or fork keeps them and their buffered output (they come back with the
kernel); a files-mode resume starts a fresh kernel with none.

The command a spawn starts is admitted like a Bash cell under the session's profile (a denied
command, or one that needs approval, raises :class:`SpawnRefused` and starts nothing) and is one
run in the record (its code is the command; outcome ``ok``, reason ``started in the background as
pid N``; ``error`` when it could not start). Its end is another run of the command: its exit
status and the last :data:`~sandcell.backends.inside._procs.END_TAIL` bytes of each stream (the
rest was its readers'), recorded once, by the first operation after it exited (any read, listing
or spawn; the manager tells each end once, so a memory pause does not record it twice); a
process still running when the session ends has no end record. The other operations are
sandcell's own code: no runs, no policy check.

Limitation: an operation is a cell, so it takes the session's lock like any cell: while a long
cell runs, ``read_process``, ``send_stdin``, ``watch_events`` and the rest wait until it ends. The
processes keep running meanwhile and their output is buffered (the last :data:`RING_BYTES` of
each stream; a reader that fell further behind is told how many bytes it missed).
"""

from __future__ import annotations

import base64
import json
import shlex
import signal as signals
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sandcell.backends.base import BackendResult
from sandcell.backends.cell import CellScope, lacking
from sandcell.backends.inside import PROCS_SCRIPT
from sandcell.errors import ConfigError, InfraError
from sandcell.pipeline.finish import finish
from sandcell.pipeline.prepare import prepare
from sandcell.pipeline.validators import Validators
from sandcell.sessions.saving import tell_listeners
from sandcell.spec import Outcome, Usage

if TYPE_CHECKING:
    from sandcell.backends.cell import CellSandbox
    from sandcell.executor import Executor
    from sandcell.policy.profiles import Profile
    from sandcell.spec import RunRequest

SCOPE = ".sandcell-procs"
"""The kernel scope the manager's cells run in (apart from the session's variables)."""
OP_TIMEOUT_S = 60.0
"""Wall time of one operation's cell; each takes milliseconds, this is for a stuck kernel."""
READ_BYTES = 128 * 1024
"""At most this much of each stream per read, and less under a small stdout cap (the reply, both
streams in base64, must fit in the session's ``stdout_bytes`` with room to spare)."""
_REPLY_ROOM = 4096
RING_BYTES = 1024 * 1024
"""Output kept per stream of a process inside the sandbox (the manager's ``RING_BYTES``)."""
FOLLOW_PAUSE_S = 0.1
_MARK = "@sandcell-procs-reply@ "
_EMPTY = Validators(schema=None, model=None, invariants=(), result_file=None)


class _Recorded(ConfigError):
    run_id: str | None = None
    """The id of the run record the refused or failed spawn left (for a surface that maps
    records to their owner)."""


class ProcessNotFound(ConfigError):
    """No process of that pid (or watch of that id) was started in this session's kernel (a
    files-mode resume starts a fresh kernel, with none)."""


class SpawnRefused(_Recorded):
    """The session's profile denied the command, or wants a person to approve it: nothing ran.
    ``policy`` is what the run record says of the verdict (``verdict``, ``reason``,
    ``findings``), for a surface that queues the command for approval."""

    def __init__(
        self,
        message: str,
        *,
        policy: Mapping[str, object] | None = None,
        run_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.policy: Mapping[str, object] = dict(policy or {})
        self.run_id = run_id


class SpawnFailed(_Recorded):
    """The command was admitted but did not start inside the sandbox: the session's process
    limit, a program that does not exist, a terminal on a sandbox without pseudo-terminals."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessInfo:
    """A process started with :meth:`Session.spawn`."""

    pid: int
    """Its pid inside the sandbox."""
    argv: tuple[str, ...]
    command: str | None
    """The Bash command line it runs, when it was given as one (None for an argv)."""
    env: Mapping[str, str]
    """The variables given at its spawn (added to the kernel's environment)."""
    cwd: str | None
    tag: str | None
    pty: tuple[int, int] | None
    """(rows, cols) of its terminal, or None without one."""
    stdin: bool
    """Whether it takes input (:meth:`Session.send_stdin`): asked for, or a terminal."""
    started_at: float
    """Unix time it started (the sandbox's clock)."""
    exited: bool
    exit_code: int | None
    signal: int | None
    """The signal that ended it, when one did."""
    run_id: str | None = None
    """The id of its spawn's run record. When it has ended, another run of its command in the
    record holds its exit status and the last bytes of its output; its reason names this id."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessOutput:
    """What one read of a process's output returned. Offsets count bytes from the start of each
    stream; pass ``stdout_next``/``stderr_next`` to the next read. A terminal's output is its
    ``stdout``."""

    pid: int
    stdout: bytes
    stderr: bytes
    stdout_offset: int
    stderr_offset: int
    stdout_next: int
    stderr_next: int
    stdout_skipped: int
    """Bytes between the offset asked for and the oldest kept: lost to this reader."""
    stderr_skipped: int
    more: bool
    """More output is buffered past what this read returned."""
    exited: bool
    exit_code: int | None
    signal: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchEvent:
    """One change seen in a watched directory."""

    type: str
    """``create``, ``write``, ``remove``, ``rename`` (the old name; the new one is a
    ``create``) or ``chmod``."""
    name: str
    """The path relative to the watched directory."""
    is_dir: bool
    at: float
    """Unix time it was seen (the sandbox's clock)."""


def _procs_source() -> str:
    return PROCS_SCRIPT.read_text(encoding="utf-8")


_INSTALL = """import sys as _sys
if "_sandcell_procs" not in _sys.modules:
    _m = type(_sys)("_sandcell_procs")
    exec(compile({source!r}, "/sandcell/procs.py", "exec"), _m.__dict__)
    _sys.modules["_sandcell_procs"] = _m
    del _m
_sys.modules["_sandcell_procs"].main({request!r})
"""
_CALL = """import sys as _sys
if "_sandcell_procs" in _sys.modules:
    _sys.modules["_sandcell_procs"].main({request!r})
else:
    print({absent!r})
"""


def _kernel_lacks(language: str) -> str | None:
    """Why a session whose kernel runs ``language`` has no background processes, terminals or
    watches (None: it has them): their manager runs inside the Python kernel, and a Node kernel
    may not start programs (Node's permission model refuses child processes)."""
    if language == "python":
        return None
    return (
        f"a {language} session has no background processes, terminals or watches: its Node "
        "kernel may not start programs; open a Python session for them"
    )


class ProcessControl:
    """The background-process, terminal and watch methods of :class:`~sandcell.sessions.Session`
    (see the module docstring)."""

    # The session's, set by Session.__init__.
    id: str
    executor: Executor
    profile: Profile
    request: RunRequest
    max_lifetime_s: float
    _lock: threading.Lock
    _sandbox: CellSandbox
    _born: float
    _last_active: float
    _wake: threading.Event
    _inputs_record: list[dict[str, object]]
    owner: str | None
    _procs_installed: bool = False

    def _check_alive(self) -> None: ...
    def _end(self, reason: str) -> object: ...

    @property
    def busy(self) -> bool:
        """Whether a cell or an operation holds the session now, so a read started now would
        wait for it (a hint for pollers that must not hold a worker thread meanwhile)."""
        return self._lock.locked()

    # -- processes -------------------------------------------------------------------------------

    def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
        pty: tuple[int, int] | None = None,
        tag: str | None = None,
    ) -> ProcessInfo:
        """Start ``cmd`` in the background in the session's sandbox and return at once.

        ``cmd``: a Bash command line (run as ``bash -l -c CMD``, as a Bash cell) or an argv.
        ``env`` is added to the kernel's environment; ``cwd`` is a path in the sandbox (default:
        the kernel's directory, the workspace). ``stdin=True`` keeps its input open for
        :meth:`send_stdin`. ``pty=(rows, cols)`` runs it on a terminal of that size (its
        controlling tty, in a session of its own; output and input go through the terminal).
        ``tag`` is kept with it for listings. Raises :class:`SpawnRefused` when the profile
        does not admit the command and :class:`SpawnFailed` when it does not start; both are
        runs in the record."""
        argv, command = _argv(cmd)
        if pty is not None:
            pty = _size(*pty)
        missing = lacking(self._sandbox, "processes") or _kernel_lacks(self.request.language)
        if missing is not None:
            raise ConfigError(missing)
        with self._lock:
            self._check_alive()
            self.executor.check_home()  # a spawn whose record would be lost does not start
            request = replace(self.request, code=command or shlex.join(argv), language="bash")
            prepared = prepare(
                request,
                self.profile,
                wheels=self.executor.wheels,
                backend=lambda _: self._sandbox.backend,
            )
            request = replace(prepared.request, packages=self.request.packages)
            run_id, started_at = uuid.uuid4().hex, _now()
            if prepared.verdict != "allow":
                reason = (
                    prepared.denial
                    if prepared.verdict == "deny"
                    else f"the command needs approval under profile {self.profile.name!r} "
                    f"({prepared.admission.decision.reason}), and a session cannot wait for a "
                    "person"
                )
                br = BackendResult.not_run(Outcome.DENIED, reason, self._sandbox.enforcement())
                self._record(request, prepared, br, run_id, started_at)
                raise SpawnRefused(f"not started: {reason}", policy=prepared.policy, run_id=run_id)
            op = {
                "op": "spawn",
                "argv": argv,
                "command": command,
                "env": dict(env or {}),
                "cwd": cwd,
                "stdin": stdin,
                "pty": list(pty) if pty else None,
                "tag": tag,
                "run_id": run_id,
            }
            try:
                info = _info(self._procs_locked(op))
            except SpawnFailed as exc:
                br = _started(Outcome.ERROR, f"did not start: {exc}", self._sandbox)
                self._record(request, prepared, br, run_id, started_at)
                exc.run_id = run_id
                raise
            reason = f"started in the background as pid {info.pid}"
            self._record(request, prepared, _started(Outcome.OK, reason, self._sandbox),
                         run_id, started_at)  # fmt: skip
            return replace(info, run_id=run_id)

    def processes(self) -> list[ProcessInfo]:
        """Every process spawned in the session's kernel, running or exited, oldest first."""
        reply = self._procs({"op": "list"})
        found = reply.get("processes")
        if not isinstance(found, list):
            raise InfraError("the session's process manager sent a malformed listing")
        return [_info(p) for p in found]

    def read_process(
        self, pid: int, *, stdout_from: int = 0, stderr_from: int = 0
    ) -> ProcessOutput:
        """Output of process ``pid`` from the given offsets (at most :data:`READ_BYTES` per
        stream; ``more`` says there is more), and whether it exited. Reading does not consume:
        any reader can start again from any offset still kept."""
        cap = self.request.effective_limits.stdout_bytes
        # Each stream's bytes go base64 into the reply, beside the ends it may carry.
        limit = max(64, min(READ_BYTES, (cap * 3 // 4 - _REPLY_ROOM) * 3 // 8))
        reply = self._procs({"op": "read", "pid": int(pid), "stdout_from": int(stdout_from),
                             "stderr_from": int(stderr_from), "max": limit})  # fmt: skip
        info = _info(reply)
        out, err = _chunk(reply.get("stdout")), _chunk(reply.get("stderr"))
        return ProcessOutput(
            pid=info.pid,
            stdout=out[0],
            stderr=err[0],
            stdout_offset=out[1],
            stderr_offset=err[1],
            stdout_next=out[2],
            stderr_next=err[2],
            stdout_skipped=out[3],
            stderr_skipped=err[3],
            more=out[4] or err[4],
            exited=info.exited,
            exit_code=info.exit_code,
            signal=info.signal,
        )

    def follow(
        self, pid: int, *, stdout_from: int = 0, stderr_from: int = 0
    ) -> Iterator[ProcessOutput]:
        """The output of process ``pid`` as it comes, until it exited and all it wrote was
        read: each item is a read with new output (or the last one, with ``exited``). Between
        empty reads it sleeps :data:`FOLLOW_PAUSE_S`; while a cell runs, each read waits for
        it (see the module docstring)."""
        while True:
            got = self.read_process(pid, stdout_from=stdout_from, stderr_from=stderr_from)
            stdout_from, stderr_from = got.stdout_next, got.stderr_next
            fresh = bool(got.stdout or got.stderr or got.stdout_skipped or got.stderr_skipped)
            if got.exited and not got.more:
                yield got
                return
            if fresh:
                yield got
            if not got.more:
                time.sleep(FOLLOW_PAUSE_S)

    def send_stdin(self, pid: int, data: bytes | str) -> None:
        """Queue ``data`` for the process's input (its terminal's, for a PTY); written as it
        reads. A process without open input raises :class:`SpawnFailed`."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        payload = base64.b64encode(raw).decode("ascii")
        self._procs({"op": "write", "pid": int(pid), "data": payload})

    def close_stdin(self, pid: int) -> None:
        """End the process's input once what was queued is written (a terminal gets ^D)."""
        self._procs({"op": "close_stdin", "pid": int(pid)})

    def signal(self, pid: int, sig: int | signals.Signals) -> None:
        """Send ``sig`` to the process and its process group (what it started); an exited
        process is left alone."""
        self._procs({"op": "signal", "pid": int(pid), "signal": int(sig)})

    def kill(self, pid: int) -> None:
        """SIGKILL to the process and its group."""
        self.signal(pid, signals.SIGKILL)

    def resize(self, pid: int, rows: int, cols: int) -> None:
        """Set the size of the process's terminal (it gets SIGWINCH)."""
        rows, cols = _size(rows, cols)
        self._procs({"op": "resize", "pid": int(pid), "rows": rows, "cols": cols})

    # -- watches ---------------------------------------------------------------------------------

    def watch(self, path: str, recursive: bool = False) -> int:
        """Watch the directory ``path`` (in the sandbox; relative to the kernel's directory) for
        created, written, removed and renamed entries, in its subdirectories too when
        ``recursive`` (a directory created later is watched from when it is seen); returns the
        watch's id for :meth:`watch_events`. inotify inside the sandbox; where ``ctypes``
        cannot load there, a comparison of snapshots every half second (renames then read as
        remove and create)."""
        reply = self._procs({"op": "watch", "path": str(path), "recursive": bool(recursive)})
        watch_id = reply.get("watch_id")
        if not isinstance(watch_id, int):
            raise InfraError("the session's process manager sent a malformed watch")
        return watch_id

    def watch_events(self, watch_id: int) -> list[WatchEvent]:
        """The events seen since the last call, oldest first (at most 10,000 are kept between
        calls; older ones are dropped)."""
        reply = self._procs({"op": "watch_events", "watch_id": int(watch_id)})
        events = reply.get("events")
        if not isinstance(events, list):
            raise InfraError("the session's process manager sent malformed events")
        return [_event(e) for e in events]

    def unwatch(self, watch_id: int) -> None:
        """Stop the watch."""
        self._procs({"op": "unwatch", "watch_id": int(watch_id)})

    # -- the manager's cells ---------------------------------------------------------------------

    def _procs(self, op: Mapping[str, object]) -> dict[str, Any]:
        with self._lock:
            self._check_alive()
            return self._procs_locked(op)

    def _procs_locked(self, op: Mapping[str, object]) -> dict[str, Any]:
        missing = lacking(self._sandbox, "processes") or _kernel_lacks(self.request.language)
        if missing is not None:
            raise ConfigError(missing)
        reply = self._procs_reply(
            {**op, "ends_budget": self.request.effective_limits.stdout_bytes // 4}
        )
        ends = reply.get("ends")
        if isinstance(ends, list):
            for ended in ends:
                self._record_end(ended)
        return reply

    def _procs_reply(self, op: Mapping[str, object]) -> dict[str, Any]:
        request = json.dumps(op)
        absent = _MARK + json.dumps({"ok": False, "kind": "absent"})
        if self._procs_installed:
            reply = self._procs_cell(_CALL.format(request=request, absent=absent))
            if reply.get("kind") != "absent":
                return _checked(reply)
        reply = self._procs_cell(_INSTALL.format(source=_procs_source(), request=request))
        self._procs_installed = True
        return _checked(reply)

    def _procs_cell(self, code: str) -> dict[str, Any]:
        cell = self._sandbox.run_cell(
            code,
            timeout_s=OP_TIMEOUT_S,
            hard_deadline=self._born + self.max_lifetime_s,
            scope=CellScope(name=SCOPE),
        )
        self._last_active = time.monotonic()
        if self._sandbox.ended is not None:
            self._end(self._sandbox.ended)
        self._wake.set()
        if cell.outcome is not Outcome.OK:
            raise InfraError(f"the session's process manager did not answer: {cell.reason}")
        lines = cell.stdout.decode("utf-8", errors="replace").split("\n")
        for line in reversed(lines):
            if line.startswith(_MARK):
                try:
                    reply = json.loads(line[len(_MARK) :])
                except ValueError:
                    break
                if isinstance(reply, dict):
                    return reply
                break
        raise InfraError("the session's process manager sent no reply")

    def _record_end(self, ended: object) -> None:
        """The end of a background process, as a run of its command in the record: its exit
        status, how long it ran, and the last bytes of each stream (:data:`END_TAIL`; the rest
        was the readers'). Told once by the manager, with any reply after it exited."""
        if not isinstance(ended, dict):
            raise InfraError("the session's process manager sent a malformed end")
        info = _info(ended)
        out, err = _chunk(ended.get("stdout")), _chunk(ended.get("stderr"))
        command = info.command or shlex.join(info.argv)
        request = replace(self.request, code=command, language="bash")
        prepared = prepare(
            request,
            self.profile,
            wheels=self.executor.wheels,
            backend=lambda _: self._sandbox.backend,
        )
        if info.signal is not None:
            outcome, how = Outcome.KILLED, f"was ended by signal {info.signal}"
        elif info.exit_code == 0:
            outcome, how = Outcome.OK, "exited with 0"
        else:
            outcome, how = Outcome.ERROR, f"exited with {info.exit_code}"
        ended_at = ended.get("ended_at")
        wall_s = float(ended_at) - info.started_at if isinstance(ended_at, int | float) else 0.0
        br = BackendResult(
            outcome=outcome,
            exit_code=info.exit_code,
            signal=info.signal,
            stdout=out[0],
            stderr=err[0],
            stdout_truncated=out[1] > 0,
            stderr_truncated=err[1] > 0,
            usage=Usage(wall_ms=max(wall_s, 0.0) * 1000, cpu_ms=None, peak_memory_bytes=None),
            artifacts=(),
            rejected_exports=(),
            enforcement=self._sandbox.enforcement(),
            reason=f"the background process pid {info.pid} {how}"
            + (f" (started by run {info.run_id})" if info.run_id else ""),
        )
        run_id = uuid.uuid4().hex
        self._record(request, prepared, br, run_id, _now())
        # No surface is on the stack when a poller's read sees the end: the session's owner is
        # told through the same hook as its events (the service maps the run to its tenant).
        entry = self.executor.audit.get(run_id)
        if entry is not None:
            tell_listeners(self.executor, self.owner, entry)

    def _record(
        self,
        request: RunRequest,
        prepared: Any,
        br: BackendResult,
        run_id: str,
        started_at: str,
    ) -> None:
        finish(
            self.executor,
            request,
            br,
            _EMPTY,  # a background command has no declared result to validate
            prepared.policy,
            backend=prepared.backend,
            run_id=run_id,
            started_at=started_at,
            inputs=self._inputs_record,
            session_id=self.id,
        )


def _checked(reply: dict[str, Any]) -> dict[str, Any]:
    if reply.get("ok") is True:
        return reply
    kind, message = reply.get("kind"), str(reply.get("error", "no reason given"))[:2000]
    if kind == "not_found":
        raise ProcessNotFound(message)
    if kind in ("limit", "spawn", "no_pty", "no_stdin", "stdin_full"):
        raise SpawnFailed(message)
    raise InfraError(f"the session's process manager failed: {message}")


def _argv(cmd: str | Sequence[str]) -> tuple[list[str], str | None]:
    if isinstance(cmd, str):
        if not cmd.strip():
            raise ConfigError("spawn needs a command")
        return ["/bin/bash", "-l", "-c", cmd], cmd
    argv = [str(a) for a in cmd]
    if not argv or not argv[0]:
        raise ConfigError("spawn needs a command")
    return argv, None


def _size(rows: int, cols: int) -> tuple[int, int]:
    if not (0 < int(rows) < 65536 and 0 < int(cols) < 65536):
        raise ConfigError(f"a terminal's rows and cols must be 1 to 65535, not {rows}x{cols}")
    return int(rows), int(cols)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _info(r: Mapping[str, Any]) -> ProcessInfo:
    pid, argv, pty = r.get("pid"), r.get("argv"), r.get("pty")
    if not isinstance(pid, int) or not isinstance(argv, list):
        raise InfraError("the session's process manager sent a malformed process")
    size = None
    if isinstance(pty, list) and len(pty) == 2:
        size = (int(pty[0]), int(pty[1]))
    started, env = r.get("started_at"), r.get("env")
    return ProcessInfo(
        pid=pid,
        argv=tuple(str(a) for a in argv),
        command=r["command"] if isinstance(r.get("command"), str) else None,
        env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
        cwd=r["cwd"] if isinstance(r.get("cwd"), str) else None,
        tag=r["tag"] if isinstance(r.get("tag"), str) else None,
        run_id=r["run_id"] if isinstance(r.get("run_id"), str) else None,
        pty=size,
        stdin=bool(r.get("stdin")),
        started_at=float(started) if isinstance(started, int | float) else 0.0,
        exited=bool(r.get("exited")),
        exit_code=_int_or_none(r.get("exit_code")),
        signal=_int_or_none(r.get("signal")),
    )


def _chunk(c: object) -> tuple[bytes, int, int, int, bool]:
    """(data, offset, next, skipped, more) of one stream's read."""
    if not isinstance(c, dict):
        raise InfraError("the session's process manager sent a malformed read")
    data = base64.b64decode(str(c.get("data", "")))[:READ_BYTES]
    offset = _int_or_none(c.get("offset")) or 0
    end = _int_or_none(c.get("end")) or 0
    skipped = _int_or_none(c.get("skipped")) or 0
    nxt = offset + len(data)
    return data, offset, nxt, skipped, end > nxt


def _event(e: object) -> WatchEvent:
    if not isinstance(e, dict) or not isinstance(e.get("name"), str):
        raise InfraError("the session's process manager sent a malformed event")
    at = e.get("at")
    return WatchEvent(
        type=str(e.get("type")),
        name=e["name"],
        is_dir=bool(e.get("is_dir")),
        at=float(at) if isinstance(at, int | float) else 0.0,
    )


def _started(outcome: Outcome, reason: str, sandbox: CellSandbox) -> BackendResult:
    # Its output is the process's, read later: the run itself printed nothing.
    return BackendResult.not_run(outcome, reason, sandbox.enforcement())


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


__all__ = [
    "ProcessControl",
    "ProcessInfo",
    "ProcessNotFound",
    "ProcessOutput",
    "SpawnFailed",
    "SpawnRefused",
    "WatchEvent",
]
