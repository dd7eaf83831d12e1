"""``/ui`` against a real ``sandcell serve``: the login and its cookie, the headers, escaping of
everything a hostile program produced, the CSRF and origin checks on every form, and tenant
scoping (another tenant's approval, run, figure or file is 404)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest
from tests.service.server import REPO, ServiceProcess, add_approver, add_tenant

from sandcell.policy.approvals import ApprovalStore
from sandcell.service.tenants import TenantStore

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOSTILE_NAME = "q\"uote'<b>.txt"
HOSTILE_CODE = (
    "print('<script>document.title=\"pwned\"</script>')\n"
    "print('<img src=x onerror=alert(1)>')\n"
    "# </textarea><script>alert(2)</script> \u202e\n"
    f"open({HOSTILE_NAME!r}, 'w').write('exported')\n"
    "import matplotlib.pyplot as plt\n"
    "plt.plot([1, 3, 2])\n"
    "'<b>last value</b>'\n"
)


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, html
    return found.group(1)


class Browser:
    """A cookie jar and the forms of one browser, over plain HTTP."""

    def __init__(self, service: ServiceProcess) -> None:
        self.origin = service.url
        self.http = httpx2.Client(base_url=service.url, timeout=120, follow_redirects=False)

    def get(self, path: str) -> httpx2.Response:
        return self.http.get(path)

    def post(
        self, path: str, data: dict[str, str], *, origin: str | None = "same"
    ) -> httpx2.Response:
        headers = {} if origin is None else {"Origin": self.origin if origin == "same" else origin}
        return self.http.post(path, data=data, headers=headers)

    def login(self, key: str) -> str:
        """Log in; the session's CSRF token."""
        form = self.get("/ui/login")
        answer = self.post("/ui/login", {"csrf": _csrf(form.text), "key": key})
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == "/ui/"
        return self.token()

    def token(self) -> str:
        return _csrf(self.get("/ui/").text)

    def cookie(self) -> str:
        value = self.http.cookies.get("sandcell_ui")
        assert value is not None
        return value

    def close(self) -> None:
        self.http.close()


def _approval(client: httpx2.Client, code: str, **body: object) -> str:
    answer = client.post("/v1/runs", json={"code": code, "profile": "supervised", **body})
    result = answer.json()["result"]
    assert result["outcome"] == "awaiting_approval", result
    approval = result["policy"]["approval"]["id"]
    assert isinstance(approval, str)
    return approval


def _follow_run(browser: Browser, location: str) -> httpx2.Response:
    """The run's page once it has a record (it reloads itself until then)."""
    for _ in range(600):
        page = browser.get(location)
        if "refresh" not in page.headers:
            return page
        assert page.status_code == 200
        time.sleep(0.2)
    raise AssertionError(f"{location} never finished")


@pytest.fixture(scope="module")
def keys(service: ServiceProcess, home: Path) -> dict[str, str]:
    keys = {
        "ann": add_tenant(home, "ann", profiles=("supervised", "analysis")),
        "bob": add_tenant(home, "bob", profiles=("supervised", "analysis")),
    }
    # Ann's key submits; her approver key approves (the profiles leave submitter_may_approve
    # off).
    keys["ann-approver"] = add_approver(home, "ann", "desk")
    return keys


@pytest.fixture(scope="module")
def approved(service: ServiceProcess, keys: dict[str, str]) -> dict[str, object]:
    """A hostile program of ann's, approved in the pages: its approval and run pages."""
    with service.client(keys["ann"]) as api:
        approval = _approval(api, HOSTILE_CODE, exports=["*.txt"], display=True)
    browser = Browser(service)
    try:
        token = browser.login(keys["ann-approver"])
        approval_page = browser.get(f"/ui/approvals/{approval}")
        answer = browser.post(
            f"/ui/approvals/{approval}/approve", {"csrf": token, "reason": "looked at it"}
        )
        assert answer.status_code == 303, answer.text
        location = answer.headers["location"]
        run_page = _follow_run(browser, location)
        images = re.findall(r'<img src="([^"]+)"', run_page.text)
        files = re.findall(r'href="(/ui/runs/[^"]+/files/[^"]+)"', run_page.text)
        fetched = {path: browser.get(path) for path in [*images, *files]}
    finally:
        browser.close()
    return {
        "approval": approval,
        "approval_page": approval_page,
        "run_id": location.rsplit("/", 1)[1],
        "run_page": run_page,
        "images": images,
        "files": files,
        "fetched": fetched,
    }


def test_pages_send_a_browser_without_a_session_to_the_login(
    service: ServiceProcess, approved: dict[str, object]
) -> None:
    with httpx2.Client(base_url=service.url, follow_redirects=False) as http:
        for path in (
            "/ui/",
            "/ui/runs",
            "/ui/audit",
            f"/ui/approvals/{approved['approval']}",
            f"/ui/runs/{approved['run_id']}",
            *approved["images"],  # type: ignore[misc]
        ):
            answer = http.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"] == "/ui/login"


def test_login_sets_a_session_cookie_never_the_key(
    service: ServiceProcess, keys: dict[str, str]
) -> None:
    browser = Browser(service)
    try:
        form = browser.get("/ui/login")
        assert form.status_code == 200
        cookie = form.headers["set-cookie"]
        attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "path=/ui", "samesite=strict"} <= attributes
        assert "secure" not in attributes  # plain http on loopback: a Secure cookie is dropped
        before = browser.cookie()

        wrong = browser.post("/ui/login", {"csrf": _csrf(form.text), "key": "sc_not-a-key"})
        assert wrong.status_code == 401
        assert "unknown or revoked API key" in wrong.text
        assert browser.get("/ui/").status_code == 303

        browser.login(keys["ann"])
        after = browser.cookie()
        assert after != before, "the session id must change at login"
        assert keys["ann"] not in after and keys["ann"][3:] not in after
        assert browser.get("/ui/").status_code == 200
        # The id the browser had before login is not a logged-in session.
        with httpx2.Client(base_url=service.url, cookies={"sandcell_ui": before}) as old:
            assert old.get("/ui/", follow_redirects=False).status_code == 303
    finally:
        browser.close()


def test_every_answer_carries_the_strict_headers(
    service: ServiceProcess, keys: dict[str, str], approved: dict[str, object]
) -> None:
    browser = Browser(service)
    try:
        browser.login(keys["ann"])
        for path in ("/ui/login", "/ui/", "/ui/no-such-page", f"/ui/runs/{approved['run_id']}"):
            answer = browser.get(path)
            csp = answer.headers["content-security-policy"]
            assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
            assert "img-src 'self'" in csp and "script-src" not in csp
            assert "unsafe-inline" not in csp
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.headers["x-frame-options"] == "DENY"
            assert answer.headers["cache-control"] == "no-store"
        assert browser.get("/ui/no-such-page").status_code == 404
    finally:
        browser.close()


def test_what_the_program_made_is_escaped(approved: dict[str, object]) -> None:
    page = approved["approval_page"]
    assert isinstance(page, httpx2.Response) and page.status_code == 200
    html = page.text
    # The code's own </textarea> and <script> stay text: the only textareas are the forms'.
    assert html.count("<textarea") == 2 and html.count("</textarea>") == 2
    assert "<script" not in html
    assert "# &lt;/textarea&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in html
    # A right-to-left override is shown, not obeyed.
    assert '<span class="esc" title="hidden character">\\u202e</span>' in html
    assert "\u202e" not in html

    run = approved["run_page"]
    assert isinstance(run, httpx2.Response) and run.status_code == 200
    html = run.text
    assert 'id="outcome">ok<' in html, html
    assert "<script" not in html and "<img src=x" not in html
    assert "&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "&#39;&lt;b&gt;last value&lt;/b&gt;&#39;" in html  # the last value, as text
    assert "q&#34;uote&#39;&lt;b&gt;.txt" in html  # the file name in the link's text


def test_files_download_under_a_safe_name_and_figures_show(
    approved: dict[str, object],
) -> None:
    fetched = approved["fetched"]
    assert isinstance(fetched, dict)
    downloads = {
        fetched[path].headers["content-disposition"]: fetched[path] for path in approved["files"]
    }  # type: ignore[attr-defined]
    # The export, and the figure's SVG beside the PNG shown inline.
    assert set(downloads) == {
        "attachment; filename*=utf-8''q%22uote%27%3Cb%3E.txt",
        'attachment; filename="0001.svg"',
    }
    answer = downloads["attachment; filename*=utf-8''q%22uote%27%3Cb%3E.txt"]
    assert answer.status_code == 200 and answer.content == b"exported"
    for answer in downloads.values():
        assert answer.headers["content-type"] == "application/octet-stream"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in answer.headers["content-security-policy"]

    (image,) = approved["images"]  # type: ignore[misc]
    figure = fetched[image]
    assert figure.status_code == 200 and figure.content.startswith(PNG_MAGIC)
    assert figure.headers["content-type"] == "image/png"
    assert "sandbox" in figure.headers["content-security-policy"]


def test_forms_without_the_session_token_or_from_elsewhere_are_refused(
    service: ServiceProcess, keys: dict[str, str]
) -> None:
    with service.client(keys["ann"]) as api:
        approval = _approval(api, "import subprocess\n")
        browser, other = Browser(service), Browser(service)
        try:
            token = browser.login(keys["ann"])
            other_token = other.login(keys["ann"])
            approve = f"/ui/approvals/{approval}/approve"
            refused = [
                browser.post(approve, {"reason": "no token"}),
                browser.post(approve, {"csrf": "x" * 43}),
                browser.post(approve, {"csrf": other_token}),  # another session's token
                browser.post(approve, {"csrf": token}, origin="http://evil.example"),
                browser.post(approve, {"csrf": token}, origin="null"),
                browser.post(approve, {"csrf": token}, origin=None),  # neither Origin nor Referer
                browser.http.post(
                    approve,
                    data={"csrf": token},
                    headers={"Referer": "http://evil.example/ui/"},
                ),
                browser.post("/ui/logout", {}),
                browser.post("/ui/login", {"csrf": token, "key": keys["ann"]}, origin="null"),
            ]
            for answer in refused:
                assert answer.status_code == 403, (answer.request.url, answer.text)
                assert "refused" in answer.text
            assert api.get(f"/v1/approvals/{approval}").json()["status"] == "pending"
            assert browser.get("/ui/").status_code == 200, "a refused logout must not log out"

            # A same-origin Referer stands in for a missing Origin.
            denied = browser.http.post(
                f"/ui/approvals/{approval}/deny",
                data={"csrf": token, "reason": ""},
                headers={"Referer": f"{service.url}/ui/approvals/{approval}"},
            )
            assert denied.status_code == 400 and "say why" in denied.text
            denied = browser.post(
                f"/ui/approvals/{approval}/deny", {"csrf": token, "reason": "not today <b>"}
            )
            assert denied.status_code == 303
            shown = api.get(f"/v1/approvals/{approval}").json()
            assert shown["status"] == "denied"
            assert shown["decision_reason"] == "not today <b>"
            assert shown["decided_by"] == "tenant:ann (browser)"
            again = browser.post(approve, {"csrf": token})
            assert again.status_code == 409
        finally:
            browser.close()
            other.close()


def test_another_tenant_sees_none_of_it(
    service: ServiceProcess, keys: dict[str, str], approved: dict[str, object]
) -> None:
    with service.client(keys["ann"]) as api:
        waiting = _approval(api, "import subprocess\n")
    run_id = approved["run_id"]
    browser = Browser(service)
    try:
        token = browser.login(keys["bob"])
        for path in (
            f"/ui/approvals/{waiting}",
            f"/ui/approvals/{waiting[:8]}",
            f"/ui/approvals/{approved['approval']}",
            f"/ui/runs/{run_id}",
            *approved["images"],  # type: ignore[misc]
            *approved["files"],  # type: ignore[misc]
        ):
            answer = browser.get(path)
            assert answer.status_code == 404, path
        answer = browser.post(f"/ui/approvals/{waiting}/approve", {"csrf": token})
        assert answer.status_code == 404
        answer = browser.post(f"/ui/approvals/{waiting}/deny", {"csrf": token, "reason": "mine"})
        assert answer.status_code == 404
        listed = browser.get("/ui/?status=all").text
        assert waiting not in listed and str(approved["approval"]) not in listed
        assert str(run_id) not in browser.get("/ui/runs").text
    finally:
        browser.close()
    with service.client(keys["ann"]) as api:
        assert api.get(f"/v1/approvals/{waiting}").json()["status"] == "pending"


def test_logout_ends_the_session(service: ServiceProcess, keys: dict[str, str]) -> None:
    browser = Browser(service)
    try:
        token = browser.login(keys["ann"])
        cookie = browser.cookie()
        answer = browser.post("/ui/logout", {"csrf": token})
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/login"
        with httpx2.Client(base_url=service.url, cookies={"sandcell_ui": cookie}) as old:
            assert old.get("/ui/", follow_redirects=False).status_code == 303
    finally:
        browser.close()


def test_queue_runs_and_audit_pages(
    service: ServiceProcess, keys: dict[str, str], approved: dict[str, object]
) -> None:
    with service.client(keys["ann"]) as api:
        waiting = _approval(api, "import subprocess\nsubprocess.run(['true'])\n")
    browser = Browser(service)
    try:
        browser.login(keys["ann"])
        queue = browser.get("/ui/").text
        assert f'href="/ui/approvals/{waiting}"' in queue
        assert str(approved["approval"]) not in queue  # it ran: not pending any more
        assert "subprocess.run([&#39;true&#39;])" in queue  # the code, in the queue itself
        assert str(approved["approval"]) in browser.get("/ui/?status=ran").text
        assert str(approved["run_id"]) in browser.get("/ui/runs").text
        audit = browser.get("/ui/audit")
        assert audit.status_code == 200
        assert re.search(r'id="verify">Intact: \d+ records', audit.text), audit.text
        assert browser.get("/ui/?status=bogus").status_code == 400
    finally:
        browser.close()


def test_tool_calls_are_decided_in_the_pages(
    service: ServiceProcess, home: Path, keys: dict[str, str], approved: dict[str, object]
) -> None:
    # Filed as the gateway's approval queue files a call of a run: under the run's id.
    with ApprovalStore(home / "approvals.sqlite3") as store:
        ticket = store.submit_tool(
            profile="supervised",
            tool="mail.send",
            args={"to": "</pre><script>alert(3)</script>"},
            expires_in_s=600,
            run_id=str(approved["run_id"]),
        )
    bob = Browser(service)
    try:
        token = bob.login(keys["bob"])
        assert bob.get(f"/ui/tools/{ticket.id}").status_code == 404
        assert bob.post(f"/ui/tools/{ticket.id}/approve", {"csrf": token}).status_code == 404
        assert ticket.id not in bob.get("/ui/").text
    finally:
        bob.close()
    browser = Browser(service)
    try:
        token = browser.login(keys["ann-approver"])
        assert f'href="/ui/tools/{ticket.id}"' in browser.get("/ui/").text
        page = browser.get(f"/ui/tools/{ticket.id}").text
        assert "<script" not in page and "&lt;/pre&gt;&lt;script&gt;alert(3)" in page
        answer = browser.post(f"/ui/tools/{ticket.id}/approve", {"csrf": "wrong"})
        assert answer.status_code == 403
        answer = browser.post(f"/ui/tools/{ticket.id}/approve", {"csrf": token, "reason": "ok"})
        assert answer.status_code == 303
    finally:
        browser.close()
    with ApprovalStore(home / "approvals.sqlite3") as store:
        decided = store.get_tool(ticket.id)
    assert decided.status == "approved" and decided.decided_by == "approver:ann/desk (browser)"


def test_a_removed_tenant_is_logged_out(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "gone", profiles=("supervised",))
    browser = Browser(service)
    try:
        browser.login(key)
        assert browser.get("/ui/").status_code == 200
        with TenantStore.in_home(home) as tenants:
            tenants.remove("gone")
        answer = browser.get("/ui/")
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/login"
    finally:
        browser.close()


def test_rotating_the_key_logs_the_browser_out(service: ServiceProcess, home: Path) -> None:
    old_key = add_tenant(home, "rotor", profiles=("supervised",))
    old, new = Browser(service), Browser(service)
    try:
        token = old.login(old_key)
        assert old.get("/ui/").status_code == 200
        rotated = subprocess.run(
            [sys.executable, "-m", "sandcell", "tenants", "rotate-key", "rotor"],
            cwd=REPO,
            env={**os.environ, "SANDCELL_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        new_key = rotated.stdout.strip()
        assert new_key.startswith("sc_") and new_key != old_key
        # The session opened with the old key has ended: a form of it (the token is still that
        # session's) and then every page send the browser to the login.
        for answer in (
            old.post("/ui/approvals/a-ticket/deny", {"csrf": token, "reason": "stale"}),
            old.get("/ui/"),
            old.get("/ui/runs"),
        ):
            assert answer.status_code == 303 and answer.headers["location"] == "/ui/login"
        form = old.get("/ui/login")
        again = old.post("/ui/login", {"csrf": _csrf(form.text), "key": old_key})
        assert again.status_code == 401
        # The new key opens a session that lasts.
        new.login(new_key)
        page = new.get("/ui/")
        assert page.status_code == 200 and "rotor" in page.text
    finally:
        old.close()
        new.close()
