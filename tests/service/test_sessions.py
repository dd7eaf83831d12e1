"""Sessions over HTTP: cells share state, files go in and out, closing exports."""

from __future__ import annotations

import base64
import time
from pathlib import Path

from tests.service.server import ServiceProcess, add_tenant


def test_a_session_keeps_state_and_moves_files(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "sessions", profiles=("analysis",), max_concurrent=2)
    with service.client(key) as c:
        created = c.post(
            "/v1/sessions",
            json={"files": {"seed.txt": base64.b64encode(b"41").decode()}, "idle_timeout_s": 120},
        )
        assert created.status_code == 201, created.text
        info = created.json()
        sid = info["id"]
        assert info["profile"] == "analysis" and info["ended"] is None
        first = c.post(
            f"/v1/sessions/{sid}/cells", json={"code": "x = int(open('/inputs/seed.txt').read())"}
        )
        assert first.json()["outcome"] == "ok", first.text
        second = c.post(f"/v1/sessions/{sid}/cells", json={"code": "print(x + 1)"}).json()
        assert second["stdout"] == "42\n" and second["session_id"] == sid
        put = c.put(f"/v1/sessions/{sid}/files/data/in.csv", content=b"a,b\n1,2\n")
        assert put.status_code == 200, put.text
        read = c.post(
            f"/v1/sessions/{sid}/cells",
            json={"code": "import pandas as pd; print(pd.read_csv('data/in.csv').b.sum())"},
        ).json()
        assert read["stdout"] == "2\n", read
        assert "data/in.csv" in c.get(f"/v1/sessions/{sid}/files").json()["files"]
        big = bytes(range(256)) * 2400  # over the code limit once encoded in the writing cell
        assert c.put(f"/v1/sessions/{sid}/files/big.csv", content=big).status_code == 200
        assert c.get(f"/v1/sessions/{sid}/files/big.csv").content == big
        assert [s["id"] for s in c.get("/v1/sessions").json()] == [sid]
        # The profile decides what leaves: analysis exports *.csv at the top, not data/*.
        refused = c.get(f"/v1/sessions/{sid}/files/data/in.csv")
        assert refused.status_code == 400 and "export" in refused.json()["detail"]
        c.post(
            f"/v1/sessions/{sid}/cells",
            json={"code": "import shutil; shutil.copy('data/in.csv', 'in.csv')"},
        )
        got = c.get(f"/v1/sessions/{sid}/files/in.csv")
        assert got.status_code == 200 and got.content == b"a,b\n1,2\n", got.text
        assert len(got.headers["x-sandcell-sha256"]) == 64
        assert c.get(f"/v1/sessions/{sid}/files/nothing.csv").status_code == 404
        assert c.get(f"/v1/sessions/{sid}/files/../etc/passwd").status_code in (400, 404)
        c.post(f"/v1/sessions/{sid}/cells", json={"code": "open('out.csv','w').write('z\\n')"})
        closed = c.post(f"/v1/sessions/{sid}/close", json={"exports": ["out.csv"]})
        assert closed.status_code == 200, closed.text
        [artifact] = closed.json()["artifacts"]
        assert c.get(f"/v1/artifacts/{artifact['sha256']}").content == b"z\n"
        assert c.post(f"/v1/sessions/{sid}/cells", json={"code": "1"}).status_code == 404
        cells = [s for s in c.get("/v1/audit?limit=50").json() if s["session_id"] == sid]
        assert len(cells) >= 6
        assert c.get("/v1/tenant").json()["in_flight"] == 0


def test_a_session_that_ends_idle_gives_back_its_slot(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "idler", profiles=("analysis",), max_concurrent=1)
    with service.client(key) as c:
        sid = c.post("/v1/sessions", json={"idle_timeout_s": 1}).json()["id"]
        assert c.post("/v1/runs", json={"code": "pass"}).status_code == 429
        deadline = time.monotonic() + 30
        while True:
            answer = c.post("/v1/runs", json={"code": "print('after')"})
            if answer.status_code == 200:
                break
            assert answer.status_code == 429 and time.monotonic() < deadline, answer.text
            time.sleep(0.5)
        assert answer.json()["result"]["stdout"] == "after\n"
        assert c.get(f"/v1/sessions/{sid}").status_code == 404
