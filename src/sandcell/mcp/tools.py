"""The MCP tools: each a thin layer over one :class:`~sandcell.executor.Executor`.

``run_python`` / ``run_bash`` / ``run_javascript`` / ``run_typescript`` run one program in a
fresh sandbox, ``session_open`` / ``session_run`` / ``session_close`` keep one sandbox across
cells, ``list_profiles`` lists the policy profiles and ``get_artifact`` returns a stored file.
The executor is synchronous: every call to it runs on a worker thread, so one slow run never
blocks the server's event loop.

Errors are tool results with ``isError`` and a sentence saying what was wrong and how to fix it,
then the error's code and whether a retry can help, from :mod:`sandcell.wire`
(:func:`_tool_errors`); nothing of a traceback reaches the client.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio
import anyio.to_thread
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.connection import Connection
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.request_state import authenticated_principal
from mcp.types import CallToolResult, ElicitResult, InputRequiredResult, TextContent
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from sandcell.errors import ConfigError, SandcellError
from sandcell.executor import Executor
from sandcell.mcp import approval
from sandcell.mcp.content import ContentLimits, artifact_content, run_content
from sandcell.mcp.inputs import MAX_INLINE_BYTES, InputItem, StagedInputs, stage_inputs
from sandcell.mcp.sessions import McpSessions
from sandcell.policy.approvals import Ticket
from sandcell.policy.profiles import Profile, list_profiles, load_profile
from sandcell.sessions import Session
from sandcell.spec import Artifact, IsolationMode, Language, Outcome, RunRequest, RunResult
from sandcell.wire import mcp_message

log = logging.getLogger("sandcell.mcp")

_T = TypeVar("_T")
ToolResult = CallToolResult | InputRequiredResult

Code = Annotated[str, Field(description="the program text")]
Inputs = Annotated[
    list[InputItem] | None,
    Field(description="files shown read-only under /inputs/NAME (and in the working directory)"),
]
Timeout = Annotated[
    float | None,
    Field(gt=0, description="wall-time limit in seconds (default: the profile's)"),
]
ProfileName = Annotated[
    str | None,
    Field(description="policy profile: one list_profiles offers (default: the server's)"),
]
SessionId = Annotated[str, Field(description="the id session_open returned")]
SessionLanguage = Annotated[
    Literal["python", "javascript", "typescript"],
    Field(
        description="the language of the session's cells: python (default; bash cells too), "
        "or javascript or typescript (Node.js 22, the node runtime's packages)"
    ),
]
Exports = Annotated[
    list[str] | None,
    Field(
        description="globs of files, relative to the working directory, to keep as artifacts "
        "(e.g. out/*.csv; the profile says which it allows); fetch them with get_artifact"
    ),
]


@dataclass(frozen=True, slots=True, kw_only=True)
class McpSettings:
    """What an MCP server allows beyond the executor's own policy."""

    input_roots: tuple[Path, ...] = ()
    """Host directories whose files a client may name as inputs by path (none: inline only)."""
    max_inline_input_bytes: int = MAX_INLINE_BYTES
    content: ContentLimits = field(default_factory=ContentLimits)
    approval_timeout_s: float = 600.0
    """How long a run waits for the client's user to answer an approval question."""
    elicit_approvals: bool = True
    """Ask the client's user to approve a waiting run where the client can ask; False leaves
    every such run in the approval queue for ``sandcell approve`` (the client never decides)."""
    mode: IsolationMode = IsolationMode.STRICT
    """How limits are enforced (``rlimits``: the named weaker mode, for hosts without cgroups)."""
    max_sessions_per_client: int = 4
    profiles: tuple[str, ...] = ()
    """Profiles a client may name besides the executor's own (none: only that one). The model
    picks the argument, so a profile that checks less (``unchecked``) is never its to choose
    unless the person running the server offered it."""
    tenant_profiles: Callable[[str], Sequence[str]] | None = None
    """For an authenticated client (its token's client id: the tenant), the profiles it may
    name, its default first; replaces the executor's profile and ``profiles`` for it."""
    admit: Callable[[str | None, str], AbstractContextManager[object]] | None = None
    """Called with the tenant (the authenticated client id, None without authentication) and
    what is about to happen (``run``, ``session`` for opening one, ``cell``), on the worker
    thread, around each call that runs code: the service's quotas. An exception from entering
    it refuses the call, its message (or ``detail``) becoming the tool error."""
    made: Callable[[str | None, RunResult | Session], None] | None = None
    """Called with the tenant and what a call made (each result: runs, cells, decided
    approvals; each session opened), on the worker thread, inside ``admit``'s context where
    there is one: the service maps results to the tenant (records, artifacts, CPU used) and
    holds a session's sandbox slot until the session ends."""
    may_approve: Callable[[str | None, Ticket], str | None] | None = None
    """Called with the tenant and a held run before its client is asked to decide it: None
    lets the client decide; a reason leaves the run waiting for someone else (the service: the
    key that submitted a run approves it only where its profile says so). None here: the
    client's user decides (one local user: stdio)."""
    artifacts: Literal["store", "own"] = "store"
    """``store``: any artifact of the data directory (one local user: stdio); ``own``: only
    those of runs this server made for the same principal (a shared service)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_roots", tuple(p.resolve() for p in self.input_roots))
        if self.approval_timeout_s <= 0 or self.max_sessions_per_client < 1:
            raise ConfigError(
                "approval_timeout_s must be positive and max_sessions_per_client at least 1"
            )


@contextlib.contextmanager
def _tool_errors(tool: str) -> Iterator[None]:
    """Every failure as a tool error with a sentence for the model, never a traceback."""
    try:
        yield
    except ToolError:
        raise
    except SandcellError as exc:
        # The SDK prefixes "Error executing tool NAME: ".
        raise ToolError(mcp_message(exc)) from None
    except Exception:
        log.exception("tool %s failed", tool)
        raise ToolError(
            "sandcell failed internally (the server's log has the details); the call may be "
            "retried, and a run that did happen is in the record (sandcell audit list)"
        ) from None


async def _thread(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


class SandcellTools:
    """The tool functions of one MCP server over one executor."""

    def __init__(self, executor: Executor, settings: McpSettings | None = None) -> None:
        self.executor = executor
        self.settings = settings or McpSettings()
        self.sessions = McpSessions(max_per_owner=self.settings.max_sessions_per_client)
        self._lock = threading.Lock()
        self._runs: dict[str, Hashable] = {}
        """run id -> principal, of the latest :data:`REMEMBERED` runs made here."""
        self._artifacts: dict[tuple[Hashable, str], Artifact] = {}
        """(principal, sha256) -> the artifact, of the same runs."""
        self._waiting: dict[str, StagedInputs] = {}
        """approval id -> the inline inputs its stored request points at, kept until decided."""
        self.ends_with_process = False
        """Whether this server's process is its client's connection (stdio)."""

    # -- one-shot runs ----------------------------------------------------------------------

    async def run_python(
        self,
        code: Code,
        ctx: Context,
        *,
        inputs: Inputs = None,
        timeout_s: Timeout = None,
        profile: ProfileName = None,
        exports: Exports = None,
    ) -> ToolResult:
        """Run a Python program in a fresh sandbox (no network, no secrets, hard limits) and
        return its stdout, stderr and outcome; figures come back as images and DataFrames as
        tables (the last expression's value is shown, as in a notebook). Nothing persists
        between calls: use session_open for state."""
        with _tool_errors("run_python"):
            return await self._run(
                "python",
                code,
                ctx,
                inputs=inputs,
                timeout_s=timeout_s,
                profile=profile,
                exports=exports,
            )

    async def run_bash(
        self,
        code: Code,
        ctx: Context,
        *,
        inputs: Inputs = None,
        timeout_s: Timeout = None,
        profile: ProfileName = None,
        exports: Exports = None,
    ) -> ToolResult:
        """Run a bash script in a fresh sandbox (no network, no secrets, hard limits) and
        return its stdout, stderr and outcome."""
        with _tool_errors("run_bash"):
            return await self._run(
                "bash",
                code,
                ctx,
                inputs=inputs,
                timeout_s=timeout_s,
                profile=profile,
                exports=exports,
            )

    async def run_javascript(
        self,
        code: Code,
        ctx: Context,
        *,
        inputs: Inputs = None,
        timeout_s: Timeout = None,
        profile: ProfileName = None,
        exports: Exports = None,
    ) -> ToolResult:
        """Run a JavaScript program with Node.js 22 in a fresh sandbox (no network, no
        secrets, hard limits) and return its stdout, stderr and outcome. It may require or
        import Node's built-in modules and the locked packages lodash, date-fns, zod,
        papaparse, csv-parse and yaml; it cannot start child processes, workers or native
        addons. A file with import or top-level await runs as an ES module."""
        with _tool_errors("run_javascript"):
            return await self._run(
                "javascript",
                code,
                ctx,
                inputs=inputs,
                timeout_s=timeout_s,
                profile=profile,
                exports=exports,
            )

    async def run_typescript(
        self,
        code: Code,
        ctx: Context,
        *,
        inputs: Inputs = None,
        timeout_s: Timeout = None,
        profile: ProfileName = None,
        exports: Exports = None,
    ) -> ToolResult:
        """Run a TypeScript program with Node.js 22 in a fresh sandbox, as run_javascript
        does: the types are stripped, not checked (no enums or namespaces, which need more
        than stripping), and the same modules and packages are there."""
        with _tool_errors("run_typescript"):
            return await self._run(
                "typescript",
                code,
                ctx,
                inputs=inputs,
                timeout_s=timeout_s,
                profile=profile,
                exports=exports,
            )

    async def _run(
        self,
        language: Language,
        code: str,
        ctx: Context,
        *,
        inputs: list[InputItem] | None,
        timeout_s: float | None,
        profile: str | None,
        exports: list[str] | None,
    ) -> ToolResult:
        retried = approval.approval_from_state(ctx.request_state)
        if retried is not None:
            # The 2026-era second round: the answer to the question asked in round one.
            return await self._answered(retried, ctx)
        prof = self._profile(profile)
        staged = stage_inputs(
            inputs,
            self.settings.input_roots,
            max_inline_bytes=self.settings.max_inline_input_bytes,
        )
        try:
            request = RunRequest(
                code=code,
                language=language,
                inputs=staged.files,
                exports=tuple(exports or ()),
                limits=prof.limits_for({"wall_time_s": timeout_s}),
                display=language == "python",
                mode=self.settings.mode,
            )
            result = await self._admitted("run", self.executor.run, request, profile=prof)
        except BaseException:
            staged.close()
            raise
        self._remember(result, ctx)
        if result.outcome is not Outcome.AWAITING_APPROVAL:
            staged.close()
            return await self._content(result)
        ticket_id = _approval_id(result)
        with self._lock:
            self._waiting[ticket_id] = staged
        return await self._ask(ticket_id, result, ctx)

    # -- approvals --------------------------------------------------------------------------

    async def _ask(self, ticket_id: str, waiting: RunResult, ctx: Context) -> ToolResult:
        if not (self.settings.elicit_approvals and _can_elicit(ctx)):
            return await self._content(waiting, note=approval.pending_note(ticket_id))
        ticket = await _thread(self.executor.approvals.get, ticket_id)
        refused = self._refused_decision(ticket, ctx)
        if refused is not None:
            return await self._content(waiting, note=refused)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return approval.input_required(ticket)
        answer: Any = None
        with anyio.move_on_after(self.settings.approval_timeout_s):
            try:
                answer = await ctx.elicit(approval.question(ticket), approval.ApprovalAnswer)
            except Exception as exc:  # the client failed to ask: the run stays waiting
                log.info("elicitation for approval %s failed: %r", ticket_id, exc)
                answer = None
        if answer is None or answer.action == "cancel":
            return await self._content(waiting, note=approval.pending_note(ticket_id))
        data = answer.data if answer.action == "accept" else None
        return await self._decide(ticket, answer.action, data, ctx)

    async def _answered(self, ticket_id: str, ctx: Context) -> ToolResult:
        responses = ctx.input_responses or {}
        raw = responses.get(approval.INPUT_KEY)
        ticket = await _thread(self.executor.approvals.get, ticket_id)
        refused = self._refused_decision(ticket, ctx)
        if refused is not None:
            raise ToolError(refused)
        if not isinstance(raw, ElicitResult) or raw.action == "cancel":
            return self._pending(ticket)
        data = None
        if raw.action == "accept":
            try:
                data = approval.ApprovalAnswer.model_validate(raw.content or {})
            except ValueError:
                raise ToolError(
                    "the approval answer must have decision 'approve' or 'deny' (and an "
                    "optional reason); answer the question again"
                ) from None
        return await self._decide(ticket, raw.action, data, ctx)

    async def _decide(
        self,
        ticket: Ticket,
        action: str,
        answer: approval.ApprovalAnswer | None,
        ctx: Context,
    ) -> ToolResult:
        if ticket.status != "pending":
            raise ToolError(
                f"approval {ticket.id} is already {ticket.status}; see it with sandcell "
                f"approvals show {ticket.id}"
            )
        params = ctx.session.client_params
        by = approval.approver_name(params.client_info.name if params is not None else None)
        if answer is not None and answer.decision == "approve":
            result = await self._admitted(
                "run", self.executor.run_approved, ticket.id, by=by, reason=answer.reason
            )
        else:
            why = (answer.reason if answer is not None else "") or (
                "declined in the MCP client" if action == "decline" else "denied"
            )
            # Recording a refusal starts nothing: no quota to admit, only a result to map.
            result = await self._admitted(
                None, self.executor.deny_approval, ticket.id, reason=why, by=by
            )
        # Decided: the stored request will not be run again, so its inline inputs can go (a
        # refusal above leaves the approval pending, and they stay for `sandcell approve`).
        with self._lock:
            staged = self._waiting.pop(ticket.id, None)
        if staged is not None:
            staged.close()
        self._remember(result, ctx)
        return await self._content(result)

    def _refused_decision(self, ticket: Ticket, ctx: Context) -> str | None:
        """Why this client may not decide ``ticket`` (None: it may)."""
        check = self.settings.may_approve
        if check is None:
            return None
        token = get_access_token()
        return check(token.client_id if token is not None else None, ticket)

    def _pending(self, ticket: Ticket) -> CallToolResult:
        return CallToolResult(
            content=[TextContent(text=approval.pending_note(ticket.id))],
            structured_content={"approval_id": ticket.id, "status": ticket.status},
        )

    # -- sessions ---------------------------------------------------------------------------

    async def session_open(
        self,
        ctx: Context,
        *,
        profile: ProfileName = None,
        inputs: Inputs = None,
        timeout_s: Annotated[
            float | None,
            Field(gt=0, description="default wall-time limit of each cell, in seconds"),
        ] = None,
        idle_timeout_s: Annotated[
            float | None,
            Field(gt=0, description="end the session after this long without a cell"),
        ] = None,
        max_lifetime_s: Annotated[
            float | None, Field(gt=0, description="end the session this long after it opened")
        ] = None,
        language: SessionLanguage = "python",
    ) -> CallToolResult:
        """Open a session: one sandbox kept alive across cells, so variables, imports and
        files persist (like a notebook kernel), in Python or, with language, JavaScript or
        TypeScript. It ends when session_close is called, when this client disconnects, or
        after its idle or lifetime limit."""
        with _tool_errors("session_open"):
            owner = self._owner(ctx)
            self.sessions.check_room(owner)
            prof = self._profile(profile)
            limits = prof.limits_for({"wall_time_s": timeout_s}) if timeout_s else None
            staged = stage_inputs(
                inputs,
                self.settings.input_roots,
                max_inline_bytes=self.settings.max_inline_input_bytes,
            )
            try:
                session = await self._admitted(
                    "session",
                    self.executor.session,
                    profile=prof,
                    limits=limits,
                    inputs=staged.files,
                    mode=self.settings.mode,
                    idle_timeout_s=idle_timeout_s,
                    max_lifetime_s=max_lifetime_s,
                    owner=self.state_owner(),
                    language=language,
                )
            except BaseException:
                staged.close()
                raise
            self.sessions.add(session, owner, staged)
            info = session.info()
            ends = (
                ", or when this connection closes"
                if isinstance(owner, Connection)
                else ", or when this server stops"
                if self.ends_with_process
                else ""
            )
            text = (
                f"{info.language} session {info.id} is open (profile {info.profile}, backend "
                f"{info.backend}); "
                f"run cells with session_run, end it with session_close. It ends by itself "
                f"after {info.idle_timeout_s:g} s without a cell, {info.max_lifetime_s:g} s "
                f"after it opened{ends}."
            )
            return CallToolResult(
                content=[TextContent(text=text)],
                structured_content={"session_id": info.id, **asdict(info)},
            )

    async def session_run(
        self,
        session_id: SessionId,
        code: Annotated[str, Field(description="the cell's Python code")],
        ctx: Context,
        timeout_s: Timeout = None,
        exports: Exports = None,
    ) -> CallToolResult:
        """Run one cell, in the session's language, in an open session; earlier cells'
        variables and files are there. Returns stdout, stderr and outcome; figures as images,
        DataFrames and JavaScript arrays of records as tables."""
        with _tool_errors("session_run"):
            session = self.sessions.get(session_id, self._owner(ctx))
            result = await self._admitted(
                "cell", session.run, code, timeout_s=timeout_s, exports=tuple(exports or ())
            )
            self._remember(result, ctx)
            return await self._content(result)

    async def session_close(self, session_id: SessionId, ctx: Context) -> CallToolResult:
        """Close an open session; its sandbox and everything in it are removed."""
        with _tool_errors("session_close"):
            end = await _thread(self.sessions.close, session_id, self._owner(ctx))
            return CallToolResult(
                content=[TextContent(text=f"session {session_id} is closed ({end.reason})")],
                structured_content={"session_id": session_id, "reason": end.reason},
            )

    # -- profiles and artifacts -------------------------------------------------------------

    async def list_profiles(self) -> CallToolResult:
        """The policy profiles this server offers (a run may name one): what each is for and
        whether its runs need a person's approval."""
        with _tool_errors("list_profiles"):
            offered = self._offered()
            summaries = [s for s in await _thread(list_profiles) if s.name in offered]
            rows = [asdict(s) for s in summaries]
            default = offered[0] if offered else None
            lines = [f"default profile: {default}"]
            for s in summaries:
                state = f"unusable: {s.problem}" if s.problem else f"approval {s.approval}"
                lines.append(f"{s.name}: {s.description} ({state})")
            return CallToolResult(
                content=[TextContent(text="\n".join(lines))],
                structured_content={"default": default, "profiles": rows},
            )

    async def get_artifact(
        self,
        ctx: Context,
        sha256: Annotated[
            str | None, Field(description="the artifact's SHA-256 (as a run result lists it)")
        ] = None,
        run_id: Annotated[str | None, Field(description="the run that produced it")] = None,
        path: Annotated[
            str | None, Field(description="its path in that run (e.g. display/0001.png)")
        ] = None,
    ) -> CallToolResult:
        """Fetch a file a run exported or displayed: text as text, images as image content,
        anything else as a binary resource (up to a size cap). Name it by sha256, or by run_id
        and path."""
        with _tool_errors("get_artifact"):
            artifact = await _thread(self._find_artifact, ctx, sha256, run_id, path)
            return await _thread(
                artifact_content, artifact, self.executor.store, self.settings.content
            )

    def _find_artifact(
        self, ctx: Context, sha256: str | None, run_id: str | None, path: str | None
    ) -> Artifact:
        if (sha256 is None) == (run_id is None) or (run_id is None) != (path is None):
            raise ConfigError("name the artifact by sha256, or by run_id and path (not both)")
        principal = _principal(ctx)
        if run_id is not None and path is not None:
            # Visibility first, by the exact id: a prefix lookup could name other runs.
            entry = self.executor.audit.get(run_id) if self._visible(run_id, principal) else None
            if entry is None:
                raise ConfigError(f"no run {run_id!r} here; use a run_id from a result")
            for a in _record_artifacts(entry.record):
                if a.path == path:
                    return a
            raise ConfigError(f"run {entry.run_id} has no artifact {path!r}; see its result")
        assert sha256 is not None
        known = self._known_artifact(sha256, principal)
        if known is not None:
            return known
        if self.settings.artifacts == "store" and self.executor.store.has(sha256):
            size = self.executor.store.path_for(sha256).stat().st_size
            return Artifact(path=sha256, sha256=sha256, size=size, media_type=_sniff(self, sha256))
        raise ConfigError(f"no artifact with sha256 {sha256!r} here; use one from a run result")

    def _known_artifact(self, sha256: str, principal: Hashable) -> Artifact | None:
        with self._lock:
            return self._artifacts.get((principal, sha256))

    def _visible(self, run_id: str, principal: Hashable) -> bool:
        if self.settings.artifacts == "store":
            return True
        with self._lock:
            return self._runs.get(run_id, _NOBODY) == principal

    # -- helpers ----------------------------------------------------------------------------

    def _offered(self) -> list[str]:
        """The profiles this request's client may name, its default first."""
        token = get_access_token()
        if token is not None and self.settings.tenant_profiles is not None:
            return list(self.settings.tenant_profiles(token.client_id))
        default = self.executor.profile.name
        return [default, *(p for p in self.settings.profiles if p != default)]

    def _profile(self, name: str | None) -> Profile:
        offered = self._offered()
        if not offered:
            raise ConfigError("this client may use no profile; ask the operator to grant one")
        chosen = offered[0] if name is None else name
        if chosen not in offered:
            raise ConfigError(
                f"profile {chosen!r} is not offered by this server (offered: "
                f"{', '.join(offered)}); name one of those, or leave profile out. The person "
                "running the server can offer more with --allow-profile NAME"
            )
        if chosen == self.executor.profile.name:
            return self.executor.profile
        return load_profile(chosen)

    async def _admitted(
        self, what: str | None, fn: Callable[..., _T], *args: Any, **kwargs: Any
    ) -> _T:
        """``fn`` on a worker thread, inside the ``admit`` hook where there is one (``what``
        None: none), what it made handed to the ``made`` hook."""
        guard = self.settings.admit if what is not None else None
        made = self.settings.made
        if guard is None and made is None:
            return await _thread(fn, *args, **kwargs)
        token = get_access_token()
        tenant = token.client_id if token is not None else None

        def guarded() -> _T:
            with contextlib.ExitStack() as stack:
                try:
                    if guard is not None and what is not None:
                        stack.enter_context(guard(tenant, what))
                except SandcellError:
                    raise  # a quota's 429 problem included: its row says "refused: ..."
                except Exception as exc:
                    # Another hook's own refusal: its words, as a tool error, not an internal
                    # failure.
                    detail = getattr(exc, "detail", None) or str(exc) or type(exc).__name__
                    raise ConfigError(f"refused: {detail}") from None
                out = fn(*args, **kwargs)
                if made is not None and isinstance(out, RunResult | Session):
                    made(tenant, out)
                return out

        return await _thread(guarded)

    async def _content(self, result: RunResult, *, note: str = "") -> CallToolResult:
        # Off the event loop: figures are read from the store.
        return await _thread(
            run_content, result, self.executor.store, self.settings.content, note=note
        )

    def _remember(self, result: RunResult, ctx: Context) -> None:
        principal = _principal(ctx)
        made = [*result.artifacts, *(a for o in result.outputs for a in o.artifacts)]
        with self._lock:
            self._runs[result.run_id] = principal
            for a in made:
                self._artifacts[(principal, a.sha256)] = a
            # Bounded: a long-lived service forgets its oldest runs (insertion order).
            while len(self._runs) > REMEMBERED:
                del self._runs[next(iter(self._runs))]
            while len(self._artifacts) > 4 * REMEMBERED:
                del self._artifacts[next(iter(self._artifacts))]

    @staticmethod
    def state_owner() -> str | None:
        """Whose a session's saved states are: the authenticated client's (the service's
        tenant id), or no one's (one local user: stdio, an open loopback server)."""
        token = get_access_token()
        return token.client_id if token is not None else None

    def _owner(self, ctx: Context) -> Hashable:
        """Who a session belongs to: the connection, where the protocol has one that lasts
        (its end closes the session); else the authenticated principal."""
        connection = _connection(ctx)
        if connection is None or connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return ("principal", _principal(ctx))
        if not connection.state.get("sandcell_sessions"):
            connection.state["sandcell_sessions"] = True
            connection.exit_stack.push_async_callback(self._connection_closed, connection)
        return connection

    async def _connection_closed(self, connection: Connection) -> None:
        closed = await _thread(self.sessions.close_owned, connection)
        if closed:
            log.info("closed %d session(s) of an MCP connection that ended", closed)

    def close(self) -> int:
        """Close every session this server opened (at shutdown); returns how many."""
        return self.sessions.close_all()

    # What the tools of sessions that last (sandcell.mcp.session_states) share with these.
    owner_of = _owner
    offered_profiles = _offered
    admitted = _admitted


_NOBODY = object()
REMEMBERED = 65536
"""Runs (and their artifacts) a server remembers for ``get_artifact`` with ``artifacts="own"``;
older ones are found only through the data directory (``artifacts="store"``)."""


def _principal(ctx: Context) -> Hashable:
    return authenticated_principal(ctx.request_context)


def _connection(ctx: Context) -> Connection | None:
    """The connection a request came on. SDK 2.3 documents ``Connection.exit_stack`` as the
    place for per-connection teardown but hands tool handlers only the per-request
    ``ServerSession``, which holds it privately; None if that ever changes (sessions then
    belong to the principal and end on their limits or at shutdown)."""
    found = getattr(ctx.request_context.session, "_connection", None)
    return found if isinstance(found, Connection) else None


def _can_elicit(ctx: Context) -> bool:
    caps = ctx.client_capabilities
    elicitation = caps.elicitation if caps is not None else None
    # A bare `elicitation: {}` (before modes existed) means form support; url-only does not.
    if elicitation is None or (elicitation.form is None and elicitation.url is not None):
        return False
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS or ctx.session.can_send_request


def _approval_id(result: RunResult) -> str:
    found = (result.policy or {}).get("approval")
    value = found.get("id") if isinstance(found, dict) else None
    if not isinstance(value, str):
        raise ConfigError("the run waits for approval but its result names no approval id")
    return value


def _record_artifacts(record: Mapping[str, object]) -> list[Artifact]:
    """A run's exported and displayed artifacts, from its record."""
    raw: list[Any] = list(_items(record.get("artifacts")))
    for output in _items(record.get("outputs")):
        if isinstance(output, dict):
            raw += list(_items(output.get("artifacts")))
    found: list[Artifact] = []
    for a in raw:
        if isinstance(a, dict):
            found.append(
                Artifact(
                    path=str(a.get("path")),
                    sha256=str(a.get("sha256")),
                    size=int(a.get("size") or 0),
                    media_type=str(a.get("media_type") or "application/octet-stream"),
                )
            )
    return found


def _items(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _sniff(tools: SandcellTools, sha256: str) -> str:
    """A media type for content known only by its digest (no run here names it)."""
    with tools.executor.store.path_for(sha256).open("rb") as f:
        head = f.read(4096)
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return "application/octet-stream"
    return "text/plain"
