"""``/v1/runs``: run a program, synchronously or not; its status, its events, its cancellation."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from sandcell.runtimes.ref import ref_from_record
from sandcell.service.core import RunState, Service
from sandcell.service.deps import CurrentTenant, ServiceDep
from sandcell.service.fast_json import FastJSONResponse
from sandcell.service.kept_bytes import kept_stdin, submission_bytes
from sandcell.service.models import CancelBody, Problem, ResultBody, RunBody, RunStatusBody
from sandcell.service.problems import ServiceProblem
from sandcell.service.tenants import Tenant
from sandcell.spec import Outcome, RunRequest, RunResult, runtime_ref_to_dict

__all__ = ["router", "status_body", "wait_for"]

router = APIRouter(prefix="/v1/runs", tags=["runs"])
_PROBLEMS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "content": {"application/problem+json": {}}}
    for code in (400, 401, 403, 404, 409, 413, 422, 429, 503)
}
_DISCONNECT_POLL_S = 0.2
_KEEPALIVE_S = 15.0


def status_json(state: RunState) -> dict[str, object]:
    """:func:`status_body` as JSON data, without validating the result again."""
    return {
        "id": state.id,
        "status": state.status,
        "cancel_requested": state.cancel_requested,
        "result": state.result,
        "record_only": False,
    }


def status_body(state: RunState) -> RunStatusBody:
    return RunStatusBody(
        id=state.id,
        status=state.status,
        cancel_requested=state.cancel_requested,
        result=None if state.result is None else ResultBody.model_validate(state.result),
    )


async def wait_for(request: Request, service: Service, state: RunState) -> None:
    """Wait for the run; a client that goes away cancels it (the run still ends, recorded)."""
    while not state.done.is_set():
        try:
            await asyncio.wait_for(state.done.wait(), _DISCONNECT_POLL_S)
        except TimeoutError:
            if await request.is_disconnected():
                service.cancel(state)
                await state.done.wait()
    if state.error is not None:
        raise state.error


def _cleanup(folder: Path | None) -> Callable[[RunResult | None], None]:
    def remove(result: RunResult | None) -> None:
        # A run waiting for approval keeps its inputs: the approved run reads them later.
        waiting = result is not None and result.outcome is Outcome.AWAITING_APPROVAL
        if folder is not None and not waiting:
            shutil.rmtree(folder, ignore_errors=True)

    return remove


@router.post(
    "",
    response_model=RunStatusBody,
    responses={202: {"model": RunStatusBody, "description": "accepted (wait: false)"}, **_PROBLEMS},
)
async def create_run(
    body: RunBody, request: Request, service: ServiceDep, tenant: CurrentTenant
) -> JSONResponse:
    """Run one program in a fresh sandbox under one of the tenant's profiles."""
    service.check_code(body.code)
    profile = service.profile_for(tenant, body.profile)
    service.check_backend(profile, body.backend)
    limits = profile.limits_for(body.limits.model_dump() if body.limits is not None else None)
    folder, inputs = service.write_inputs(uuid.uuid4().hex, body.files)
    try:
        run_request = RunRequest(
            code=body.code,
            language=body.language,
            inputs=inputs,
            exports=tuple(body.exports),
            limits=limits,
            stdin=body.stdin.encode(),
            env=body.env,
            display=body.display,
            runtime=body.runtime,
        )
        service.admit(tenant, sandbox=True, adding=submission_bytes(run_request))
    except BaseException:
        _cleanup(folder)(None)
        raise
    state = service.new_run(tenant)
    state.stdin = kept_stdin(run_request)
    state.code, state.language = run_request.code, run_request.language
    # Only an asynchronous run has an id to subscribe to while it runs: its output is streamed.
    on_output = None if body.wait else service.output_listener(state)

    def call(run_id: str) -> RunResult:
        return service.executor.run(
            run_request,
            profile=profile,
            schema=body.result_schema,
            invariants=body.invariants,
            result_file=body.result_file,
            run_id=run_id,
            on_output=on_output,
        )

    service.start(state, call, cleanup=_cleanup(folder))
    if not body.wait:
        # Once in the directory of runs in flight: any replica asked about it next finds it.
        await state.noted.wait()
        return FastJSONResponse(
            status_json(state), status_code=202, headers={"Location": f"/v1/runs/{state.id}"}
        )
    await wait_for(request, service, state)
    # Built from the executor's own JSON form, not re-validated: it is on every run's path.
    return FastJSONResponse(status_json(state))


def _owned_state(service: Service, tenant: Tenant, run_id: str) -> RunState | None:
    state = service.state_for(tenant, run_id)
    if state is None and not service.tenants.owns(tenant.id, "run", run_id):
        raise ServiceProblem(404, f"no run {run_id!r}")
    return state


def _record_result(service: Service, run_id: str) -> dict[str, object] | None:
    entry = service.executor.audit.get(run_id)
    if entry is None:
        return None
    record = dict(entry.record)
    fields = ResultBody.model_fields
    found = {name: record.get(name, _empty(name)) for name in fields}
    # The record describes the runtime in full; the result names only a built one.
    ref = ref_from_record(record.get("runtime"))
    found["runtime"] = None if ref is None else runtime_ref_to_dict(ref)
    return found


def _empty(name: str) -> object:
    return {"usage": {}, "start": {}}.get(name, [] if name in _LISTS else None)


_LISTS = {"artifacts", "rejected_exports", "leaks", "outputs"}


@router.get("/{run_id}", response_model=RunStatusBody, responses=_PROBLEMS)
async def get_run(
    run_id: str, service: ServiceDep, tenant: CurrentTenant
) -> RunStatusBody | JSONResponse:
    """Where a run stands; once finished, its result."""
    state = _owned_state(service, tenant, run_id)
    if state is not None:
        # Polled by clients waiting for a run: the executor's JSON form, not validated again.
        return FastJSONResponse(status_json(state))
    found = _record_result(service, run_id)
    if found is None:
        raise ServiceProblem(
            404, f"run {run_id!r} has no record: it did not finish before the service stopped"
        )
    return RunStatusBody(
        id=run_id, status="finished", result=ResultBody.model_validate(found), record_only=True
    )


def _sse(kind: str, data: object) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


@router.get(
    "/{run_id}/events",
    responses={200: {"content": {"text/event-stream": {}}}, **_PROBLEMS},
    response_class=StreamingResponse,
)
async def run_events(run_id: str, service: ServiceDep, tenant: CurrentTenant) -> StreamingResponse:
    """The run's events as Server-Sent Events: ``status`` (queued, running); for a run started
    with ``wait: false``, ``stdout`` and ``stderr`` (``{"id", "text"}``: its output while it
    runs, redacted and capped as its result is; a subscriber that comes late gets what was
    produced so far first, and ``output_limit`` where the kept output ends); then ``result``
    with the whole result; the stream ends after it."""
    state = _owned_state(service, tenant, run_id)

    async def from_record() -> AsyncIterator[bytes]:
        found = _record_result(service, run_id)
        yield _sse("result", {"id": run_id, "status": "finished", "result": found})

    async def live(state: RunState) -> AsyncIterator[bytes]:
        sent = 0
        while True:
            async with state.changed:
                if sent >= len(state.events):
                    try:
                        await asyncio.wait_for(state.changed.wait(), _KEEPALIVE_S)
                    except TimeoutError:
                        pending: list[tuple[str, dict[str, object]]] = []
                    else:
                        pending = state.events[sent:]
                else:
                    pending = state.events[sent:]
            if not pending:
                yield b": keep-alive\n\n"
                continue
            for kind, data in pending:
                sent += 1
                if not kind:
                    continue  # live output forgotten since the run finished (in its result)
                yield _sse(kind, data)
                if kind == "result":
                    return

    stream = live(state) if state is not None else from_record()
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.post("/{run_id}/cancel", response_model=CancelBody, status_code=202, responses=_PROBLEMS)
async def cancel_run(run_id: str, service: ServiceDep, tenant: CurrentTenant) -> CancelBody:
    """Stop a run; it ends ``killed`` with a reason starting "cancelled", and is recorded."""
    state = _owned_state(service, tenant, run_id)
    if state is None or state.done.is_set():
        raise ServiceProblem(409, f"run {run_id!r} has finished; there is nothing to cancel")
    service.cancel(state)
    return CancelBody(id=state.id, status=state.status, cancel_requested=state.cancel_requested)
