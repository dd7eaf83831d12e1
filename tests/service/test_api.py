"""Runs, records, artifacts and the service's own endpoints, over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
from tests.conftest import runtime_required
from tests.service.server import ServiceProcess, add_tenant


def _problem(response: httpx2.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status
    assert "Traceback" not in response.text
    return body


def test_sync_run_returns_the_result_and_its_record(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "api-sync")
    with service.client(key) as c:
        r = c.post("/v1/runs", json={"code": "print(6*7)"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "finished"
        result = body["result"]
        assert result["outcome"] == "ok" and result["stdout"] == "42\n"
        assert result["run_id"] == body["id"]
        assert result["enforcement"]["backend"] == "namespaces"
        record = c.get(f"/v1/audit/{body['id']}").json()
        assert record["record"]["stdout"] == "42\n"
        assert record["record"]["policy"]["profile"]["name"] == "strict"
        # strict runs in the built runtime analysis: the result names it as the record does.
        runtime = record["record"]["runtime"]
        assert result["runtime"] == {
            "name": "analysis",
            "tree_sha256": runtime["tree_sha256"],
            "lock_sha256": runtime["lock_sha256"],
        }
        assert [s["run_id"] for s in c.get("/v1/audit").json()] == [body["id"]]
        assert c.get(f"/v1/runs/{body['id']}").json()["result"]["stdout"] == "42\n"


def test_curl_style_body_without_a_json_type_is_read_as_json(
    service: ServiceProcess, home: Path
) -> None:
    key = add_tenant(home, "api-curl")
    with service.client(key) as c:
        r = c.post(
            "/v1/runs",
            content=json.dumps({"code": "print('form')"}),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["result"]["stdout"] == "form\n"


def test_every_v1_endpoint_needs_a_key(service: ServiceProcess) -> None:
    with service.client(None) as c:
        for method, path in [
            ("POST", "/v1/runs"),
            ("GET", "/v1/runs/x"),
            ("GET", "/v1/audit"),
            ("GET", "/v1/audit/verify"),
            ("GET", "/v1/approvals"),
            ("GET", "/v1/profiles"),
            ("POST", "/v1/sessions"),
            ("GET", "/v1/artifacts/" + "0" * 64),
            ("GET", "/v1/tenant"),
        ]:
            r = c.request(method, path, json={})
            body = _problem(r, 401)
            assert r.headers["www-authenticate"].startswith("Bearer"), (method, path, body)
    with service.client("sc_not-a-key") as c:
        _problem(c.get("/v1/audit"), 401)


def test_async_run_is_polled_and_streamed(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "api-async")
    with service.client(key) as c:
        r = c.post(
            "/v1/runs", json={"code": "import time; time.sleep(0.5); print('late')", "wait": False}
        )
        assert r.status_code == 202, r.text
        run_id = r.json()["id"]
        assert r.headers["location"] == f"/v1/runs/{run_id}"
        assert r.json()["status"] in ("queued", "running")
        events = []
        with c.stream("GET", f"/v1/runs/{run_id}/events") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            kind = None
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    events.append((kind, json.loads(line.removeprefix("data: "))))
        kinds = [k for k, _ in events]
        # The output comes while the run runs, before its result (test_live_output.py).
        assert kinds == ["status", "status", "stdout", "result"], events
        assert events[2][1] == {"id": run_id, "text": "late\n"}
        statuses = [d.get("status") for k, d in events if k != "stdout"]
        assert statuses == ["queued", "running", "finished"]
        assert events[-1][1]["result"]["stdout"] == "late\n"
        polled = c.get(f"/v1/runs/{run_id}").json()
        assert polled["status"] == "finished" and polled["result"]["stdout"] == "late\n"


def test_artifacts_download_by_sha(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "api-artifacts", profiles=("analysis",))
    with service.client(key) as c:
        r = c.post(
            "/v1/runs",
            json={
                "code": "open('out.csv','w').write('a,b\\n1,2\\n')",
                "exports": ["*.csv"],
                "files": {"in.txt": "aGVsbG8="},
            },
        )
        result = r.json()["result"]
        assert result["outcome"] == "ok", result
        [artifact] = result["artifacts"]
        got = c.get(f"/v1/artifacts/{artifact['sha256']}")
        assert got.status_code == 200 and got.content == b"a,b\n1,2\n"
        _problem(c.get("/v1/artifacts/" + "f" * 64), 404)
        _problem(c.get("/v1/artifacts/not-a-sha"), 404)


def test_input_files_are_visible_read_only(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "api-inputs", profiles=("analysis",))
    code = (
        "print(open('/inputs/in.txt').read())\n"
        "try:\n    open('/inputs/in.txt','w')\nexcept OSError as e:\n    print('ro', e.errno)\n"
    )
    with service.client(key) as c:
        r = c.post("/v1/runs", json={"code": code, "files": {"in.txt": "aGVsbG8="}})
        result = r.json()["result"]
        assert result["outcome"] == "ok", result
        assert result["stdout"].startswith("hello\nro ")


def test_bad_input_is_a_problem_naming_the_field(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "api-bad")
    with service.client(key) as c:
        body = _problem(c.post("/v1/runs", json={"code": 1}), 422)
        assert body["errors"][0]["field"] == "body.code"
        body = _problem(c.post("/v1/runs", json={"code": "pass", "cod": 1}), 422)
        assert any(e["field"] == "body.cod" for e in body["errors"])
        body = _problem(
            c.post("/v1/runs", content=b"{not json", headers={"content-type": "application/json"}),
            422,
        )
        body = _problem(c.post("/v1/runs", json={"code": "pass", "language": "cobol"}), 422)
        assert body["errors"][0]["field"] == "body.language"
        assert "javascript" in str(body["errors"][0])  # the names there are
        # A short name is the language (its own rules apply: a 400 naming javascript, not a
        # 422): a Node run may not set Node's own start-up variables.
        body = _problem(
            c.post(
                "/v1/runs",
                json={"code": "1", "language": "js", "env": {"NODE_OPTIONS": "--inspect"}},
            ),
            400,
        )
        assert "a javascript run may not set NODE_OPTIONS" in str(body["detail"])
        body = _problem(c.post("/v1/runs", json={"code": "pass", "backend": "bogus"}), 400)
        assert "bogus" in str(body["detail"])
        body = _problem(c.post("/v1/runs", json={"code": "pass", "backend": "gvisor"}), 400)
        assert "namespaces" in str(body["detail"])
        body = _problem(c.post("/v1/runs", json={"code": "pass", "profile": "unchecked"}), 403)
        body = _problem(
            c.post("/v1/runs", json={"code": "pass", "limits": {"wall_time_s": 1e9}}), 400
        )
        assert "ceiling" in str(body["detail"])
        body = _problem(c.post("/v1/runs", json={"code": "pass", "files": {"../x": "AA=="}}), 400)
        body = _problem(c.post("/v1/runs", json={"code": "pass", "files": {"x": "!!"}}), 400)
        body = _problem(c.post("/v1/runs", json={"code": "x" * (600 * 1024)}), 413)
        assert "code" in str(body["detail"])
        body = _problem(c.post("/v1/runs", json={"code": "x" * (2 * 1024 * 1024)}), 413)
        _problem(c.get("/v1/runs/nope"), 404)
        _problem(c.get("/v1/nothing-here"), 404)
        _problem(c.delete("/v1/runs"), 405)


def test_javascript_and_typescript_runs(service: ServiceProcess, home: Path) -> None:
    runtime_required("node")
    key = add_tenant(home, "api-node", profiles=("unchecked",))
    program = 'const _ = require("lodash");\nconsole.log(_.sum([40, 2]), process.version);\n'
    with service.client(key) as c:
        for language, code in (
            ("js", program),
            ("typescript", "const n: number = 42;\n" + program),
        ):
            r = c.post("/v1/runs", json={"code": code, "language": language})
            assert r.status_code == 200, r.text
            result = r.json()["result"]
            assert (result["outcome"], result["stdout"]) == ("ok", "42 v22.23.5\n"), result
            assert result["runtime"]["name"] == "node"
            record = c.get(f"/v1/audit/{result['run_id']}").json()["record"]
            full = "javascript" if language == "js" else "typescript"
            assert record["language"] == full


def test_a_tenant_whose_profile_disappeared_gets_a_400(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "api-gone", profiles=("no-such-profile",))
    with service.client(key) as c:
        body = _problem(c.post("/v1/runs", json={"code": "pass"}), 400)
        assert "no-such-profile" in str(body["detail"])
        [shown] = c.get("/v1/profiles").json()
        assert shown["problem"] is not None


def test_profiles_tenant_health_openapi_and_metrics(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "api-ops", profiles=("strict", "analysis"))
    with service.client(key) as c:
        assert [p["name"] for p in c.get("/v1/profiles").json()] == ["strict", "analysis"]
        me = c.get("/v1/tenant").json()
        assert me["name"] == "api-ops" and me["profiles"] == ["strict", "analysis"]
        assert "key" not in json.dumps(me).lower().replace("max_", "")
        health = c.get("/healthz").json()
        assert health["status"] == "ok"
        spec = c.get("/openapi.json").json()
        for path in ("/v1/runs", "/v1/runs/{run_id}/events", "/v1/sessions", "/v1/approvals"):
            assert path in spec["paths"], path
        assert "HTTPBearer" in json.dumps(spec["components"])
        assert c.get("/docs").status_code == 200
        c.post("/v1/runs", json={"code": "print(1)"})
        metrics = c.get("/metrics")
        assert metrics.headers["content-type"].startswith("text/plain")
        text = metrics.text
        assert 'sandcell_runs_total{outcome="ok"}' in text
        assert 'sandcell_run_seconds_bucket{le="+Inf"}' in text
        assert "sandcell_queue_length 0" in text
        assert "sandcell_runs_in_flight 0" in text


def test_the_local_socket_serves_the_same_api(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "api-socket")
    assert service.socket.stat().st_mode & 0o777 == 0o600
    transport = httpx2.HTTPTransport(uds=str(service.socket))
    with httpx2.Client(
        transport=transport, base_url="http://sandcell", headers={"Authorization": f"Bearer {key}"}
    ) as c:
        assert c.get("/healthz").json()["status"] == "ok"
        r = c.post("/v1/runs", json={"code": "print('via socket')"})
        assert r.json()["result"]["stdout"] == "via socket\n"
