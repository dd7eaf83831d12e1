"""The MCP tools for sessions that last: ``session_pause``, ``session_resume`` and
``session_fork``, beside ``session_open`` / ``session_run`` / ``session_close``
(:mod:`sandcell.mcp.tools`).

A paused session outlives the connection that opened it: its state is saved under the data
directory, owned by the authenticated client (the service's tenant; no one over stdio), and any
connection of the same client resumes or forks it by its id; another client's is "not found".
A resumed or forked session belongs to the connection that brought it back, as an opened one
does. Each copy of a fork is its own session start, admitted (and counted) as
``session_open`` is, so the service's quotas hold for every copy.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Annotated, Literal

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, TextContent
from pydantic import Field

from sandcell.backends.cell.state import PauseMode
from sandcell.errors import ConfigError
from sandcell.mcp.inputs import StagedInputs
from sandcell.sessions import Session
from sandcell.sessions.saving import MAX_FORKS
from sandcell.sessions.states import StateNotFound, StoredState

if TYPE_CHECKING:
    from sandcell.mcp.tools import SandcellTools

__all__ = ["LastingTools"]

SessionId = Annotated[str, Field(description="the session's id (session_open returned it)")]
Mode = Annotated[
    Literal["memory", "files"] | None,
    Field(
        description="memory: variables, imports and files; files: the workspace's files only, "
        "variables start empty (default: memory where the sandbox offers it, else files)"
    ),
]


def _mode(session: Session, mode: str | None) -> PauseMode:
    if mode is not None:
        return PauseMode(mode)
    return PauseMode.MEMORY if PauseMode.MEMORY in session.pause_modes else PauseMode.FILES


class LastingTools:
    """``session_pause``, ``session_resume``, ``session_fork`` over one server's tools (its
    executor, its registry of sessions, its hooks)."""

    def __init__(self, tools: SandcellTools) -> None:
        self._tools = tools

    def _by(self) -> str:
        owner = self._tools.state_owner()
        return "mcp" if owner is None else f"mcp:{owner}"

    def _paused(self, session_id: str) -> StoredState:
        """The client's paused session ``session_id``, under a profile it may still use."""
        owner = self._tools.state_owner()
        state = self._tools.executor.states.get(session_id, owner=owner)
        if state.kind != "paused":
            raise StateNotFound(f"no paused session {session_id}")
        offered = self._tools.offered_profiles()
        if state.settings.profile not in offered:
            raise ConfigError(
                f"session {session_id} runs under profile {state.settings.profile!r}, which "
                f"this server no longer offers to this client ({', '.join(offered)})"
            )
        return state

    async def session_pause(
        self, session_id: SessionId, ctx: Context, mode: Mode = None
    ) -> CallToolResult:
        """Pause an open session: its state is saved and its sandbox stops, so it holds no
        memory or CPU; session_resume brings it back under the same id, also from a later
        connection. Use it to keep work across a break."""
        from sandcell.mcp.tools import _thread, _tool_errors

        with _tool_errors("session_pause"):
            session = self._tools.sessions.get(session_id, self._tools.owner_of(ctx))
            chosen = _mode(session, mode)
            state = await self._tools.admitted("save", session.pause, mode=chosen, by=self._by())
            await _thread(self._tools.sessions.forget, session_id)
            summary = state.summary()
            return CallToolResult(
                content=[
                    TextContent(
                        text=f"session {session_id} is paused ({chosen.value} kept, "
                        f"{state.stored_bytes} bytes, until {summary['expires_at']}); resume it "
                        "with session_resume"
                    )
                ],
                structured_content={"session_id": session_id, **summary},
            )

    async def session_resume(self, session_id: SessionId, ctx: Context) -> CallToolResult:
        """Bring a paused session back under its id: in memory mode its variables and imports
        are there, in files mode its files (variables start empty)."""
        from sandcell.mcp.tools import _thread, _tool_errors

        with _tool_errors("session_resume"):
            owner = self._tools.owner_of(ctx)
            self._tools.sessions.check_room(owner)
            state = await _thread(self._paused, session_id)
            session = await self._tools.admitted(
                "session",
                self._tools.executor.resume,
                session_id,
                owner=self._tools.state_owner(),
                by=self._by(),
            )
            # Its paused self may still be listed (an idle pause not swept yet): its inputs
            # are kept for this session.
            await _thread(self._tools.sessions.forget, session_id)
            self._tools.sessions.add(session, owner, self._tools.sessions.kept_inputs(session_id))
            return CallToolResult(
                content=[
                    TextContent(
                        text=f"session {session_id} is back ({state.saved.mode.value} kept, "
                        f"{state.cells} cells before); run cells with session_run"
                    )
                ],
                structured_content={"session_id": session_id, "mode": state.saved.mode.value},
            )

    async def session_fork(
        self,
        session_id: SessionId,
        ctx: Context,
        n: Annotated[int, Field(ge=1, le=MAX_FORKS, description="how many copies (1 to 20)")] = 1,
        mode: Mode = None,
    ) -> CallToolResult:
        """Copy an open or a paused session into n new sessions, each with its own id, to try
        different things from the same point; the original goes on (or stays paused)."""
        from sandcell.mcp.tools import _thread, _tool_errors

        with _tool_errors("session_fork"):
            owner = self._tools.owner_of(ctx)
            self._tools.sessions.check_room(owner, adding=n)
            copies: list[Session] = []
            try:
                live = self._tools.sessions.get(session_id, owner)
            except ConfigError:
                live = None
            if live is None:
                await _thread(self._paused, session_id)
            chosen = None if mode is None else PauseMode(mode)
            try:
                for _ in range(n):
                    copies.append(
                        await self._tools.admitted(
                            "session", self._fork_one, session_id, live, chosen
                        )
                    )
            except BaseException:
                for copy in copies:
                    with contextlib.suppress(Exception):
                        await _thread(copy.close)
                raise
            for copy in copies:
                self._tools.sessions.add(copy, owner, StagedInputs((), None))
            ids = [c.id for c in copies]
            return CallToolResult(
                content=[
                    TextContent(
                        text=f"session {session_id} forked into {', '.join(ids)}; run cells in "
                        "each with session_run"
                    )
                ],
                structured_content={"session_id": session_id, "forks": ids},
            )

    def _fork_one(self, session_id: str, live: Session | None, mode: PauseMode | None) -> Session:
        """One copy, on the worker thread (admitted as one session start)."""
        if live is not None:
            return live.fork(1, mode=mode or _mode(live, None), by=self._by())[0]
        return self._tools.executor.fork_paused(
            session_id, 1, owner=self._tools.state_owner(), by=self._by()
        )[0]
