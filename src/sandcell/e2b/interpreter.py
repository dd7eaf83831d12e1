"""The code interpreter: ``POST /execute`` (``run_code``) and the code contexts.

``run_code`` is one cell of the sandbox's session, answered as the interpreter's NDJSON stream
(:mod:`sandcell.e2b.results`), with the cell's output live when the session offers it. Python
runs as a cell, its IPython syntax (``!cmd``, magics) first translated into the plain Python
that the profile checks and the cell runs (:mod:`sandcell.e2b.ipython`); ``bash`` runs as a command;
JavaScript and TypeScript (``js``, ``ts``) run in a Node session of their context's own, whose
files are not the sandbox's (:mod:`sandcell.e2b.node_cells`). A Python context is a scope
of the session's kernel named by its id: its variables are its own (the default context is
the kernel's main namespace), its cells run in its working directory, restarting it empties it
and removing it drops it. It is a namespace, not a process
of its own: imported modules, ``os.environ`` and files are the sandbox's, shared by every
context (files are shared on E2B too). A bash context runs its commands in its directory.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from sandcell.e2b.access import sandbox_of, service_of
from sandcell.e2b.approval import approval_message, needs_approval, ticket_for
from sandcell.e2b.errors import E2BError, from_exception
from sandcell.e2b.ipython import IPythonSyntaxError, translate
from sandcell.e2b.live import Done, follow
from sandcell.e2b.node_cells import NODE_CONTEXT_NOTE, node_kernel, node_stream, restart_node
from sandcell.e2b.paths import e2b_path, workspace_relative
from sandcell.e2b.registry import Context, E2BSandbox
from sandcell.e2b.results import HeldReport, error_message, messages, ndjson, stream_message
from sandcell.e2b.runner import OutputListener, admit_cell, run_in_sandbox
from sandcell.e2b.shell import run_bash
from sandcell.e2b.wire import ContextBody, ExecuteBody, parse
from sandcell.service.core import Service
from sandcell.service.problems import ServiceProblem
from sandcell.service.tenants import Tenant
from sandcell.sessions import Session
from sandcell.spec import LANGUAGE_ALIASES, NODE_LANGUAGES, Language, RunResult

__all__ = ["interpreter_routes"]

_LANGUAGES: dict[str, Language] = {"python": "python", "bash": "bash", "sh": "bash"}


def _language(name: str | None) -> Language:
    language = _LANGUAGES.get((name or "python").lower())
    if language is not None:
        return language
    node = LANGUAGE_ALIASES.get((name or "").strip().lower())
    if node in NODE_LANGUAGES:
        return node
    raise E2BError(
        400,
        f"language {name!r} is not served by sandcell; use python, bash, js (javascript) "
        "or ts (typescript)",
    )


def _env_cells(env: dict[str, str]) -> tuple[str, str]:
    """The cells that set ``env`` before a cell and put the old values back after it, as the
    SDK's per-call ``envs`` are scoped."""
    names = sorted(env)
    before = (
        "import os as _sandcell_os\n"
        f"_sandcell_saved = {{k: _sandcell_os.environ.get(k) for k in {names!r}}}\n"
        f"_sandcell_os.environ.update({env!r})\n"
        "del _sandcell_os\n"
    )
    after = (
        "import os as _sandcell_os\n"
        "for _sandcell_k, _sandcell_v in _sandcell_saved.items():\n"
        "    if _sandcell_v is None:\n"
        "        _sandcell_os.environ.pop(_sandcell_k, None)\n"
        "    else:\n"
        "        _sandcell_os.environ[_sandcell_k] = _sandcell_v\n"
        "del _sandcell_os, _sandcell_saved, _sandcell_k, _sandcell_v\n"
    )
    return before, after


async def _stream(
    service: Service,
    tenant: Tenant,
    box: E2BSandbox,
    code: str,
    *,
    language: Language,
    env: dict[str, str],
    context: Context | None,
) -> AsyncIterator[bytes]:
    def start(listener: OutputListener) -> Any:
        def call(session: Session, extra: dict[str, Any]) -> RunResult:
            if language == "bash":
                return run_bash(
                    session,
                    code,
                    env={**box.env, **env},
                    cwd=context.path if context is not None else box.workspace,
                    timeout_s=None,
                    on_output=extra.get("on_output"),
                )
            if context is not None:
                extra = {**extra, "scope": context.id, "cwd": context.path}
            run: Any = session.run
            if not env:
                result: RunResult = run(code, **extra)
                return result
            before, after = _env_cells(env)
            service.own_result(tenant.id, session.run(before))
            try:
                result = run(code, **extra)
            finally:
                service.own_result(tenant.id, session.run(after))
            return result

        return run_in_sandbox(service, tenant, box, call, on_output=listener)

    held = HeldReport()
    async for item in follow(start, keepalive_s=None):
        if isinstance(item, tuple):
            now = held.feed(*item)
            if now:
                yield ndjson(stream_message(item[0], now))
        elif isinstance(item, Done):
            if box.ended is not None:
                # Cut the stream: the SDK reads a cut stream of a sandbox that is gone as
                # "the sandbox was killed while the request was in progress" (TimeoutException).
                raise E2BError(502, f"the sandbox ended while the cell ran: {box.ended}")
            for message in _ending(service, box, item, code, language=language, held=held):
                yield ndjson(message)


def _ending(
    service: Service,
    box: E2BSandbox,
    done: Done,
    code: str,
    *,
    language: Language,
    held: HeldReport,
) -> list[dict[str, Any]]:
    if done.error is not None or done.result is None:
        err = from_exception(done.error) if isinstance(done.error, Exception) else None
        return [error_message("SandboxError", err.message if err else "the cell could not run")]
    result = done.result
    if needs_approval(result):
        ticket = ticket_for(service, box, result, code, language)
        return [
            error_message("ApprovalRequired", approval_message(ticket, result)),
            {"type": "end_of_execution"},
        ]
    return list(
        messages(
            result,
            execution_count=box.session.cells,
            streamed=held,
            read=lambda sha: service.executor.store.path_for(sha).read_bytes(),
        )
    )


async def execute(request: Request) -> Response:
    box = sandbox_of(request)
    service = service_of(request)
    body = parse(ExecuteBody, await request.body())
    context: Context | None = None
    if body.context_id is not None:
        context = box.contexts.get(body.context_id)
        if context is None:
            raise E2BError(404, f"context {body.context_id!r} was not found")
        language = _language(context.language)
    else:
        language = _language(body.language)
    service.check_code(body.code)
    code = body.code
    if language in NODE_LANGUAGES:
        tenant = admit_cell(service, box)
        kernel = await service.in_thread(
            lambda: node_kernel(service, tenant, box, language, context), session=True
        )
        node = node_stream(service, tenant, box, kernel, code, env=dict(body.env_vars or {}))
        return StreamingResponse(node, media_type="application/x-ndjson")
    if language == "python":
        try:
            code = translate(code)
        except IPythonSyntaxError as exc:
            # As IPython answers a magic it does not know: an error of the cell, nothing run.
            return StreamingResponse(_refused(str(exc)), media_type="application/x-ndjson")
        if code != body.code:
            # The limit is on what the host checks and the sandbox runs: a line of magic can
            # grow a hundredfold.
            _check_translated(service, code)
    tenant = admit_cell(service, box)
    stream = _stream(
        service,
        tenant,
        box,
        code,
        language=language,
        env=dict(body.env_vars or {}),
        context=context,
    )
    return StreamingResponse(stream, media_type="application/x-ndjson")


def _check_translated(service: Service, code: str) -> None:
    try:
        service.check_code(code)
    except ServiceProblem as exc:
        raise E2BError(
            exc.status,
            f"{exc.detail} (the cell's IPython syntax, translated into the Python that runs; "
            "use fewer magics, or plain Python)",
        ) from None


async def _refused(message: str) -> AsyncIterator[bytes]:
    yield ndjson(error_message("UsageError", message))
    yield ndjson({"type": "end_of_execution"})


async def create_context(request: Request) -> Response:
    box = sandbox_of(request)
    body = parse(ContextBody, await request.body())
    language = _language(body.language)
    relative = workspace_relative(body.cwd, workspace=box.workspace) if body.cwd else ""
    context = Context(
        id=secrets.token_hex(8),
        language=language,
        cwd=e2b_path(relative),
        path=f"{box.workspace}/{relative}" if relative else box.workspace,
    )
    reply: dict[str, str] = context.to_json()
    if language in NODE_LANGUAGES:
        # Its kernel starts now, as E2B's does: a profile without the language is refused here.
        service = service_of(request)
        tenant = admit_cell(service, box)
        await service.in_thread(
            lambda: node_kernel(service, tenant, box, language, context), session=True
        )
        reply["note"] = NODE_CONTEXT_NOTE
    box.contexts[context.id] = context
    box.remember()  # a pause with the kernel's memory keeps the context (a scope of it)
    return JSONResponse(reply)


async def list_contexts(request: Request) -> Response:
    box = sandbox_of(request)
    return JSONResponse([c.to_json() for c in box.contexts.values()])


def _context(request: Request) -> tuple[E2BSandbox, str]:
    box = sandbox_of(request)
    context_id = request.path_params["context_id"]
    if context_id not in box.contexts:
        raise E2BError(404, f"context {context_id!r} was not found")
    return box, context_id


async def _drop(
    request: Request, box: E2BSandbox, context_id: str, removed: Context | None = None
) -> None:
    """Empty the context's scope in the kernel (its next cell starts it afresh, in its
    directory), or end a JavaScript context's Node session (its next cell opens a fresh one).
    Runs no code, so it takes no quota and is no run in the record."""
    service = service_of(request)
    context = box.contexts.get(context_id) or removed
    if context is not None and LANGUAGE_ALIASES.get(context.language) in NODE_LANGUAGES:
        await service.in_thread(lambda: restart_node(service, box, context_id), session=True)
        return
    await service.in_thread(lambda: box.session.drop_scope(context_id), session=True)


async def restart_context(request: Request) -> Response:
    box, context_id = _context(request)
    await _drop(request, box, context_id)
    return Response(status_code=204)


async def remove_context(request: Request) -> Response:
    box, context_id = _context(request)
    # Gone from the list first: a cell sent meanwhile is refused rather than recreating it.
    removed = box.contexts.pop(context_id, None)
    box.remember()
    await _drop(request, box, context_id, removed)
    return Response(status_code=204)


def interpreter_routes() -> list[Route]:
    return [
        Route("/execute", execute, methods=["POST"]),
        Route("/contexts", create_context, methods=["POST"]),
        Route("/contexts", list_contexts, methods=["GET"]),
        Route("/contexts/{context_id}/restart", restart_context, methods=["POST"]),
        Route("/contexts/{context_id}", remove_context, methods=["DELETE"]),
    ]
