"""JavaScript and TypeScript cells of the code interpreter: ``run_code(code, language="js")``
(or ``"javascript"``, ``"ts"``, ``"typescript"``) and the cells of a JavaScript or TypeScript
context, each run in its context's Node session (:mod:`sandcell.e2b.node_kernels`).

A cell's output is streamed as it is written; its value is the main result (``text``, and
``json`` for an array or plain object, as the Node kernel shows them); an error is ``name``,
``value`` (its message) and ``traceback`` (its stack). A cell that runs past the profile's
wall time is interrupted (the context's state is kept) and reported as a ``TimeoutError``; a
cell whose client goes away (``run_code``'s ``timeout``, enforced by the SDK) is interrupted
too, so the context is free for the next one.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from sandcell.e2b.errors import E2BError, from_exception
from sandcell.e2b.live import Done, follow
from sandcell.e2b.node_kernels import DEFAULT_KEYS, ender
from sandcell.e2b.node_results import node_report_at, split_node_error
from sandcell.e2b.paths import HOME
from sandcell.e2b.registry import Context, E2BSandbox
from sandcell.e2b.results import HeldReport, error_message, messages, ndjson, stream_message
from sandcell.e2b.runner import OutputListener
from sandcell.service.core import Service
from sandcell.service.saved_sessions import take_slots
from sandcell.service.tenants import Tenant
from sandcell.sessions import Session
from sandcell.spec import Language, Outcome, RunResult

__all__ = ["NODE_CONTEXT_NOTE", "node_kernel", "node_key", "node_stream", "restart_node"]

NODE_CONTEXT_NOTE = (
    "a JavaScript or TypeScript context is a Node session of its own (another sandbox of the "
    "same profile): its files, /home/user included, are not the sandbox's, and its state ends "
    "when the sandbox pauses"
)
"""Said in a created context's reply (a key the SDKs do not read, for whoever reads the wire)."""


def node_key(language: Language, context: Context | None) -> str:
    return context.id if context is not None else DEFAULT_KEYS[language]


def _setup_code(cwd: str, env: dict[str, str]) -> str:
    # Its directory made and entered, the sandbox's environment given; `undefined` last, so
    # the cell shows no value.
    return (
        f'require("node:fs").mkdirSync({json.dumps(cwd)}, {{ recursive: true }});\n'
        f"process.chdir({json.dumps(cwd)});\n"
        f"process.env.PWD = {json.dumps(cwd)};\n"
        f"Object.assign(process.env, {json.dumps(env)});\n"
        "undefined;\n"
    )


def _open(
    service: Service, tenant: Tenant, box: E2BSandbox, language: Language, cwd: str
) -> Session:
    """A Node session for a context of ``box`` (blocking), holding one of the tenant's slots."""
    take_slots(service, tenant, 1)
    try:
        session = service.executor.session(
            profile=box.session.profile,
            language=language,
            # The sandbox's timeout ends it (SandboxRegistry); these cover a day, E2B's longest.
            idle_timeout_s=86_400.0,
            max_lifetime_s=86_400.0,
            owner=tenant.id,
        )
    except BaseException:
        service.quotas.release(tenant.id)
        raise
    try:
        setup = session.run(_setup_code(cwd, box.env))
        service.own_result(tenant.id, setup)
        if setup.outcome is not Outcome.OK:
            raise E2BError(500, f"the {language} context did not start: {setup.reason}")
    except BaseException:
        ender(service, tenant.id, "its setup failed")(session)
        raise
    return session


def node_kernel(
    service: Service,
    tenant: Tenant,
    box: E2BSandbox,
    language: Language,
    context: Context | None,
) -> Session:
    """The context's Node session, opened when it has none (blocking)."""
    cwd = context.cwd if context is not None else HOME
    return box.node.kernel(
        node_key(language, context),
        lambda: _open(service, tenant, box, language, cwd),
        ender(service, tenant.id, "its context was restarted"),
    )


def restart_node(service: Service, box: E2BSandbox, context_id: str) -> None:
    """End the context's kernel (blocking): its next cell opens a fresh one."""
    box.node.drop(context_id, ender(service, box.tenant, "its context was restarted"))


def _env_cells(env: dict[str, str]) -> tuple[str, str]:
    """The cells that set ``env`` before a cell and put the old values back after it, as the
    SDK's per-call ``envs`` are scoped."""
    names = json.dumps(sorted(env))
    before = (
        f"globalThis.__sandcell_saved = Object.fromEntries({names}.map((k) => "
        "[k, process.env[k]]));\n"
        f"Object.assign(process.env, {json.dumps(env)});\n"
        "undefined;\n"
    )
    after = (
        "for (const [k, v] of Object.entries(globalThis.__sandcell_saved)) {\n"
        "  if (v === undefined) delete process.env[k]; else process.env[k] = v;\n"
        "}\n"
        "delete globalThis.__sandcell_saved;\n"
        "undefined;\n"
    )
    return before, after


def _run(
    service: Service,
    tenant: Tenant,
    session: Session,
    code: str,
    *,
    env: dict[str, str],
    listener: OutputListener,
) -> RunResult:
    if not env:
        return session.run(code, on_output=listener)
    before, after = _env_cells(env)
    service.own_result(tenant.id, session.run(before))
    try:
        return session.run(code, on_output=listener)
    finally:
        service.own_result(tenant.id, session.run(after))


async def node_stream(
    service: Service,
    tenant: Tenant,
    box: E2BSandbox,
    session: Session,
    code: str,
    *,
    env: dict[str, str],
) -> AsyncIterator[bytes]:
    """The cell's NDJSON stream, its output live."""

    async def start(listener: OutputListener) -> RunResult:
        began = time.monotonic()
        result: RunResult = await service.in_thread(
            lambda: _run(service, tenant, session, code, env=env, listener=listener), session=True
        )
        service.own_result(tenant.id, result)
        service.metrics.finished(result.outcome.value, time.monotonic() - began)
        return result

    held = HeldReport(node_report_at)
    finished = False
    try:
        async for item in follow(start, keepalive_s=None):
            if isinstance(item, tuple):
                now = held.feed(*item)
                if now:
                    yield ndjson(stream_message(item[0], now))
            elif isinstance(item, Done):
                finished = True
                if box.ended is not None:
                    # As a Python cell's: a cut stream reads as the sandbox killed meanwhile.
                    raise E2BError(502, f"the sandbox ended while the cell ran: {box.ended}")
                for message in _ending(service, session, item, held):
                    yield ndjson(message)
    finally:
        if not finished:
            # The client went away (run_code's timeout): the cell stops, its state is kept.
            session.cancel("its client went away (run_code's timeout)")


def _ending(
    service: Service, session: Session, done: Done, held: HeldReport
) -> list[dict[str, Any]]:
    if done.error is not None or done.result is None:
        err = from_exception(done.error) if isinstance(done.error, Exception) else None
        return [error_message("SandboxError", err.message if err else "the cell could not run")]
    return list(
        messages(
            done.result,
            execution_count=session.cells,
            streamed=held,
            read=lambda sha: service.executor.store.path_for(sha).read_bytes(),
            split=split_node_error,
        )
    )
