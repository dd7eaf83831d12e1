"""``/docs``: the API reference as one server-rendered page, made from the app's own OpenAPI
document.

FastAPI's Swagger UI and ReDoc pages load their scripts and styles from a CDN: on a host
without internet (this one, and many that run sandcell) they are blank, and serving them at all
would need a Content-Security-Policy that lets a script run. This page has no script, nothing
from another host, and the same headers as ``/ui``. Every operation is listed with its summary,
description, parameters, request body and responses; JSON Schemas are shown as tables of
properties (type, required, default, description), and a ``$ref`` as a link to the component
it names, described further down the same page.

The document is read into frozen view data (:func:`reference`, pure), then rendered by a Jinja
template with autoescape on (``ui/templates/api_docs.html``), so a description or a name with
markup in it is shown as text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route, request_response

from sandcell.service.ui.guard import UI_PATH, SecurityHeaders
from sandcell.service.ui.render import page

__all__ = [
    "DOCS_PATH",
    "Component",
    "Content",
    "Field",
    "Operation",
    "Parameter",
    "Reference",
    "ResponseView",
    "SchemaView",
    "Text",
    "TypePart",
    "docs_route",
    "reference",
    "render",
]

DOCS_PATH = "/docs"
_SCHEMAS = "#/components/schemas/"
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_MAX_DEPTH = 8
"""Inline object schemas nested deeper than this are shown by type only (a ``$ref`` is never
expanded in place, so only a hand-written document could nest this far)."""
_NOTES = (
    ("minimum", "at least"),
    ("exclusiveMinimum", "more than"),
    ("maximum", "at most"),
    ("exclusiveMaximum", "less than"),
    ("minLength", "length at least"),
    ("maxLength", "length at most"),
    ("minItems", "items at least"),
    ("maxItems", "items at most"),
    ("pattern", "matches"),
    ("multipleOf", "a multiple of"),
)
_CODE = re.compile(r"``(.+?)``|`([^`\n]+)`")


@dataclass(frozen=True, slots=True)
class TypePart:
    """A piece of a type as shown: text, or the name of a component schema (a link to it)."""

    text: str
    ref: str | None = None
    """The anchor of the component this piece names; None for plain text."""
    word: bool = False
    """A connecting word (``or``, ``array of``), shown as prose rather than as code."""


@dataclass(frozen=True, slots=True)
class Text:
    """A run of description text; ``code`` for what the source marked as code (backticks)."""

    text: str
    code: bool = False


Paragraphs = tuple[tuple[Text, ...], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Field:
    """One property of an object schema."""

    name: str
    type: tuple[TypePart, ...]
    required: bool
    notes: tuple[str, ...]
    """Default, limits, read-only and the like, each as a short phrase."""
    description: Paragraphs
    fields: tuple[Field, ...]
    """The properties of an inline object schema (a ``$ref`` is linked, not expanded)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemaView:
    """A JSON Schema as shown: its type, its notes and description, and its properties."""

    type: tuple[TypePart, ...]
    notes: tuple[str, ...]
    description: Paragraphs
    fields: tuple[Field, ...]
    extra: bool
    """Whether properties other than those listed are allowed (``additionalProperties``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Parameter:
    name: str
    where: str
    """``path``, ``query``, ``header`` or ``cookie``."""
    type: tuple[TypePart, ...]
    required: bool
    notes: tuple[str, ...]
    description: Paragraphs


@dataclass(frozen=True, slots=True, kw_only=True)
class Content:
    """A body in one media type; ``schema`` None where the document gives none."""

    media_type: str
    schema: SchemaView | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseView:
    status: str
    description: Paragraphs
    contents: tuple[Content, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Operation:
    method: str
    """Upper case: ``GET``, ``POST``..."""
    path: str
    anchor: str
    summary: str
    description: Paragraphs
    deprecated: bool
    auth: tuple[str, ...]
    """How a request carries the credentials it needs (any one of them); empty: none."""
    parameters: tuple[Parameter, ...]
    body: tuple[Content, ...]
    body_required: bool
    responses: tuple[ResponseView, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Component:
    name: str
    anchor: str
    schema: SchemaView


@dataclass(frozen=True, slots=True, kw_only=True)
class Reference:
    """Everything the page shows, in its order."""

    title: str
    version: str
    summary: str
    description: Paragraphs
    security: tuple[tuple[str, str, Paragraphs], ...]
    """Each security scheme: its name, how a request carries it, its description."""
    groups: tuple[tuple[str, tuple[Operation, ...]], ...]
    """Operations by their first tag, in the document's order."""
    components: tuple[Component, ...]


# -- reading the document ----------------------------------------------------------------------


def _anchor(prefix: str, name: str) -> str:
    """An id for the page made only of characters that need no escaping anywhere."""
    return f"{prefix}-" + re.sub(r"[^A-Za-z0-9_.-]", "-", name)


def _paragraphs(value: object) -> Paragraphs:
    """Description text as paragraphs (a blank line separates them; a single line break is
    the source's wrapping), with backticked spans marked as code."""
    if not isinstance(value, str) or not value.strip():
        return ()
    out = []
    for block in re.split(r"\n\s*\n", value.strip()):
        text = " ".join(line.strip() for line in block.splitlines() if line.strip())
        parts: list[Text] = []
        at = 0
        for found in _CODE.finditer(text):
            if found.start() > at:
                parts.append(Text(text[at : found.start()]))
            parts.append(Text(found.group(1) or found.group(2), code=True))
            at = found.end()
        if at < len(text):
            parts.append(Text(text[at:]))
        out.append(tuple(parts))
    return tuple(out)


def _map(value: object) -> Mapping[str, Any]:
    """``value`` where it is an object, else an empty one: a document from elsewhere may
    leave out or misshape any part, and the page shows what there is."""
    return value if isinstance(value, Mapping) else {}


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _resolve(doc: Mapping[str, Any], node: object) -> Mapping[str, Any]:
    """A parameter, body or response object, following ``$ref`` pointers inside the document
    (a pointer that leads nowhere, or in a circle, gives an empty object)."""
    seen: set[str] = set()
    while isinstance(node, Mapping) and isinstance(node.get("$ref"), str):
        pointer = node["$ref"]
        if not pointer.startswith("#/") or pointer in seen:
            return {}
        seen.add(pointer)
        target: object = doc
        for token in pointer[2:].split("/"):
            key = token.replace("~1", "/").replace("~0", "~")
            target = target.get(key) if isinstance(target, Mapping) else None
        node = target
    return node if isinstance(node, Mapping) else {}


def _joined(parts: Sequence[tuple[TypePart, ...]], word: str) -> tuple[TypePart, ...]:
    out: list[TypePart] = []
    for i, part in enumerate(parts):
        if i:
            out.append(TypePart(f" {word} ", word=True))
        out.extend(part)
    return tuple(out)


def _type(schema: object) -> tuple[TypePart, ...]:
    """A schema's type as a person reads it: ``string``, ``array of RunBody``, ``integer or
    null``, ``map of string to string``, ``"python" | "bash"``."""
    if not isinstance(schema, Mapping) or not schema:
        return (TypePart("any"),)
    ref = schema.get("$ref")
    if isinstance(ref, str):
        if ref.startswith(_SCHEMAS):
            name = ref.removeprefix(_SCHEMAS)
            return (TypePart(name, _anchor("schema", name)),)
        return (TypePart(ref),)
    for key, word in (("anyOf", "or"), ("oneOf", "or"), ("allOf", "and")):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return _joined([_type(o) for o in options], word)
    if "const" in schema:
        return (TypePart(_json(schema["const"])),)
    if isinstance(schema.get("enum"), list):
        return (TypePart(" | ".join(_json(v) for v in schema["enum"])),)
    kind = schema.get("type")
    if isinstance(kind, list):
        return _joined([_type({**schema, "type": k}) for k in kind], "or")
    if kind == "array":
        items = schema.get("items")
        return (TypePart("array of ", word=True), *_type(items)) if items else (TypePart("array"),)
    extra = schema.get("additionalProperties")
    if kind == "object" or "properties" in schema:
        if isinstance(extra, Mapping) and extra and not schema.get("properties"):
            return (TypePart("map of string to ", word=True), *_type(extra))
        return (TypePart("object"),)
    if isinstance(kind, str):
        fmt = schema.get("format")
        return (TypePart(f"{kind} ({fmt})" if isinstance(fmt, str) else kind),)
    return (TypePart("any"),)


def _notes(schema: Mapping[str, Any]) -> tuple[str, ...]:
    notes = []
    if "default" in schema:
        notes.append(f"default {_json(schema['default'])}")
    for key, phrase in _NOTES:
        if key in schema:
            notes.append(f"{phrase} {_json(schema[key])}")
    for key in ("readOnly", "writeOnly", "deprecated"):
        if schema.get(key) is True:
            notes.append({"readOnly": "read-only", "writeOnly": "write-only"}.get(key, key))
    examples = schema.get("examples")
    if isinstance(examples, list) and examples:
        notes.append("e.g. " + ", ".join(_json(e) for e in examples[:3]))
    return tuple(notes)


def _inline_object(schema: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object schema whose properties a field lists in place: the schema itself, or the
    one option of an ``anyOf``/``oneOf`` with null that is an inline object."""
    if isinstance(schema.get("properties"), Mapping):
        return schema
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            objects = [o for o in options if isinstance(o, Mapping) and o.get("properties")]
            if len(objects) == 1:
                return objects[0]
    return None


def _fields(schema: Mapping[str, Any], depth: int) -> tuple[Field, ...]:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or depth > _MAX_DEPTH:
        return ()
    required = schema.get("required")
    needed = set(required) if isinstance(required, list) else set()
    out = []
    for name, raw in properties.items():
        prop = _map(raw)
        inner = _inline_object(prop)
        out.append(
            Field(
                name=str(name),
                type=_type(prop),
                required=name in needed,
                notes=_notes(prop),
                description=_paragraphs(prop.get("description")),
                fields=_fields(inner, depth + 1) if inner is not None else (),
            )
        )
    return tuple(out)


def _schema(schema: object, doc: Mapping[str, Any] | None = None) -> SchemaView:
    """A schema's view; given ``doc``, a schema that only names a component is shown with
    that component's properties in place (a request body is read where it is sent), its type
    still a link to the component."""
    if not isinstance(schema, Mapping):
        schema = {}
    shown = schema
    ref = schema.get("$ref")
    if doc is not None and isinstance(ref, str) and ref.startswith(_SCHEMAS):
        shown = _resolve(doc, schema)
    inner = _inline_object(shown)
    return SchemaView(
        type=_type(schema),
        notes=_notes(schema),
        description=_paragraphs(shown.get("description")),
        fields=_fields(inner, 0) if inner is not None else (),
        extra=inner is None or inner.get("additionalProperties", True) is not False,
    )


def _contents(node: Mapping[str, Any], doc: Mapping[str, Any] | None = None) -> tuple[Content, ...]:
    content = node.get("content")
    if not isinstance(content, Mapping):
        return ()
    out = []
    for media_type, body in content.items():
        schema = body.get("schema") if isinstance(body, Mapping) else None
        out.append(
            Content(
                media_type=str(media_type), schema=None if schema is None else _schema(schema, doc)
            )
        )
    return tuple(out)


def _auth(doc: Mapping[str, Any], op: Mapping[str, Any]) -> tuple[str, ...]:
    """How a request carries what an operation needs (its own ``security``, else the
    document's); none when an empty requirement among them accepts a request without a key."""
    security = op.get("security", doc.get("security"))
    if not isinstance(security, list) or not security:
        return ()
    names: list[str] = []
    for requirement in security:
        if not isinstance(requirement, Mapping) or not requirement:
            return ()
        names.extend(str(n) for n in requirement if str(n) not in names)
    how = {name: carried for name, carried, _ in _security(doc)}
    return tuple(how.get(name, name) for name in names)


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _operation(
    doc: Mapping[str, Any], path: str, item: Mapping[str, Any], method: str, op: Mapping[str, Any]
) -> Operation:
    # Parameters shared by every method of the path come first, as the document lists them.
    params = [*_list(item.get("parameters")), *_list(op.get("parameters"))]
    parameters = []
    for raw in params:
        p = _resolve(doc, raw)
        schema = _map(p.get("schema"))
        parameters.append(
            Parameter(
                name=str(p.get("name", "?")),
                where=str(p.get("in", "?")),
                type=_type(schema),
                required=bool(p.get("required")),
                notes=_notes(schema),
                description=_paragraphs(p.get("description") or schema.get("description")),
            )
        )
    body = _resolve(doc, op.get("requestBody"))
    responses = op.get("responses")
    views = []
    for status, raw in _map(responses).items():
        response = _resolve(doc, raw)
        views.append(
            ResponseView(
                status=str(status),
                description=_paragraphs(response.get("description")),
                contents=_contents(response),
            )
        )
    name = op.get("operationId")
    return Operation(
        method=method.upper(),
        path=path,
        anchor=_anchor("op", name if isinstance(name, str) else f"{method}{path}"),
        summary=str(op.get("summary") or ""),
        description=_paragraphs(op.get("description")),
        deprecated=op.get("deprecated") is True,
        auth=_auth(doc, op),
        parameters=tuple(parameters),
        body=_contents(body, doc),
        body_required=bool(body.get("required")),
        responses=tuple(views),
    )


def _security(doc: Mapping[str, Any]) -> tuple[tuple[str, str, Paragraphs], ...]:
    schemes = _map(_map(doc.get("components")).get("securitySchemes"))
    out = []
    for name, raw in schemes.items():
        scheme = _map(raw)
        kind = scheme.get("type")
        if kind == "http" and str(scheme.get("scheme", "")).lower() == "bearer":
            how = "the header Authorization: Bearer KEY"
        elif kind == "http":
            how = f"HTTP {scheme.get('scheme', '')} authentication"
        elif kind == "apiKey":
            how = f"the {scheme.get('in', '')} {scheme.get('name', '')}"
        else:
            how = str(kind or "?")
        out.append((str(name), how, _paragraphs(scheme.get("description"))))
    return tuple(out)


def reference(doc: Mapping[str, Any]) -> Reference:
    """What the page shows of an OpenAPI document (pure: the document is only read)."""
    groups: dict[str, list[Operation]] = {}
    paths = doc.get("paths")
    for path, item in _map(paths).items():
        if not isinstance(item, Mapping):
            continue
        for method in _METHODS:
            op = item.get(method)
            if not isinstance(op, Mapping):
                continue
            tags = op.get("tags")
            tag = str(tags[0]) if isinstance(tags, list) and tags else "other"
            groups.setdefault(tag, []).append(_operation(doc, str(path), item, method, op))
    schemas = _map(_map(doc.get("components")).get("schemas"))
    info = _map(doc.get("info"))
    return Reference(
        title=str(info.get("title", "API")),
        version=str(info.get("version", "")),
        summary=str(info.get("summary") or ""),
        description=_paragraphs(info.get("description")),
        security=_security(doc),
        groups=tuple((tag, tuple(ops)) for tag, ops in groups.items()),
        components=tuple(
            Component(name=str(name), anchor=_anchor("schema", str(name)), schema=_schema(schema))
            for name, schema in schemas.items()
        ),
    )


# -- serving it ------------------------------------------------------------------------------------


def render(ref: Reference, *, openapi_url: str | None) -> bytes:
    """The page's HTML."""
    context = {"base": UI_PATH, "tenant": None, "csrf": "", "ref": ref, "openapi": openapi_url}
    return bytes(page("api_docs.html", context).body)


def docs_route(app: FastAPI) -> Route:
    """``GET /docs`` for ``app``: rendered on the first request (when every route is in
    place) and kept, since the document does not change while the app runs; served with the
    headers of ``/ui``."""
    rendered: list[bytes] = []

    async def docs(_: Request) -> Response:
        if not rendered:
            rendered.append(render(reference(app.openapi()), openapi_url=app.openapi_url))
        return HTMLResponse(rendered[0])

    return Route(
        DOCS_PATH,
        endpoint=SecurityHeaders(request_response(docs)),
        methods=["GET"],
        include_in_schema=False,
    )
