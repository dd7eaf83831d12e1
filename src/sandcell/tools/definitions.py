"""``[tools.NAME]`` sections of a profile, parsed into frozen tool definitions.

Two kinds::

    [tools.weather]
    kind = "http"
    base_url = "https://api.example.com/v1"
    allow = ["GET /forecast/*"]          # METHOD /path glob: '*' one segment, '**' any
    credential_env = "WEATHER_API_KEY"   # read by the host gateway at start
    header = "Authorization"             # default; scheme "Bearer" (default) or "" (raw value)
    approval = "never"

    [tools.tickets]
    kind = "mcp"
    command = ["ticket-mcp-server"]      # stdio; or url = "http://127.0.0.1:8000/mcp"
    allow = ["search_tickets", "create_ticket"]
    approval = { create_ticket = "always" }

Every kind takes the limits of :class:`ToolLimits` as keys of the same table. Empty ``allow``
allows nothing; there is no wildcard tool name, so a new upstream tool is never allowed by
accident.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Literal
from urllib.parse import urlsplit

from sandcell.errors import ConfigError
from sandcell.tools.http_rules import HttpRule, parse_http_rule

ApprovalMode = Literal["never", "always"]
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_MCP_TOOL = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HEADER = re.compile(r"^[A-Za-z0-9-]{1,64}$")
_SCHEME = re.compile(r"^[A-Za-z0-9._-]{0,32}$")
_COMMON = ("kind", "allow", "approval", "description", "credential_env")


class ToolDefinitionError(ConfigError):
    """A key of a ``[tools.NAME]`` section is invalid: ``key`` (and ``item``) say which."""

    def __init__(self, reason: str, tool: str, key: str, item: str | None = None) -> None:
        super().__init__(f"[tools.{tool}] {key}: {reason}")
        self.reason, self.tool, self.key, self.item = reason, tool, key, item


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolLimits:
    """What one run may do with one tool. Each cap refuses at once, never queues."""

    max_calls: int = 100
    """Calls in the whole run."""
    rate_per_minute: int = 30
    """Calls in any 60 seconds."""
    max_request_bytes: int = 64 * 1024
    """The largest arguments, as JSON."""
    max_result_bytes: int = 1024 * 1024
    """The largest result the upstream may return; a larger one fails the call."""
    timeout_s: float = 30.0
    """How long one upstream call may take."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            kinds = (int, float) if f.name == "timeout_s" else (int,)
            if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0:
                raise ValueError(f"must be a positive {'number' if kinds != (int,) else 'integer'}")
        if self.max_request_bytes > 16 * 1024 * 1024 or self.max_result_bytes > 64 * 1024 * 1024:
            raise ValueError("request sizes above 16 MiB and results above 64 MiB are refused")


LIMIT_KEYS = tuple(f.name for f in fields(ToolLimits))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Common:
    name: str
    description: str = ""
    credential_env: str | None = None
    """The host environment variable holding the credential; None: the tool needs none."""
    approval: Mapping[str, ApprovalMode] = field(default_factory=lambda: MappingProxyType({}))
    """Operation -> mode; operations not named take ``default_approval``."""
    default_approval: ApprovalMode = "never"
    limits: ToolLimits = field(default_factory=ToolLimits)

    def approval_for(self, operation: str) -> ApprovalMode:
        """Whether a call of ``operation`` waits for a person."""
        return self.approval.get(operation, self.default_approval)


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpTool(_Common):
    """An HTTP API under ``base_url``; the program names a method and a path."""

    kind: Literal["http"] = "http"
    base_url: str
    allow: tuple[HttpRule, ...]
    header: str = "Authorization"
    scheme: str = "Bearer"
    """Prefix of the header value (``Bearer <key>``); empty: the credential alone."""


@dataclass(frozen=True, slots=True, kw_only=True)
class McpTool(_Common):
    """An upstream MCP server, started on the host (``command``) or reached at ``url``."""

    kind: Literal["mcp"] = "mcp"
    command: tuple[str, ...] = ()
    url: str | None = None
    allow: tuple[str, ...]
    """Upstream tool names the run may call."""


ToolDefinition = HttpTool | McpTool


def parse_tools(table: Mapping[str, object]) -> tuple[ToolDefinition, ...]:
    """The ``[tools]`` table of a profile (name -> section), checked completely.

    Raises:
        ToolDefinitionError: naming the tool, the key and the reason.
    """
    return tuple(_parse_one(name, section) for name, section in table.items())


def _parse_one(name: str, section: object) -> ToolDefinition:
    if not _NAME.match(name):
        raise ToolDefinitionError(
            "a tool name is a lower-case letter then up to 31 of a-z, 0-9, '_'", name, "name"
        )
    if not isinstance(section, Mapping):
        raise ToolDefinitionError("must be a table", name, "name")
    kind = section.get("kind")
    if kind == "http":
        known: tuple[str, ...] = (*_COMMON, "base_url", "header", "scheme", *LIMIT_KEYS)
    elif kind == "mcp":
        known = (*_COMMON, "command", "url", *LIMIT_KEYS)
    else:
        raise ToolDefinitionError(f"unknown kind {kind!r}; use 'http' or 'mcp'", name, "kind")
    for key in section:
        if key not in known:
            raise ToolDefinitionError(f"unknown key; known keys: {', '.join(known)}", name, key)
    common = {
        "name": name,
        "description": _string(section, name, "description") or "",
        "credential_env": _env(section, name),
        "limits": _limits(section, name),
    }
    allow = _strings(section, name, "allow")
    if kind == "http":
        rules = []
        for text in allow:
            try:
                rules.append(parse_http_rule(text))
            except ValueError as exc:
                raise ToolDefinitionError(str(exc), name, "allow", text) from None
        default, per = _approval(section, name, ("request",))
        return HttpTool(
            **common,  # type: ignore[arg-type]
            base_url=_base_url(section, name),
            allow=tuple(rules),
            header=_match(section, name, "header", _HEADER, "Authorization"),
            scheme=_match(section, name, "scheme", _SCHEME, "Bearer"),
            default_approval=default,
            approval=per,
        )
    for tool in allow:
        if not _MCP_TOOL.match(tool):
            raise ToolDefinitionError(f"{tool!r} is not an MCP tool name", name, "allow", tool)
    command, url = section.get("command"), section.get("url")
    if (command is None) == (url is None):
        raise ToolDefinitionError(
            "give command (stdio) or url (streamable HTTP), one", name, "kind"
        )
    default, per = _approval(section, name, allow)
    if command is not None:
        argv = _strings(section, name, "command")
        if not argv or not argv[0]:
            raise ToolDefinitionError("must name a program", name, "command")
        return McpTool(**common, command=argv, allow=allow, default_approval=default, approval=per)  # type: ignore[arg-type]
    return McpTool(
        **common,  # type: ignore[arg-type]
        url=_http_url(section, name, "url"),
        allow=allow,
        default_approval=default,
        approval=per,
    )


def _string(section: Mapping[str, object], tool: str, key: str) -> str | None:
    value = section.get(key)
    if value is not None and not isinstance(value, str):
        raise ToolDefinitionError(f"must be a string, got {value!r}", tool, key)
    return value


def _strings(section: Mapping[str, object], tool: str, key: str) -> tuple[str, ...]:
    value = section.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ToolDefinitionError(f"must be a list of strings, got {value!r}", tool, key)
    return tuple(value)


def _match(
    section: Mapping[str, object], tool: str, key: str, pattern: re.Pattern[str], default: str
) -> str:
    value = _string(section, tool, key)
    if value is None:
        return default
    if not pattern.match(value):
        raise ToolDefinitionError(f"{value!r} is not a valid {key}", tool, key)
    return value


def _env(section: Mapping[str, object], tool: str) -> str | None:
    value = _string(section, tool, "credential_env")
    if value is not None and not _ENV.match(value):
        raise ToolDefinitionError(
            f"{value!r} is not an environment variable name", tool, "credential_env"
        )
    return value


def _http_url(section: Mapping[str, object], tool: str, key: str) -> str:
    value = _string(section, tool, key) or ""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolDefinitionError(f"{value!r} is not an http(s) URL", tool, key)
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ToolDefinitionError(
            "no user information, query or fragment; put a credential in credential_env",
            tool,
            key,
        )
    return value


def _base_url(section: Mapping[str, object], tool: str) -> str:
    return _http_url(section, tool, "base_url").rstrip("/")


def _approval(
    section: Mapping[str, object], tool: str, operations: tuple[str, ...]
) -> tuple[ApprovalMode, Mapping[str, ApprovalMode]]:
    value = section.get("approval", "never")
    modes = ("never", "always")
    if isinstance(value, str):
        if value not in modes:
            raise ToolDefinitionError(
                f"unknown approval {value!r}; use never or always", tool, "approval"
            )
        return value, MappingProxyType({})  # type: ignore[return-value]
    if not isinstance(value, Mapping):
        raise ToolDefinitionError(
            "must be 'never', 'always' or a table of tool = mode", tool, "approval"
        )
    per: dict[str, ApprovalMode] = {}
    for op, mode in value.items():
        if op not in operations:
            raise ToolDefinitionError(
                f"{op!r} is not in allow; name an allowed tool", tool, "approval", op
            )
        if mode not in modes:
            raise ToolDefinitionError(
                f"unknown approval {mode!r}; use never or always", tool, "approval", op
            )
        per[op] = mode
    return "never", MappingProxyType(per)


def _limits(section: Mapping[str, object], tool: str) -> ToolLimits:
    given = {k: section[k] for k in LIMIT_KEYS if k in section}
    for key, value in given.items():
        try:
            ToolLimits(**{key: value})  # type: ignore[arg-type]
        except ValueError as exc:
            raise ToolDefinitionError(f"{exc}, got {value!r}", tool, key) from None
    return ToolLimits(**given)  # type: ignore[arg-type]
