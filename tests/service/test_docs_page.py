"""``/docs``: the API reference served as one page with no script and nothing from elsewhere,
made from the app's own OpenAPI document, against a real ``sandcell serve``; and a document
whose descriptions, names and defaults carry markup, served by a real uvicorn, shows it as
text."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import httpx2
import pytest
import uvicorn
from fastapi import Path as PathParam
from markupsafe import escape
from pydantic import BaseModel, ConfigDict, Field
from tests.service.server import ServiceProcess

from sandcell.service.app import create_app, make_service
from sandcell.service.core import ServiceConfig
from sandcell.service.docs_page import Text, TypePart, reference, render

_URL = re.compile(r"https?://[^\s\"'<>]+", re.IGNORECASE)
_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def _operations(doc: dict[str, object]) -> list[tuple[str, str, dict[str, object]]]:
    paths = doc["paths"]
    assert isinstance(paths, dict)
    return [
        (path, method, op)
        for path, item in paths.items()
        for method, op in item.items()
        if method in _METHODS
    ]


def _assert_links_resolve(page: str) -> None:
    ids = set(re.findall(r'\bid="([^"]+)"', page))
    targets = set(re.findall(r'href="#([^"]+)"', page))
    assert targets, "the page links nothing to its own sections"
    assert targets <= ids, f"links to nowhere: {sorted(targets - ids)}"


def test_docs_show_every_operation_offline(service: ServiceProcess) -> None:
    with httpx2.Client(base_url=service.url, timeout=60) as http:
        doc = http.get("/openapi.json").json()
        answer = http.get("/docs")
        ui_page = http.get("/ui/login")
        style = http.get("/ui/static/ui.css")
        assert http.get("/redoc").status_code == 404
        assert http.post("/docs").status_code == 405
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    page = answer.text

    operations = _operations(doc)
    assert len(operations) >= 20 and {p for p, _, _ in operations} >= {"/v1/runs", "/healthz"}
    for path, method, op in operations:
        assert f"<code>{method.upper()} {escape(path)}</code>" in page, (method, path)
        assert f'id="op-{op["operationId"]}"' in page, (method, path)
        if op.get("summary"):
            assert str(escape(str(op["summary"]))) in page
    for name in doc["components"]["schemas"]:
        assert f'id="schema-{name}"' in page, name
    _assert_links_resolve(page)
    # The request body of a run is shown with its fields, its type a link to the component.
    run_section = page.split('id="op-create_run_v1_runs_post"', 1)[1].split("</section>", 1)[0]
    assert '<a href="#schema-RunBody"><code>RunBody</code></a>' in run_section
    assert "<code>code</code>" in run_section and "<strong>required</strong>" in run_section
    assert str(escape("one of the tenant's profiles (default: its first)")) in run_section
    assert "Authorization: Bearer KEY" in run_section
    healthz = page.split('id="op-healthz_healthz_get"', 1)[1].split("</section>", 1)[0]
    assert "No key needed." in healthz
    assert 'href="/openapi.json"' in page

    # Nothing runs and nothing comes from another host.
    assert "<script" not in page.lower()
    assert not re.search(r"\son[a-z]+\s*=", page), "an event handler attribute"
    assert [u for u in _URL.findall(page) if not u.startswith(service.url)] == []
    for ref in re.findall(r'(?:href|src)="([^"#]*)"', page):
        assert ref.startswith("/") and not ref.startswith("//"), ref
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    # The same headers as the /ui pages.
    for header in (
        "content-security-policy",
        "x-frame-options",
        "x-content-type-options",
        "cache-control",
        "referrer-policy",
    ):
        assert answer.headers[header] == ui_page.headers[header], header
    assert "script-src" not in answer.headers["content-security-policy"]


class _Hostile(BaseModel):
    """A body whose documentation carries <b>markup</b> & an </section> end tag."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    note: str = Field(
        default="<img src=x onerror=alert(1)>",
        description="</td></tr></table><script>alert(2)</script>",
    )
    kind: Literal["<u>plain</u>", "other"] = "other"
    named: int = Field(default=0, alias="<i>odd</i>")


@pytest.fixture(scope="module")
def hostile_server(home: Path) -> Iterator[str]:
    """A real uvicorn on a free loopback port serving the service's app plus one operation
    whose documentation is markup."""
    service = make_service(ServiceConfig(home=home / "hostile"))
    app = create_app(service, mcp=False)

    @app.post(
        "/hostile/{item}",
        summary="<script>alert(3)</script>",
        description="if a < b && c > d: see <iframe src=https://elsewhere.example/x></iframe>",
        tags=["<em>tag</em>"],
    )
    async def hostile(
        item: Annotated[str, PathParam(description="<svg onload=alert(4)>")], body: _Hostile
    ) -> _Hostile:
        return body

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="hostile-docs")
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise AssertionError("uvicorn did not start")
            time.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(120)


def test_markup_in_the_document_is_shown_as_text(hostile_server: str) -> None:
    with httpx2.Client(base_url=hostile_server, timeout=60) as http:
        doc = http.get("/openapi.json").json()
        answer = http.get("/docs")
    assert answer.status_code == 200
    page = answer.text
    for path, method, _ in _operations(doc):
        assert f"<code>{method.upper()} {escape(path)}</code>" in page
    lowered = page.lower()
    for tag in ("<script", "<iframe", "<svg", "<img", "<u>", "<i>", "<em>", "<b>"):
        assert tag not in lowered, tag
    for shown in (
        "<script>alert(3)</script>",  # the summary
        "if a < b && c > d: see <iframe src=https://elsewhere.example/x></iframe>",
        "<svg onload=alert(4)>",  # a parameter's description
        "</td></tr></table><script>alert(2)</script>",  # a property's description
        "<img src=x onerror=alert(1)>",  # a default, inside its JSON quotes
        "<u>plain</u>",  # an enum value
        "<i>odd</i>",  # a property's name
        "<em>tag</em>",  # a tag
        "<b>markup</b> & an </section> end tag",  # a schema's description
    ):
        assert str(escape(shown)) in page, shown
        assert shown not in page, shown
    _assert_links_resolve(page)
    # A URL in a description is text, never a link or a source.
    assert not re.search(r'(?:href|src)="https?:', page)


def test_a_hand_written_document_is_shown_whole() -> None:
    """What FastAPI never writes but an OpenAPI document may hold: a list of types, an inline
    object inside an inline object, parameters and responses by ``$ref``, a pointer that
    leads in a circle or nowhere, and an operation open to requests without a key."""
    doc: dict[str, object] = {
        "openapi": "3.1.0",
        "info": {"title": "t", "version": "2", "description": "Use ``GET /a``.\n\nThen rest."},
        "security": [{"key": []}],
        "paths": {
            "/a/{id}": {
                "parameters": [{"$ref": "#/components/parameters/Id"}],
                "get": {
                    "operationId": "get_a",
                    "responses": {
                        "200": {"$ref": "#/components/responses/Thing"},
                        "500": {"$ref": "#/components/responses/Loop"},
                    },
                },
                "post": {
                    "security": [{}, {"key": []}],
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["outer"],
                                    "properties": {
                                        "outer": {
                                            "type": "object",
                                            "properties": {
                                                "inner": {"type": ["integer", "null"], "minimum": 1}
                                            },
                                        },
                                        "tags": {"type": "array", "items": {"const": "x"}},
                                    },
                                }
                            }
                        }
                    },
                    "responses": {"204": {"description": "done"}},
                },
            }
        },
        "components": {
            "parameters": {
                "Id": {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
            },
            "responses": {
                "Thing": {
                    "description": "the thing",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/T"}}},
                },
                "Loop": {"$ref": "#/components/responses/Loop"},
            },
            "schemas": {"T": {"allOf": [{"$ref": "#/components/schemas/T"}]}},
            "securitySchemes": {"key": {"type": "http", "scheme": "bearer"}},
        },
    }
    ref = reference(doc)
    ((_, (get, post)),) = ref.groups
    assert [(p.name, p.where, p.required) for p in get.parameters] == [("id", "path", True)]
    assert get.auth == ("the header Authorization: Bearer KEY",) and post.auth == ()
    thing, loop = get.responses
    assert thing.contents[0].schema is not None
    assert thing.contents[0].schema.type == (TypePart("T", "schema-T"),)
    assert (loop.status, loop.contents) == ("500", ())
    (body,) = post.body
    assert body.schema is not None
    outer, tags = body.schema.fields
    assert outer.required and not tags.required
    (inner,) = outer.fields
    assert [p.text for p in inner.type] == ["integer", " or ", "null"]
    assert inner.notes == ("at least 1",)
    assert [p.text for p in tags.type] == ["array of ", '"x"']
    assert ref.description == (
        (Text("Use "), Text("GET /a", code=True), Text(".")),
        (Text("Then rest."),),
    )
    page = render(ref, openapi_url=None).decode()
    assert "<code>outer.inner</code>" in page and 'id="schema-T"' in page
    _assert_links_resolve(page)
