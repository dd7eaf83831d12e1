"""``/ui`` in a real headless Chromium (Debian's ``chromium``), driven as a person would: log in
with the key, find the run in the queue, open it, give a reason, press Approve, and read the
run's result page, where the program's hostile output is text and its figure an image.

Set ``SANDCELL_UI_SCREENSHOT=docs/images/ui-approval.png`` to keep the approval page's
screenshot (the docs' picture comes from this test).
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import pytest
from tests.service.server import ServiceProcess, add_approver, add_tenant
from tests.service.ui_chromium import Chromium, chromium_path

pytestmark = pytest.mark.skipif(
    chromium_path() is None,
    reason="no chromium on this host: apt-get install chromium (the /ui browser test needs it)",
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CODE = """\
import csv
import subprocess

import matplotlib.pyplot as plt

# Sum the sales per region, then plot them.
with open("/inputs/sales.csv") as f:
    rows = list(csv.DictReader(f))
totals = {}
for row in rows:
    totals[row["region"]] = totals.get(row["region"], 0) + float(row["amount"])
print(totals)
print(subprocess.run(["echo", "done"], capture_output=True, text=True).stdout)
print("<script>document.title = 'pwned'</script><img src=x onerror=alert(1)>")
plt.bar(list(totals), list(totals.values()))
plt.title("sales per region")
"""
SALES = b"region,amount\nnorth,120\nsouth,80\nnorth,40\neast,95\n"


def test_a_person_approves_a_run_in_chromium(
    service: ServiceProcess, home: Path, tmp_path: Path
) -> None:
    key = add_tenant(home, "carol", profiles=("supervised",))
    with service.client(key) as api:
        answer = api.post(
            "/v1/runs",
            json={
                "code": CODE,
                "display": True,
                "files": {"sales.csv": base64.b64encode(SALES).decode()},
            },
        ).json()
    assert answer["result"]["outcome"] == "awaiting_approval", answer
    approval = answer["result"]["policy"]["approval"]["id"]

    browser = Chromium(tmp_path / "chromium-profile")
    try:
        browser.goto(f"{service.url}/ui/")
        browser.wait_for("location.pathname === '/ui/login'")
        # A person logs in with the tenant's approver key (its own key submits, and does not
        # approve under this profile).
        browser.type_into("#key", add_approver(home, "carol"))
        browser.click("#login")
        browser.wait_for("location.pathname === '/ui/'")
        assert browser.evaluate("document.cookie") == "", "the session cookie must be HttpOnly"
        queue = browser.text("main")
        assert approval in queue and "sales.csv" in queue and "supervised" in queue

        browser.click(f'a[href="/ui/approvals/{approval}"]')
        browser.wait_for(f"location.pathname === '/ui/approvals/{approval}'")
        assert "py.process" in browser.text("ul.findings")
        assert 'print("<script>' in browser.text("table.code")
        # The stylesheet loaded from the service itself (the CSP allows no other).
        assert browser.evaluate("getComputedStyle(document.querySelector('header')).display") == (
            "flex"
        )
        shot = tmp_path / "ui-approval.png"
        browser.screenshot(shot)
        assert shot.read_bytes().startswith(PNG_MAGIC)
        keep = os.environ.get("SANDCELL_UI_SCREENSHOT")
        if keep:
            shutil.copyfile(shot, keep)

        browser.type_into("#approve-reason", "reads its own input; the echo is harmless")
        browser.click("#approve")
        browser.wait_for("document.querySelector('#outcome') !== null", timeout=180)
        assert browser.text("#outcome") == "ok", browser.text("main")
        stdout = browser.text("#stdout")
        assert "{'north': 160.0, 'south': 80.0, 'east': 95.0}" in stdout
        assert "<script>document.title = 'pwned'</script><img src=x onerror=alert(1)>" in stdout
        # Shown as text, never run: no script element, no title change, one image (the figure).
        assert browser.evaluate("document.querySelectorAll('script').length") == 0
        assert browser.evaluate("document.title").startswith("Run ")
        assert browser.evaluate("document.querySelectorAll('img').length") == 1
        assert browser.wait_for(
            "(i => i.complete && i.naturalWidth > 0)(document.querySelector('figure img'))"
        )
        assert "approver:carol/reviewer (browser)" in browser.text("main")
    finally:
        browser.close()

    with service.client(key) as api:
        shown = api.get(f"/v1/approvals/{approval}").json()
    assert shown["status"] == "ran"
    assert shown["decided_by"] == "approver:carol/reviewer (browser)"
    assert shown["decision_reason"] == "reads its own input; the echo is harmless"
