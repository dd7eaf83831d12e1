"""Code mode: a profile's governed tools, shown to the model as a small typed Python API.

A program calls a tool with ``sandcell_tools.call("tickets.search_tickets", query="refund")``.
The model writes better calls when it sees each operation as a typed function, so the prompt
carries one stub per operation, written from the operation's JSON Schema::

    def tickets__search_tickets(*, query: str, limit: int = 10) -> Any:
        \"\"\"Search tickets whose title contains the query.

        sandcell_tools.call("tickets.search_tickets", query=..., limit=...)
        \"\"\"

The stubs document; they are not defined in the sandbox. Calling through ``sandcell_tools``
directly keeps the program's code exactly what the policy checked and the record holds.

:func:`list_operations` asks the host's tool gateway what a sandbox's ``sandcell_tools.list()``
would get (an MCP server's real ``inputSchema``; this starts the server once, on the host, with
the credential only the host holds). :func:`render_api` is pure. A tool whose server cannot be
listed is rendered from the profile's ``allow`` list with ``**kwargs``.
"""

from __future__ import annotations

import json
import keyword
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from sandcell.policy.profiles import Profile
from sandcell.tools.definitions import HttpTool, ToolDefinition

__all__ = [
    "ToolOperation",
    "list_operations",
    "operations_from_listing",
    "python_type",
    "render_api",
    "render_stub",
]

ToolKind = Literal["http", "mcp"]

_DESCRIPTION_CHARS = 400
_ARGUMENT_CHARS = 160
_ENUM_VALUES = 16
_SIMPLE = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
    "null": "None",
}
_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")
_RESULT_TYPES: Mapping[ToolKind, tuple[str, str]] = {
    "http": (
        "HttpResult",
        """class HttpResult(TypedDict):
    status: int
    content_type: str
    body: Any  # parsed JSON when content_type is application/json, else the text""",
    ),
    "mcp": (
        "McpResult",
        """class McpResult(TypedDict):
    content: list[dict[str, Any]]  # e.g. [{"type": "text", "text": "..."}]
    structuredContent: NotRequired[Any]  # the result as JSON, when the server gives one
    isError: bool""",
    ),
}
_LINE = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolOperation:
    """One operation a run may call, as the gateway lists it."""

    name: str
    """``tool.operation``, the name ``sandcell_tools.call`` takes."""
    kind: ToolKind
    description: str = ""
    input_schema: Mapping[str, object] | None = None
    """The arguments' JSON Schema; None when it could not be read (see ``problem``)."""
    approval: str = "never"
    """``always``: each call waits for a person."""
    problem: str | None = None
    """Why the schema is unknown."""

    def to_dict(self) -> dict[str, object]:
        """Plain JSON, for a conversation that waits for an approval."""
        return {
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "input_schema": dict(self.input_schema) if self.input_schema is not None else None,
            "approval": self.approval,
            "problem": self.problem,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ToolOperation:
        """The operation :meth:`to_dict` wrote. Raises ValueError for anything else."""
        kind, schema, problem = data.get("kind"), data.get("input_schema"), data.get("problem")
        if kind not in ("http", "mcp"):
            raise ValueError(f"tool operation kind {kind!r}")
        if schema is not None and not isinstance(schema, Mapping):
            raise ValueError("a tool operation's input_schema must be an object")
        return cls(
            name=str(data["name"]),
            kind="http" if kind == "http" else "mcp",
            description=str(data.get("description") or ""),
            input_schema=schema,
            approval=str(data.get("approval") or "never"),
            problem=None if problem is None else str(problem),
        )


def list_operations(
    profile: Profile, *, environ: Mapping[str, str] | None = None
) -> tuple[ToolOperation, ...]:
    """What ``sandcell_tools.list()`` shows a run under ``profile``, asked of a gateway built on
    the host (no socket, no sandbox). Empty when the profile has no tools.

    Raises:
        ConfigError: a tool's credential is not set on the host, or an MCP tool's SDK is not
            installed: no run under this profile could call its tools either.
    """
    if not profile.tools:
        return ()
    from sandcell.tools.gateway import ToolGateway
    from sandcell.tools.protocol import Request

    gateway = ToolGateway(profile=profile.name, tools=profile.tools, environ=environ)
    try:
        answer = gateway.execute(Request(op="list"), request_bytes=0)
    finally:
        gateway.stop()
    if not answer["ok"]:
        error = str(answer.get("error"))
        entries: list[Mapping[str, object]] = [
            {"name": t.name, "error": error} for t in profile.tools
        ]
    else:
        result = answer["result"]
        entries = [e for e in result if isinstance(e, Mapping)] if isinstance(result, list) else []
    return operations_from_listing(entries, profile.tools)


def operations_from_listing(
    entries: Sequence[Mapping[str, object]], tools: Sequence[ToolDefinition]
) -> tuple[ToolOperation, ...]:
    """The operations of a gateway's ``list`` answer. An entry ``{"name": TOOL, "error": ...}``
    (a server that could not be listed) becomes the tool's allowed operations without schemas."""
    kinds: dict[str, ToolKind] = {
        t.name: "http" if isinstance(t, HttpTool) else "mcp" for t in tools
    }
    by_name = {t.name: t for t in tools}
    out: list[ToolOperation] = []
    for entry in entries:
        name = str(entry.get("name", ""))
        tool_name = name.partition(".")[0]
        kind = kinds.get(tool_name)
        if kind is None:
            continue  # not the profile's: nothing to tell the model about
        if "error" in entry:
            tool = by_name[tool_name]
            operations = ("request",) if isinstance(tool, HttpTool) else tool.allow
            problem = str(entry["error"])
            out += [
                ToolOperation(
                    name=f"{tool_name}.{op}",
                    kind=kind,
                    description=tool.description,
                    approval=tool.approval_for(op),
                    problem=problem,
                )
                for op in operations
            ]
            continue
        schema = entry.get("input_schema")
        out.append(
            ToolOperation(
                name=name,
                kind=kind,
                description=str(entry.get("description") or ""),
                input_schema=schema if isinstance(schema, Mapping) else None,
                approval=str(entry.get("approval") or "never"),
                problem=None if isinstance(schema, Mapping) else "the server gave no schema",
            )
        )
    return tuple(out)


def render_api(operations: Sequence[ToolOperation]) -> str:
    """One stub per operation (see the module), after the result types they return, as the
    body of a Python block."""
    kinds = [k for k in _RESULT_TYPES if any(op.kind == k for op in operations)]
    stubs = [_RESULT_TYPES[k][1] for k in kinds]
    taken: set[str] = set()
    for op in operations:
        base = _NOT_NAME.sub("_", op.name.replace(".", "__", 1))
        name, n = base, 1
        while name in taken or keyword.iskeyword(name):
            n += 1
            name = f"{base}_{n}"
        taken.add(name)
        stubs.append(render_stub(op, function=name))
    return "\n\n\n".join(stubs)


def render_stub(op: ToolOperation, *, function: str) -> str:
    """The typed stub of one operation, named ``function``."""
    params: list[str] = []
    call_args: list[str] = []
    notes: list[str] = []
    odd: list[str] = []
    schema = op.input_schema
    if schema is None:
        params.append("**kwargs: Any")
        call_args.append("**kwargs")
        why = f" ({_clean(op.problem, _ARGUMENT_CHARS)})" if op.problem else ""
        notes.append(f"Its arguments could not be listed{why}; sandcell_tools.list() shows them.")
    else:
        properties = schema.get("properties")
        props = properties if isinstance(properties, Mapping) else {}
        listed = schema.get("required")
        required = {str(r) for r in listed} if isinstance(listed, list) else set()
        ordered = sorted(props, key=lambda k: k not in required)  # stable: required first
        for key in ordered:
            prop = props[key]
            annotation = python_type(prop)
            needed = key in required
            if not (key.isidentifier() and not keyword.iskeyword(key)):
                odd.append(f"{key!r}: {annotation}{'' if needed else ', optional'}")
                continue
            params.append(_parameter(key, annotation, prop, needed=needed))
            call_args.append(f"{key}=...")
            text = prop.get("description") if isinstance(prop, Mapping) else None
            if isinstance(text, str) and text.strip():
                notes.append(f"{key}: {_clean(text, _ARGUMENT_CHARS)}")
        if odd:
            params.append("**kwargs: Any")
            call_args.append("**{...}")
            notes.append(
                "Arguments that are not Python names, passed as **{name: value}: " + "; ".join(odd)
            )
        elif not props and schema.get("additionalProperties", True) is not False:
            params.append("**kwargs: Any")
            call_args.append("**kwargs")
    if params and not params[0].startswith("**"):
        params.insert(0, "*")
    result = _RESULT_TYPES[op.kind][0]
    signature = f"def {function}({', '.join(params)}) -> {result}:"
    if len(signature) > _LINE:
        listed = "".join(f"    {p},\n" for p in params)
        signature = f"def {function}(\n{listed}) -> {result}:"
    doc = [_clean(op.description, _DESCRIPTION_CHARS) or f"The operation {op.name}."]
    if op.approval == "always":
        doc.append("Each call waits for a person's approval (the run waits with it).")
    doc += notes
    doc.append(f"sandcell_tools.call({json.dumps(op.name)}{''.join(', ' + a for a in call_args)})")
    body = "\n".join(f"    {line}" if line else "" for line in _docstring(doc).splitlines())
    return f"{signature}\n{body}"


def python_type(schema: object) -> str:
    """The Python annotation of a JSON Schema: string str, integer int, number float, boolean
    bool, array list (``list[T]`` when its items have a type), object dict, null None, an enum
    of a few scalars a ``Literal``, several types a union; anything else ``Any``."""
    if not isinstance(schema, Mapping):
        return "Any"
    values = schema.get("enum")
    if "const" in schema:
        values = [schema["const"]]
    if (
        isinstance(values, list)
        and 0 < len(values) <= _ENUM_VALUES
        and all(isinstance(v, str | int | float | bool) for v in values)
    ):
        return "Literal[" + ", ".join(_literal(v) for v in values) + "]"
    for combinator in ("anyOf", "oneOf"):
        options = schema.get(combinator)
        if isinstance(options, list) and options:
            return _union(python_type(o) for o in options)
    kind = schema.get("type")
    if isinstance(kind, list) and kind:
        return _union(python_type({**schema, "type": k}) for k in kind)
    if kind == "array":
        inner = python_type(schema.get("items")) if schema.get("items") else "Any"
        return "list" if inner == "Any" else f"list[{inner}]"
    if kind == "object":
        extra = schema.get("additionalProperties")
        inner = python_type(extra) if isinstance(extra, Mapping) and extra else "Any"
        return "dict" if inner == "Any" else f"dict[str, {inner}]"
    return _SIMPLE.get(kind, "Any") if isinstance(kind, str) else "Any"


def _union(parts: Iterable[str]) -> str:
    seen: list[str] = []
    for part in parts:
        if part == "Any":
            return "Any"
        if part not in seen:
            seen.append(part)
    return " | ".join(seen)


def _parameter(key: str, annotation: str, prop: object, *, needed: bool) -> str:
    if needed:
        return f"{key}: {annotation}"
    default = prop.get("default", None) if isinstance(prop, Mapping) else None
    if isinstance(default, str | int | float | bool) and len(repr(default)) <= 40:
        return f"{key}: {annotation} = {_literal(default)}"
    if annotation != "Any" and "None" not in annotation.split(" | "):
        annotation += " | None"
    return f"{key}: {annotation} = None"


def _literal(value: str | float | bool) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _clean(text: str | None, limit: int) -> str:
    """One line of the server's text, safe inside a docstring: a description is the server's
    to write, so it can neither close the docstring nor run on without end."""
    if not text:
        return ""
    flat = " ".join(text.split()).replace('"""', "'''")
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def _docstring(lines: Sequence[str]) -> str:
    head, rest = lines[0], lines[1:]
    if not rest and len(head) <= _LINE - 10:
        return f'"""{head}"""'
    wrapped = [textwrap.fill(line, _LINE - 4, break_on_hyphens=False) for line in rest[:-1]]
    # The call line stays whole: it is the one the model copies.
    return "\n".join([f'"""{textwrap.fill(head, _LINE - 7)}', "", *wrapped, *rest[-1:], '"""'])
