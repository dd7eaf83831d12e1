"""A session becomes an E2B sandbox: the tenant's quota slot, the service's record of the
session, the registry's entry with its token and timeout, and the sandbox's setup.

Every way a sandbox starts goes through here: ``create`` (a new session, or one started from a
snapshot), ``connect`` resuming a paused one, and ``fork``.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from sandcell.backends.cell.state import PauseMode
from sandcell.e2b.errors import E2BError
from sandcell.e2b.fs_cells import cell_for, reply_of
from sandcell.e2b.labels import AutoPause, SandboxLabels
from sandcell.e2b.paths import HOME
from sandcell.e2b.registry import E2BSandbox, SandboxRegistry, new_token
from sandcell.e2b.runner import run_cell
from sandcell.errors import SandcellError
from sandcell.service.core import LiveSession, Service
from sandcell.service.tenants import Tenant
from sandcell.sessions import Session
from sandcell.spec import Outcome

__all__ = ["Opening", "adopt"]

log = logging.getLogger("sandcell.e2b")


@dataclass(frozen=True, slots=True, kw_only=True)
class Opening:
    """What the new sandbox is, as E2B clients see it."""

    template: str
    metadata: Mapping[str, str]
    env: Mapping[str, str]
    timeout_s: float
    auto_pause: AutoPause = "off"
    token: str | None = None
    """Its access token; None: a new one (a resumed sandbox keeps its own)."""
    started_at: dt.datetime | None = None
    """None: now (a resumed sandbox keeps its start)."""
    remembered: SandboxLabels | None = None
    """What the state it came back from kept of its sandbox: with the state's memory, the
    kernel is already set up (its directory, environment and code contexts)."""
    env_added: Mapping[str, str] = field(default_factory=dict)
    """Variables to give a kernel restored with its memory (a sandbox started from a snapshot
    with ``envVars`` of its own)."""


async def adopt(
    service: Service,
    registry: SandboxRegistry,
    tenant: Tenant,
    session: Session,
    opening: Opening,
    *,
    pause_on_failure: PauseMode | None = None,
) -> E2BSandbox:
    """``session`` (holding one of the tenant's slots) as a running E2B sandbox of the tenant,
    set up. When that fails the error is raised and the session ends, or, with
    ``pause_on_failure`` (a resumed sandbox), is paused again in that mode, so a failed
    resume does not lose the sandbox."""
    live = LiveSession(
        tenant=tenant.id,
        session=session,
        inputs_dir=None,
        surface="e2b",
        # The access token lasts as long as this key: rotating it ends the sandbox
        # (SandboxRegistry), and a paused one comes back with a new token.
        key_sha256=tenant.key_sha256,
    )
    service.add_session(live)
    box = E2BSandbox(
        id=session.id,
        tenant=tenant.id,
        template=opening.template,
        live=live,
        token=opening.token or new_token(),
        workspace="",
        metadata=dict(opening.metadata),
        env=dict(opening.env),
        started_at=opening.started_at or dt.datetime.now(dt.UTC),
        deadline=time.monotonic() + opening.timeout_s,
        auto_pause=opening.auto_pause,
    )
    restored = session.restored_from
    with_memory = restored is not None and restored.saved.mode is PauseMode.MEMORY
    remembered = opening.remembered if with_memory else None
    registry.add(box)
    try:
        if opening.auto_pause == "memory" and PauseMode.MEMORY not in session.pause_modes:
            raise E2BError(
                400,
                "lifecycle on_timeout mode 'full' pauses with the interpreter's memory, which "
                "this sandbox's rung does not keep (namespaces: files only); use mode "
                "'filesystem', or leave the mode out",
            )
        if remembered is not None:
            box.workspace = remembered.workspace
            box.restore_contexts(remembered)
            await _give_env(service, tenant, box, opening.env_added)
        else:
            await _setup(service, tenant, box)
        box.remember()
    except BaseException:
        await service.in_thread(lambda: _undo(registry, box, pause_on_failure), session=True)
        raise
    return box


def _undo(registry: SandboxRegistry, box: E2BSandbox, pause_in: PauseMode | None) -> None:
    if pause_in is not None:
        try:
            registry.pause(box, pause_in, by="e2b: its resume could not finish")
            return
        except SandcellError:
            log.warning("e2b sandbox %s could not be paused again after its resume failed", box.id)
    registry.kill(box, "its setup failed")


async def _setup(service: Service, tenant: Tenant, box: E2BSandbox) -> None:
    """Learn where the workspace is inside the sandbox, and give the kernel the sandbox's
    environment variables (commands get them on their own)."""
    service.admit(tenant, sandbox=False)
    # Every rung shows the workspace at /home/user too (layout.SANDBOX_HOME): E2B code starts
    # there, as it would in an E2B sandbox, and the kernel's directory is the workspace's path
    # from then on.
    # PWD too: the home and /sandbox are one directory, so a shell would trust an inherited
    # PWD=/sandbox and print that.
    code = f"import os as _o\n_o.chdir({HOME!r})\n_o.environ['PWD'] = {HOME!r}\ndel _o\n"
    code += cell_for("pwd", "")
    if box.env:
        code = f"import os as _o\n_o.environ.update({box.env!r})\ndel _o\n" + code
    reply = reply_of(await run_cell(service, tenant, box, code), "/")
    root = reply.get("root")
    if not isinstance(root, str) or not root.startswith("/"):
        raise E2BError(500, "the sandbox did not say where its workspace is")
    box.workspace = root


async def _give_env(
    service: Service, tenant: Tenant, box: E2BSandbox, env: Mapping[str, str]
) -> None:
    """Add ``env`` to a kernel restored with its memory (the rest of it is as it was)."""
    if not env:
        return
    service.admit(tenant, sandbox=False)
    code = f"import os as _o\n_o.environ.update({dict(env)!r})\ndel _o\n"
    result = await run_cell(service, tenant, box, code)
    if result.outcome is not Outcome.OK:
        raise E2BError(500, f"the sandbox did not take its environment: {result.reason}")
