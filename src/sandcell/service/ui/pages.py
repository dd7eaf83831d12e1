"""The ``/ui`` pages: log in with a tenant's key, read the approval queue, approve or deny a run
or a tool call, read a run's record, check the audit chain.

Either of a tenant's keys logs in: its API key (the submitter's) or one of its approver keys.
Approving takes an approver's session, or the submitter's where the run's profile lets it
(:mod:`sandcell.service.approving`, the same check as ``/v1``). Anonymous login steps are
limited per client address (:class:`~sandcell.service.ui.browser_sessions.LoginLimiter`).

A small Starlette application mounted on the service (not FastAPI routes: these are pages, not
API, and they answer errors as pages, not problem documents). It calls the same
:class:`~sandcell.service.core.Service` the JSON API does, under the same scoping: an approval,
run, record, artifact or tool call that is not mapped to the session's tenant is answered 404,
exactly like one that does not exist.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Route

from sandcell.errors import SandcellError
from sandcell.policy.approvals import STATUSES, ApprovalError, Ticket
from sandcell.policy.tool_tickets import ToolTicket
from sandcell.service import tool_approvals
from sandcell.service.approving import check_may_approve_run
from sandcell.service.core import RunState, Service
from sandcell.service.kept_bytes import kept_stdin
from sandcell.service.paging import Page
from sandcell.service.problems import ServiceProblem
from sandcell.service.run_approvals import owned_approvals_page
from sandcell.service.tenants import Principal, Tenant
from sandcell.service.ui.browser_sessions import BrowserSession, BrowserSessions, LoginLimiter
from sandcell.service.ui.guard import (
    COOKIE,
    FILE_CSP,
    UI_PATH,
    FormRefused,
    SecurityHeaders,
    check_form,
    clear_cookie,
    read_form,
    set_cookie,
)
from sandcell.service.ui.render import page
from sandcell.service.ui.views import (
    RunView,
    approval_view,
    artifacts_of,
    run_view,
    tool_ticket_view,
)
from sandcell.spec import RunResult
from sandcell.wire import error_wire

__all__ = ["create_ui"]

log = logging.getLogger("sandcell.service")
_STYLE = (Path(__file__).with_name("static") / "ui.css").read_bytes()
_LIST_LIMIT = 200
_RUNS_PAGE = 50
_REFRESH_S = 1
_Endpoint = Callable[[Request], Awaitable[Response]]


class _LoginRequired(SandcellError):
    """No session, or one not logged in: the page sends the browser to the login form."""


class _TooManyLogins(SandcellError):
    """An address past its anonymous login steps (answered 429 with ``Retry-After``)."""

    def __init__(self, wait_s: int) -> None:
        super().__init__(wait_s)
        self.wait_s = wait_s


def _see_other(path: str) -> RedirectResponse:
    return RedirectResponse(UI_PATH + path, status_code=303)


def _error_page(status: int, detail: str, headers: dict[str, str] | None = None) -> Response:
    return page(
        "error.html",
        {"base": UI_PATH, "status": status, "detail": detail, "tenant": None, "csrf": ""},
        status=status,
        headers=headers,
    )


def _guarded(endpoint: _Endpoint) -> _Endpoint:
    """Answer every failure of a page as a page: the login form for a browser that is not
    logged in, 403 for a refused form, the status and text of a service problem, a sandcell
    error's status in :mod:`sandcell.wire` (as the API answers it), and 500 with no internals
    for anything unexpected (logged with its traceback)."""

    async def handle(request: Request) -> Response:
        try:
            return await endpoint(request)
        except _LoginRequired:
            return _see_other("/login")
        except _TooManyLogins as exc:
            return _error_page(
                429,
                f"too many login attempts from your address; wait {exc.wait_s} s and try again",
                {"Retry-After": str(exc.wait_s)},
            )
        except FormRefused as exc:
            return _error_page(403, f"refused: {exc}")
        except ServiceProblem as exc:
            return _error_page(exc.status, exc.detail, exc.headers)
        except ApprovalError as exc:
            return _error_page(409, str(exc))  # decided meanwhile: the page's own conflict
        except Exception as exc:
            row = error_wire(exc)  # the API's status for the same error (sandcell.wire)
            if row.public:
                return _error_page(row.http_status, str(exc))
            kind = "sandcell error" if isinstance(exc, SandcellError) else "unexpected error"
            log.error("%s on %s %s", kind, request.method, request.url.path, exc_info=exc)
            return _error_page(row.http_status, row.detail)

    return handle


class _Ui:
    """The pages of one service."""

    def __init__(self, service: Service, sessions: BrowserSessions, logins: LoginLimiter) -> None:
        self.service = service
        self.sessions = sessions
        self.logins = logins

    # -- sessions --------------------------------------------------------------------------

    def _session(self, request: Request) -> BrowserSession | None:
        return self.sessions.get(request.cookies.get(COOKIE))

    def _principal_of(self, session: BrowserSession | None) -> Principal:
        if session is None or session.tenant is None:
            raise _LoginRequired
        principal = self.service.tenants.principal_with_key(session.tenant, session.key_sha256)
        if principal is None:
            # Removed, or its key rotated, since login: the session ends with the key.
            self.sessions.end(session.id)
            raise _LoginRequired
        return principal

    def _logged_in(self, request: Request) -> tuple[BrowserSession, Tenant]:
        session = self._session(request)
        tenant = self._principal_of(session).tenant
        assert session is not None
        return session, tenant

    async def _post(self, request: Request) -> tuple[BrowserSession, Principal, dict[str, str]]:
        """A checked form post of a logged-in session: same origin, the session's token."""
        session = self._session(request)
        # Checked before the body is read: a post without a logged-in session is not read.
        if session is None:
            raise FormRefused("no session: load the page again (or log in) and resend the form")
        if session.tenant is None:
            raise _LoginRequired
        form = await read_form(request)
        check_form(request, session, form)
        principal = self._principal_of(session)
        return session, principal, form

    @staticmethod
    def _address(request: Request) -> str:
        return request.client.host if request.client is not None else "unix"

    def _limit_login(self, request: Request) -> None:
        """Count an anonymous login step of the request's address, or refuse it (429)."""
        wait = self.logins.take(self._address(request))
        if wait is not None:
            raise _TooManyLogins(wait)

    def _context(self, session: BrowserSession, tenant: Tenant, **extra: Any) -> dict[str, Any]:
        return {"base": UI_PATH, "tenant": tenant.name, "csrf": session.csrf, **extra}

    # -- scoping ---------------------------------------------------------------------------

    def _ticket(self, tenant: Tenant, approval_id: str) -> Ticket:
        # The exact id only: the store also finds a prefix, which must not let a tenant probe
        # for another's tickets.
        if not self.service.tenants.owns(tenant.id, "approval", approval_id):
            raise ServiceProblem(404, f"no approval {approval_id!r}")
        return self.service.executor.approvals.get(approval_id)

    def _tool_ticket(self, tenant: Tenant, ticket_id: str) -> ToolTicket:
        # The API's scoping (/v1/tool-approvals): the same tickets either way.
        return tool_approvals.owned_ticket(self.service, tenant, ticket_id)

    def _record(self, tenant: Tenant, run_id: str) -> dict[str, Any]:
        """The record of a run of the tenant's, with its place in the chain (404 otherwise)."""
        if not self.service.tenants.owns(tenant.id, "run", run_id):
            raise ServiceProblem(404, f"no run {run_id!r}")
        entry = self.service.executor.audit.get(run_id)
        if entry is None:
            raise ServiceProblem(404, f"no record of run {run_id!r}")
        return {
            "record": dict(entry.record),
            "seq": entry.seq,
            "hash": entry.hash,
            "prev_hash": entry.prev_hash,
        }

    def _artifact_path(self, tenant: Tenant, run_id: str, sha256: str) -> tuple[Path, Any]:
        """The stored file of an artifact the run's record names and the tenant still keeps."""
        found = self._record(tenant, run_id)
        named = [a for a in artifacts_of(found["record"]) if a.sha256 == sha256]
        if not named or not self.service.tenants.owns(tenant.id, "artifact", sha256):
            raise ServiceProblem(404, f"no artifact {sha256!r} in run {run_id!r}")
        path = self.service.executor.store.path_for(sha256)
        if not path.is_file():
            raise ServiceProblem(404, f"artifact {sha256!r} is no longer stored")
        return path, named[0]

    # -- login -----------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        session = self._session(request)
        if session is not None and session.tenant is not None:
            return _see_other("/")
        return self._login_page(request, session, status=200, problem=None)

    def _login_page(
        self,
        request: Request,
        session: BrowserSession | None,
        *,
        status: int,
        problem: str | None,
    ) -> Response:
        fresh = session is None
        if session is None:
            self._limit_login(request)
            session = self.sessions.new(None)
        response = page(
            "login.html",
            {"base": UI_PATH, "tenant": None, "csrf": session.csrf, "problem": problem},
            status=status,
        )
        if fresh:
            set_cookie(response, request, session)
        return response

    async def login(self, request: Request) -> Response:
        # An address past its steps is refused before its form is read or its key looked up;
        # only a wrong key counts as a step (a person who logs in is not held back).
        wait = self.logins.wait_s(self._address(request))
        if wait is not None:
            raise _TooManyLogins(wait)
        session = self._session(request)
        form = await read_form(request)
        check_form(request, session, form)
        assert session is not None
        key = form.get("key", "").strip()
        principal = self.service.tenants.authenticate_principal(key) if key else None
        if principal is None:
            self._limit_login(request)
            return self._login_page(
                request, session, status=401, problem="unknown or revoked API key"
            )
        # A new id at login: whatever id the browser had before never becomes a logged-in one.
        self.sessions.end(session.id)
        response = _see_other("/")
        logged_in = self.sessions.new(principal.tenant.id, key_sha256=principal.key_sha256)
        set_cookie(response, request, logged_in)
        return response

    async def logout(self, request: Request) -> Response:
        session = self._session(request)
        form = await read_form(request)
        check_form(request, session, form)
        assert session is not None
        self.sessions.end(session.id)
        response = _see_other("/login")
        clear_cookie(response, request)
        return response

    # -- the queue -------------------------------------------------------------------------

    async def queue(self, request: Request) -> Response:
        session, tenant = self._logged_in(request)
        status = request.query_params.get("status", "pending")
        if status != "all" and status not in STATUSES:
            choices = ", ".join((*STATUSES, "all"))
            raise ServiceProblem(400, f"status {status!r}: choose one of {choices}")
        service = self.service
        cursor = request.query_params.get("cursor") or None
        tools_cursor = request.query_params.get("tools_cursor") or None

        def read() -> tuple[Page[Ticket], Page[ToolTicket]]:
            # Pages of a bounded cost, off the event loop (as /v1/approvals and
            # /v1/tool-approvals).
            runs = owned_approvals_page(service, tenant, status, limit=_LIST_LIMIT, cursor=cursor)
            calls = tool_approvals.owned_tickets_page(
                service, tenant, "pending", limit=_LIST_LIMIT, cursor=tools_cursor
            )
            return runs, calls

        runs, calls = await service.in_thread(read)
        approvals = [approval_view(t) for t in runs.items]
        tools = [tool_ticket_view(t) for t in calls.items]
        return page(
            "queue.html",
            self._context(
                session,
                tenant,
                status=status,
                statuses=(*STATUSES, "all"),
                approvals=approvals,
                tools=tools,
                next_cursor=runs.next_cursor,
                tools_next_cursor=calls.next_cursor,
            ),
        )

    # -- run approvals -----------------------------------------------------------------------

    async def approval(self, request: Request) -> Response:
        session, tenant = self._logged_in(request)
        ticket = self._ticket(tenant, request.path_params["approval_id"])
        return page("approval.html", self._context(session, tenant, a=approval_view(ticket)))

    async def approve(self, request: Request) -> Response:
        _, principal, form = await self._post(request)
        tenant = principal.tenant
        ticket = self._ticket(tenant, request.path_params["approval_id"])
        if ticket.status != "pending":
            raise ServiceProblem(409, f"approval {ticket.id!r} is {ticket.status}, not pending")
        check_may_approve_run(principal, ticket)
        service = self.service
        service.admit(tenant, sandbox=True)
        state = service.new_run(tenant)
        state.stdin = kept_stdin(ticket.request)
        who = f"{principal.who} (browser)"
        reason = form.get("reason", "").strip()

        def call(run_id: str) -> RunResult:
            return service.executor.run_approved(ticket.id, by=who, reason=reason, run_id=run_id)

        def cleanup(result: RunResult | None) -> None:
            if result is not None:  # it ran (or was refused for good): the inputs are done with
                service.settle_approval(tenant.id, ticket)

        # The run goes on without the browser: its page follows it until it has a record.
        service.start(state, call, cleanup=cleanup)
        return _see_other(f"/runs/{state.id}")

    async def deny(self, request: Request) -> Response:
        _, principal, form = await self._post(request)
        tenant = principal.tenant
        ticket = self._ticket(tenant, request.path_params["approval_id"])
        reason = form.get("reason", "").strip()
        if not reason:
            raise ServiceProblem(400, "reason: say why the run is denied (the requester reads it)")
        service = self.service
        who = f"{principal.who} (browser)"
        result: RunResult = await service.in_thread(
            lambda: service.executor.deny_approval(ticket.id, reason=reason, by=who)
        )
        service.own_result(tenant.id, result)
        service.settle_approval(tenant.id, ticket)
        return _see_other(f"/approvals/{ticket.id}")

    # -- tool calls --------------------------------------------------------------------------

    async def tool(self, request: Request) -> Response:
        session, tenant = self._logged_in(request)
        ticket = self._tool_ticket(tenant, request.path_params["ticket_id"])
        return page("tool.html", self._context(session, tenant, t=tool_ticket_view(ticket)))

    async def approve_tool(self, request: Request) -> Response:
        return await self._decide_tool(request, approve=True)

    async def deny_tool(self, request: Request) -> Response:
        return await self._decide_tool(request, approve=False)

    async def _decide_tool(self, request: Request, *, approve: bool) -> Response:
        _, principal, form = await self._post(request)
        ticket = await tool_approvals.decide(
            self.service,
            principal,
            request.path_params["ticket_id"],
            approve=approve,
            reason=form.get("reason", ""),
            surface=" (browser)",
        )
        return _see_other(f"/tools/{ticket.id}")

    # -- runs and records ----------------------------------------------------------------------

    async def runs(self, request: Request) -> Response:
        session, tenant = self._logged_in(request)
        try:
            offset = max(0, int(request.query_params.get("offset", "0")))
        except ValueError:
            raise ServiceProblem(400, "offset: a whole number") from None
        service = self.service

        def read() -> list[RunView]:
            # A page of reads of the log: in a worker thread, not on the event loop.
            found = []
            for run_id in service.tenants.owned(tenant.id, "run", limit=_RUNS_PAGE, offset=offset):
                entry = service.executor.audit.get(run_id)
                if entry is not None:
                    found.append(run_view(entry.record))
            return found

        rows: list[RunView] = await service.in_thread(read)
        return page(
            "runs.html",
            self._context(
                session,
                tenant,
                rows=rows,
                offset=offset,
                next_offset=offset + _RUNS_PAGE,
                more=len(rows) == _RUNS_PAGE,
            ),
        )

    async def run(self, request: Request) -> Response:
        session, tenant = self._logged_in(request)
        run_id = request.path_params["run_id"]
        state: RunState | None = self.service.state_for(tenant, run_id)
        if state is not None and not state.done.is_set():
            return page(
                "running.html",
                self._context(session, tenant, run_id=run_id, status=state.status),
                headers={"Refresh": str(_REFRESH_S)},
            )
        if (
            state is not None
            and state.error is not None
            and self.service.executor.audit.get(run_id) is None
        ):
            # Refused after it was accepted (say, approved twice at once): no record, a reason.
            failure = run_view(state.result or {"run_id": run_id, "outcome": "error"})
            return page("run.html", self._context(session, tenant, r=failure, recorded=False))
        found = self._record(tenant, run_id)
        view = run_view(
            found["record"], seq=found["seq"], hash_=found["hash"], prev_hash=found["prev_hash"]
        )
        return page("run.html", self._context(session, tenant, r=view, recorded=True))

    async def image(self, request: Request) -> Response:
        _, tenant = self._logged_in(request)
        path, artifact = self._artifact_path(
            tenant, request.path_params["run_id"], request.path_params["sha256"]
        )
        if not artifact.image:
            raise ServiceProblem(404, "not an image: download it instead")
        return FileResponse(
            path,
            media_type=artifact.media_type,
            headers={"Content-Security-Policy": FILE_CSP, "Cache-Control": "private, max-age=3600"},
        )

    async def file(self, request: Request) -> Response:
        _, tenant = self._logged_in(request)
        path, artifact = self._artifact_path(
            tenant, request.path_params["run_id"], request.path_params["sha256"]
        )
        # Always a download of opaque bytes: the file's type and name came from the program.
        return FileResponse(
            path,
            media_type="application/octet-stream",
            filename=artifact.name,
            headers={"Content-Security-Policy": FILE_CSP},
        )

    async def audit(self, request: Request) -> Response:
        session, tenant = self._logged_in(request)
        service = self.service
        # The API's verification (/v1/audit/verify): its own process, one per tenant at a time.
        found = await service.audit_verifications.verify(tenant.id)
        return page(
            "audit.html",
            self._context(
                session,
                tenant,
                ok=found.ok,
                count=found.count,
                problems=found.problems,
                other_problems=found.other_problems,
            ),
        )

    async def style(self, request: Request) -> Response:
        return Response(
            _STYLE, media_type="text/css", headers={"Cache-Control": "public, max-age=3600"}
        )


async def _not_found(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    detail = "no such page" if status == 404 else str(getattr(exc, "detail", "refused"))
    return _error_page(status, detail)


def create_ui(service: Service) -> Starlette:
    """The pages of ``service``, to mount at :data:`~sandcell.service.ui.guard.UI_PATH`."""
    ui = _Ui(service, BrowserSessions(), LoginLimiter())

    def get(path: str, endpoint: _Endpoint) -> Route:
        return Route(path, _guarded(endpoint), methods=["GET"])

    def post(path: str, endpoint: _Endpoint) -> Route:
        return Route(path, _guarded(endpoint), methods=["POST"])

    routes = [
        get("/", ui.queue),
        get("/login", ui.login_form),
        post("/login", ui.login),
        post("/logout", ui.logout),
        get("/approvals/{approval_id}", ui.approval),
        post("/approvals/{approval_id}/approve", ui.approve),
        post("/approvals/{approval_id}/deny", ui.deny),
        get("/tools/{ticket_id}", ui.tool),
        post("/tools/{ticket_id}/approve", ui.approve_tool),
        post("/tools/{ticket_id}/deny", ui.deny_tool),
        get("/runs", ui.runs),
        get("/runs/{run_id}", ui.run),
        get("/runs/{run_id}/images/{sha256}", ui.image),
        get("/runs/{run_id}/files/{sha256}", ui.file),
        get("/audit", ui.audit),
        get("/static/ui.css", ui.style),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(SecurityHeaders)],
        exception_handlers={HTTPException: _not_found},
    )
    app.state.browser_sessions = ui.sessions
    return app
