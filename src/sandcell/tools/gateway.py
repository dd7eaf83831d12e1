"""The tool gateway of one run: every check and the upstream call, served on a Unix socket.

Usage::

    with ToolGateway(profile=p.name, tools=p.tools, socket_path=path, approver=ask) as gw:
        ...                          # the sandbox reaches ``path`` (bound in, 0600)
    report = gw.report               # every request, for the run record
    gw.secrets                       # for the leak scan of the run's output

The host CLI calls :meth:`ToolGateway.execute` directly: the same checks, without the socket.

For each call, in order: the tool and operation are in the profile (``allow``); the arguments
are within the size limit; the call is within the tool's rate and total; the arguments fit the
operation's schema (and, for HTTP, a ``METHOD /path`` rule); a person approves when the profile
says so; then the upstream is called with the credential read from the host environment when the
gateway was built. The arguments are fixed as one canonical JSON text before the checks: that
text is what is checked, what the approver is shown in full, what is hashed and what is sent,
and its hash is compared with the approved one right before the upstream call. The result
must fit the size limit and has the gateway's secrets redacted.
Nothing the program sends can grant itself anything: unknown request fields are refused.

Why threads (``socketserver``) rather than asyncio as in the egress proxy: a call blocks on an
approval or an upstream for seconds and the SDK runs its own event loop per call; calls are few
(a rate limit per tool) and capped at :attr:`max_concurrent` at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from sandcell.errors import ConfigError, InfraError, SandcellError
from sandcell.tools.approval import ApprovalRequest, Approver, ask
from sandcell.tools.counters import CallCounter
from sandcell.tools.definitions import HttpTool, ToolDefinition
from sandcell.tools.protocol import (
    MAX_FRAME,
    ProtocolError,
    Request,
    encode,
    parse_request,
    read_frame,
    write_frame,
)
from sandcell.tools.records import (
    Decision,
    GatewayReport,
    ToolCallRecord,
    canonical,
    digest,
    text_digest,
)
from sandcell.tools.schema import argument_problem
from sandcell.tools.upstream import Operation, Upstream, UpstreamError
from sandcell.validation.redact import Redactor

MAX_SOCKET_PATH = 107
_FRAME_OVERHEAD = 4096  # the request's own fields around the arguments


class _Refused(SandcellError):
    def __init__(self, decision: Decision, reason: str, approver: str | None = None) -> None:
        super().__init__(reason)
        self.decision, self.reason, self.approver = decision, reason, approver


class ToolGateway:
    """One run's tools. Build, :meth:`start` to serve the socket, :meth:`stop` for the report.

    Raises (when built):
        ConfigError: a tool's credential is not set in ``environ``, or the socket path is bad.
    """

    def __init__(
        self,
        *,
        profile: str,
        tools: Sequence[ToolDefinition],
        approver: Approver | None = None,
        approval_timeout_s: float = 60.0,
        environ: Mapping[str, str] | None = None,
        socket_path: Path | None = None,
        socket_mode: int = 0o600,
        idle_timeout_s: float = 30.0,
        max_concurrent: int = 8,
        max_records: int = 4096,
    ) -> None:
        env = os.environ if environ is None else environ
        self.profile = profile
        self.socket_path = socket_path
        self.max_concurrent = max_concurrent
        self._tools = {t.name: t for t in tools}
        self._approver = approver
        self._approval_timeout_s = approval_timeout_s
        self._mode = socket_mode
        self._idle_s = idle_timeout_s
        self._max_records = max_records
        credentials: dict[str, str | None] = {}
        for tool in tools:
            if tool.credential_env is None:
                credentials[tool.name] = None
                continue
            value = env.get(tool.credential_env)
            if not value:
                raise ConfigError(
                    f"tool {tool.name} of profile {profile} needs its credential in "
                    f"${tool.credential_env}, which is not set on the host"
                )
            credentials[tool.name] = value
        self._secrets = tuple(sorted({v for v in credentials.values() if v}))
        self._redactor = Redactor(self._secrets, patterns=())
        self._upstreams = {t.name: _upstream(t, credentials[t.name]) for t in tools}
        self._counters = {t.name: CallCounter(t.limits) for t in tools}
        self._frame_limit = min(
            MAX_FRAME,
            max((t.limits.max_request_bytes for t in tools), default=0) + _FRAME_OVERHEAD,
        )
        self._lock = threading.Lock()
        self._records: list[ToolCallRecord] = []
        self._unrecorded = 0
        self._seq = 0
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._report: GatewayReport | None = None
        if socket_path is not None and len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:
            raise ConfigError(
                f"tool socket path {str(socket_path)!r} is longer than {MAX_SOCKET_PATH} bytes"
            )

    @property
    def secrets(self) -> tuple[str, ...]:
        """The credentials the gateway holds: give them to the leak scan of the run's output
        (``known_secrets`` of :func:`sandcell.validation.check_output`)."""
        return self._secrets

    @property
    def records(self) -> tuple[ToolCallRecord, ...]:
        """The requests so far."""
        with self._lock:
            return tuple(self._records)

    @property
    def report(self) -> GatewayReport:
        """The report of a stopped gateway.

        Raises:
            InfraError: if it has not been stopped.
        """
        if self._report is None:
            raise InfraError("the tool gateway's report is ready only once it has stopped")
        return self._report

    # ----------------------------------------------------------------------------------------
    # Serving

    def __enter__(self) -> ToolGateway:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Listen on the socket path; returns once connections are accepted.

        Raises:
            ConfigError: no socket path was given, it exists, or its directory does not.
            InfraError: the socket could not be bound.
        """
        path = self.socket_path
        if path is None:
            raise ConfigError("the tool gateway needs a socket_path to serve")
        if self._server is not None:
            raise InfraError("the tool gateway was started already; use one per run")
        if path.exists() or path.is_symlink():
            raise ConfigError(f"tool socket path {str(path)!r} exists; give each run a new path")
        if not path.parent.is_dir():
            raise ConfigError(f"the directory of tool socket {str(path)!r} does not exist")
        try:
            server = _Server(os.fsencode(path), self)
            os.chmod(path, self._mode)
        except OSError as exc:
            raise InfraError(f"the tool gateway cannot listen on {path}: {exc}") from exc
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="sandcell-tool-gateway",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> GatewayReport:
        """Stop serving, remove the socket, close the upstreams; the report. Idempotent."""
        if self._report is not None:
            return self._report
        if self._server is not None:
            server = self._server
            stopper = threading.Thread(target=server.shutdown, daemon=True)
            stopper.start()
            # Wake the serving loop now rather than at its next poll (this is on every run's
            # result path): a shut-down listener is readable and its accept fails at once.
            with contextlib.suppress(OSError):
                server.socket.shutdown(socket.SHUT_RDWR)
            stopper.join()
            server.server_close()
            if self.socket_path is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.socket_path.unlink()
        for upstream in self._upstreams.values():
            upstream.close()
        with self._lock:
            self._report = GatewayReport(
                profile=self.profile, records=tuple(self._records), unrecorded=self._unrecorded
            )
        return self._report

    def serve_connection(self, conn: socket.socket) -> None:
        """Answer one request on ``conn`` (a connection from the sandbox)."""
        if not self._slots.acquire(blocking=False):
            self._answer(conn, {"ok": False, "error": "too many tool calls at once; retry"})
            return
        try:
            conn.settimeout(self._idle_s)
            started = time.time()
            try:
                body = read_frame(conn, self._frame_limit)
                request = parse_request(body)
            except (ProtocolError, TimeoutError, OSError) as exc:
                reason = str(exc) or type(exc).__name__
                self._record_invalid(reason, started)
                self._answer(conn, {"ok": False, "error": reason})
                return
            self._answer(conn, self.execute(request, request_bytes=len(body)))
        finally:
            self._slots.release()

    @staticmethod
    def _answer(conn: socket.socket, answer: Mapping[str, object]) -> None:
        with contextlib.suppress(OSError):
            write_frame(conn, encode(answer))

    # ----------------------------------------------------------------------------------------
    # The checks and the call

    def execute(self, request: Request, *, request_bytes: int) -> dict[str, object]:
        """Answer one checked request: ``{"ok": true, "result": ...}`` or ``{"ok": false,
        "error": ...}``. Every request is recorded. Used by the socket and the host CLI."""
        started, t0 = time.time(), time.monotonic()
        args_hash = digest(request.args) if request.op == "call" else None
        try:
            try:
                result, approver = (
                    (self._list(), None) if request.op == "list" else self._call(request)
                )
            except _Refused:
                raise
            except Exception as exc:  # a defect must fail this call, never the gateway
                raise _Refused("failed", f"tool gateway error ({type(exc).__name__})") from None
        except _Refused as refusal:
            error, _ = self._redact(refusal.reason)
            self._record(
                ToolCallRecord(
                    seq=0,
                    operation=request.op,
                    tool=request.tool,
                    args_sha256=args_hash,
                    result_sha256=None,
                    decision=refusal.decision,
                    reason=str(error),
                    approver=refusal.approver,
                    request_bytes=request_bytes,
                    result_bytes=0,
                    redactions=0,
                    started_at=started,
                    duration_s=time.monotonic() - t0,
                )
            )
            return {"ok": False, "error": error}
        safe, redactions = self._redact(result)
        size = len(encode(safe))
        self._record(
            ToolCallRecord(
                seq=0,
                operation=request.op,
                tool=request.tool,
                args_sha256=args_hash,
                result_sha256=digest(safe),
                decision="allowed",
                reason="ok",
                approver=approver,
                request_bytes=request_bytes,
                result_bytes=size,
                redactions=redactions,
                started_at=started,
                duration_s=time.monotonic() - t0,
            )
        )
        return {"ok": True, "result": safe}

    def _list(self) -> list[dict[str, object]]:
        entries: list[dict[str, object]] = []
        for name, tool in self._tools.items():
            try:
                operations = self._upstreams[name].operations()
            except UpstreamError as exc:
                entries.append({"name": name, "error": str(exc)})
                continue
            for op in operations:
                entries.append(
                    {
                        "name": f"{name}.{op.name}",
                        "description": op.description,
                        "input_schema": dict(op.input_schema),
                        "approval": tool.approval_for(op.name),
                    }
                )
        return entries

    def _call(self, request: Request) -> tuple[object, str | None]:
        name, _, op_name = request.tool.partition(".")
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            raise _Refused(
                "refused", f"no tool {name!r} in profile {self.profile} (tools: {known})"
            )
        if isinstance(tool, HttpTool):
            op_name = op_name or "request"
            allowed: tuple[str, ...] = ("request",)
        else:
            allowed = tool.allow
        if op_name not in allowed:
            raise _Refused(
                "refused",
                f"{name}.{op_name} is not in the allow list of tool {name} in profile "
                f"{self.profile} (allowed: {', '.join(allowed) or 'nothing'})",
            )
        full = f"{name}.{op_name}"
        # One text is checked, shown to the approver, hashed and sent: the arguments are
        # re-read from it wherever they are used, so the call that runs is the call approved.
        exact = canonical(request.args)
        args_sha256 = text_digest(exact)
        args: dict[str, object] = json.loads(exact)
        size = len(encode(args))
        if size > tool.limits.max_request_bytes:
            raise _Refused(
                "refused",
                f"the arguments are {size} bytes, above {full}'s limit of "
                f"{tool.limits.max_request_bytes}",
            )
        over = self._counters[name].admit()
        if over is not None:
            raise _Refused("refused", f"{full}: {over}")
        operation = self._operation(name, op_name)
        problem = argument_problem(operation.input_schema, args)
        if problem is not None:
            raise _Refused("refused", f"the arguments of {full} do not fit its schema: {problem}")
        if isinstance(tool, HttpTool):
            from sandcell.tools.http_tool import allow_problem

            problem = allow_problem(tool, args)
            if problem is not None:
                raise _Refused("refused", problem)
        approver: str | None = None
        if tool.approval_for(op_name) == "always":
            outcome = ask(
                self._approver,
                ApprovalRequest(profile=self.profile, tool=full, args_json=exact),
                self._approval_timeout_s,
            )
            decision = outcome.decision
            if decision is None:
                raise _Refused("refused", outcome.reason)
            if not decision.approved:
                raise _Refused("denied", outcome.reason, decision.approver)
            if decision.args_sha256 not in (None, args_sha256):
                raise _Refused(
                    "refused",
                    f"{full}: the approval ({decision.approver}) is of arguments with sha256 "
                    f"{decision.args_sha256}, not of this call's ({args_sha256}); refused",
                )
            approver = decision.approver
        # Read back from the one text that was checked, shown and hashed: a checker cannot have
        # changed what is sent.
        to_send: dict[str, object] = json.loads(exact)
        try:
            result = self._upstreams[name].call(op_name, to_send)
        except UpstreamError as exc:
            raise _Refused("failed", str(exc), approver) from None
        size = len(encode(result))
        if size > tool.limits.max_result_bytes:
            raise _Refused(
                "failed",
                f"the result of {full} is {size} bytes, above its limit of "
                f"{tool.limits.max_result_bytes}",
                approver,
            )
        return result, approver

    def _operation(self, name: str, op_name: str) -> Operation:
        try:
            operations = self._upstreams[name].operations()
        except UpstreamError as exc:
            raise _Refused("failed", str(exc)) from None
        for op in operations:
            if op.name == op_name:
                return op
        raise _Refused("refused", f"the upstream of tool {name} offers no {op_name!r}")

    def _redact(self, value: object) -> tuple[object, int]:
        count = 0

        def walk(item: object) -> object:
            nonlocal count
            if isinstance(item, str):
                text, leaks = self._redactor.scan_text(item)
                count += len(leaks)
                return text
            if isinstance(item, list | tuple):
                return [walk(v) for v in item]
            if isinstance(item, Mapping):
                return {walk(k): walk(v) for k, v in item.items()}
            return item

        return walk(value), count

    def _record(self, record: ToolCallRecord) -> None:
        with self._lock:
            self._seq += 1
            if len(self._records) >= self._max_records:
                self._unrecorded += 1
                return
            fields = record.to_record() | {"seq": self._seq}
            self._records.append(ToolCallRecord(**fields))  # type: ignore[arg-type]

    def _record_invalid(self, reason: str, started: float) -> None:
        self._record(
            ToolCallRecord(
                seq=0,
                operation="invalid",
                tool="",
                args_sha256=None,
                result_sha256=None,
                decision="refused",
                reason=reason,
                approver=None,
                request_bytes=0,
                result_bytes=0,
                redactions=0,
                started_at=started,
                duration_s=time.time() - started,
            )
        )


def _upstream(tool: ToolDefinition, credential: str | None) -> Upstream:
    if isinstance(tool, HttpTool):
        from sandcell.tools.http_tool import HttpUpstream

        return HttpUpstream(tool, credential)
    from sandcell.tools.mcp_tool import McpUpstream

    return McpUpstream(tool, credential)


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.server.gateway.serve_connection(self.request)


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, address: bytes, gateway: ToolGateway) -> None:
        self.gateway = gateway
        super().__init__(address, _Handler)
