"""A tenant's result checks (schema patterns, invariants) cannot take the service's time."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx2
from tests.service.server import ServiceProcess, add_tenant

# 30 a's and a "!": ^(a+)+$ tries every way to split them, about 2**30 paths. In the service's
# own process that held the interpreter lock for minutes: /healthz and every tenant waited.
BACKTRACKING = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
EVIL_OUTPUT = 'import json; print(json.dumps({"s": "a" * 30 + "!"}))'


def _busy_check(service: ServiceProcess) -> int | None:
    """The pid of the service's worker that is evaluating a check now (it has used CPU time)."""
    assert service.proc is not None
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parent, user, system = int(fields[1]), int(fields[11]), int(fields[12])
        if parent != service.proc.pid or b"sandcell.validation._confined_worker" not in cmdline:
            continue
        if (user + system) / ticks > 0.3:
            return int(entry.name)
    return None


def test_a_backtracking_schema_pattern_does_not_stall_the_service(
    service: ServiceProcess, home: Path
) -> None:
    key = add_tenant(home, "checks-evil")
    outcome: dict[str, object] = {}

    def submit() -> None:
        with service.client(key) as c:
            r = c.post("/v1/runs", json={"code": EVIL_OUTPUT, "schema": BACKTRACKING})
            outcome["response"] = r

    runner = threading.Thread(target=submit)
    runner.start()
    worker = None
    # Wait for the event: the check is being evaluated (or, on a service that evaluates it in
    # its own process, the run came back without one ever being seen).
    while worker is None and runner.is_alive():
        worker = _busy_check(service)
        runner.join(0.05)
    assert worker is not None, "the schema was not evaluated in a confined worker"
    health = httpx2.get(f"{service.url}/healthz", timeout=60)
    assert health.status_code == 200
    assert runner.is_alive(), "the check ended before /healthz was answered"
    runner.join()
    response = outcome["response"]
    assert isinstance(response, httpx2.Response) and response.status_code == 200, response
    result = response.json()["result"]
    assert result["outcome"] == "invalid_output"
    assert "s of CPU time" in result["validation"]["errors"][0]
    assert "pattern" in result["validation"]["errors"][0]


def test_an_ordinary_schema_and_invariant_still_pass_and_fail_as_before(
    service: ServiceProcess, home: Path
) -> None:
    key = add_tenant(home, "checks-plain")
    schema = {"type": "object", "properties": {"rate": {"type": "number", "maximum": 100}}}
    with service.client(key) as c:
        ok = c.post(
            "/v1/runs",
            json={
                "code": "print('{\"rate\": 42}')",
                "schema": schema,
                "invariants": ['result["rate"] > 0'],
            },
        ).json()["result"]
        assert ok["outcome"] == "ok", ok
        assert ok["validation"] == {"valid": True, "errors": [], "value": {"rate": 42}}
        bad = c.post(
            "/v1/runs",
            json={
                "code": "print('{\"rate\": 420}')",
                "schema": schema,
                "invariants": ['result["rate"] > 0'],
            },
        ).json()["result"]
        assert bad["outcome"] == "invalid_output"
        assert bad["validation"]["errors"] == ["$.rate: 420 is greater than the maximum of 100"]
        failed = c.post(
            "/v1/runs",
            json={"code": "print('{\"rate\": -1}')", "invariants": ['result["rate"] > 0']},
        ).json()["result"]
        assert failed["validation"]["errors"] == [
            """invariant 'result["rate"] > 0' does not hold"""
        ]
