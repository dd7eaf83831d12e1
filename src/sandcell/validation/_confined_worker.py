"""The process that evaluates tenant-supplied checks (:mod:`sandcell.validation.confined`).

Started by :class:`~sandcell.validation.confined.ConfinedChecks` as
``python -m sandcell.validation._confined_worker MEMORY_BYTES``, it reads one request at a time
from stdin and writes one reply to the descriptor stdout had at start (``sys.stdout`` goes to
stderr, so that nothing a library prints can corrupt the replies). Frames are a 4-byte
big-endian length and that many bytes of JSON.

Its limits are its own, so that they hold even if the service is gone: an address-space limit
for its whole life, and, before each request, a CPU-time soft limit of the CPU time used so far
plus the request's budget. The kernel ends the process with SIGXCPU when the budget is spent,
whether or not the interpreter lock is held by a regular expression that backtracks.
"""

from __future__ import annotations

import json
import math
import os
import resource
import struct
import sys
from typing import BinaryIO

from sandcell.errors import ConfigError
from sandcell.validation.invariants import Invariant, invariant_failure, parse_invariant
from sandcell.validation.result import check_schema, validate_result

_HEADER = struct.Struct(">I")


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _limit_cpu(budget_s: float) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + budget_s)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    # Only the soft limit moves: an unprivileged process can raise it again for the next
    # request, which it could not do with a lowered hard limit.
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _check(request: dict[str, object]) -> dict[str, object]:
    schema = request.get("schema")
    if request.get("op") == "check_schema":
        check_schema(schema)  # type: ignore[arg-type]
        return {"schema_errors": [], "invariants": None}
    value = request.get("value")
    errors: list[str] = []
    if schema is not None:
        errors += validate_result(value, schema=schema).errors  # type: ignore[arg-type]
    sources = request.get("invariants") or []
    assert isinstance(sources, list)
    if errors or not sources:
        return {"schema_errors": errors, "invariants": None}
    subject = request.get("subject", value)
    invariants: list[Invariant] = [parse_invariant(str(source)) for source in sources]
    failures = [invariant_failure(subject, invariant, 0) for invariant in invariants]
    return {"schema_errors": errors, "invariants": failures}


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    while True:
        header = _read_exact(requests, _HEADER.size)
        if header is None:
            return
        body = _read_exact(requests, _HEADER.unpack(header)[0])
        if body is None:
            return
        request = json.loads(body)
        _limit_cpu(float(request["cpu_seconds"]))
        try:
            reply = _check(request)
        except ConfigError as exc:
            reply = {"config_error": str(exc)}
        except MemoryError:
            # The heap may be fragmented past use: answer, then let the pool start a new one.
            reply = {"memory": True}
        data = json.dumps(reply).encode()
        replies.write(_HEADER.pack(len(data)) + data)
        replies.flush()
        if reply.get("memory"):
            return


def main() -> None:
    memory = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
