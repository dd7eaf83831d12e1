"""The /ui page of a governed tool call waiting for a person: the whole call, its request line
first, scrollable, with its hash (rendered from a real ticket of a real approval store)."""

from __future__ import annotations

from pathlib import Path

from sandcell.policy.approvals import ApprovalStore
from sandcell.service.ui.render import page
from sandcell.service.ui.views import tool_ticket_view

PADDED = {
    "json": {"note": "routine cleanup " + "." * 6000},
    "method": "DELETE",
    "path": "/repos/acme/prod",
}


def _rendered(template: str, tmp_path: Path, **context: object) -> str:
    with ApprovalStore(tmp_path / "approvals.sqlite3") as store:
        ticket = store.submit_tool(
            profile="gh", tool="gh.request", args=PADDED, expires_in_s=60, run_id="r" * 32
        )
    view = tool_ticket_view(ticket)
    values = {"base": "/ui", "tenant": "ann", "csrf": "x", "t": view, **context}
    if template == "queue.html":
        values = {
            **values,
            "tools": [view],
            "approvals": [],
            "status": "pending",
            "statuses": (),
            "next_cursor": None,
            "tools_next_cursor": None,
        }
    return bytes(page(template, values).body).decode()


def test_the_tool_call_page_shows_the_request_line_and_the_whole_arguments(
    tmp_path: Path,
) -> None:
    body = _rendered("tool.html", tmp_path)
    assert '<code class="request-line">DELETE /repos/acme/prod</code>' in body
    assert "." * 6000 in body  # nothing cut; the box scrolls (pre.args)
    assert body.index("DELETE /repos/acme/prod") < body.index("." * 6000)
    assert '<pre class="args">' in body and "sha256" in body


def test_the_queue_shows_the_request_line_of_each_waiting_call(tmp_path: Path) -> None:
    body = _rendered("queue.html", tmp_path)
    assert '<code class="request-line">DELETE /repos/acme/prod</code>' in body
    assert "." * 6000 in body
