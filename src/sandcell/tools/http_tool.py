"""An HTTP API as a governed tool: ``METHOD /path`` under ``base_url``, credential as a header.

One operation, ``request``, with ``method``, ``path``, optional ``query`` (string values) and
``json`` (a body). The gateway has already checked method and path against the profile's rules
(:mod:`sandcell.tools.http_rules`); this module builds the request from the checked parts only,
never follows redirects (a redirect could lead the credential elsewhere: the program gets the
3xx status instead), and stops reading past the result limit.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Mapping
from types import MappingProxyType
from urllib.parse import urlencode, urlsplit

from sandcell.tools.definitions import HttpTool
from sandcell.tools.http_rules import METHODS, split_path
from sandcell.tools.upstream import Operation, UpstreamError

REQUEST_SCHEMA: Mapping[str, object] = MappingProxyType(
    {
        "type": "object",
        "properties": {
            "method": {"enum": list(METHODS)},
            "path": {"type": "string", "maxLength": 2048},
            "query": {
                "type": "object",
                "additionalProperties": {"type": "string", "maxLength": 4096},
                "maxProperties": 64,
            },
            "json": {},
        },
        "required": ["method", "path"],
        "additionalProperties": False,
    }
)


def allow_problem(tool: HttpTool, args: Mapping[str, object]) -> str | None:
    """Why the profile does not allow this request (schema already checked); None if it does."""
    method, path = str(args["method"]), str(args["path"])
    try:
        segments = split_path(path)
    except ValueError as exc:
        return str(exc)
    if any(rule.matches(method, segments) for rule in tool.allow):
        return None
    return (
        f"{method} {path} is not allowed by tool {tool.name} (allowed: "
        + (", ".join(r.show() for r in tool.allow) or "nothing")
        + ")"
    )


class HttpUpstream:
    """Calls one HTTP API with the credential the gateway read at start."""

    def __init__(self, tool: HttpTool, credential: str | None) -> None:
        self.tool = tool
        self._credential = credential
        parts = urlsplit(tool.base_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")

    def operations(self) -> tuple[Operation, ...]:
        rules = ", ".join(r.show() for r in self.tool.allow) or "nothing"
        text = f"{self.tool.description} HTTP request under {self.tool.base_url}; allowed: {rules}"
        return (Operation(name="request", description=text.strip(), input_schema=REQUEST_SCHEMA),)

    def call(self, operation: str, args: Mapping[str, object]) -> object:
        if operation != "request":
            raise UpstreamError(f"tool {self.tool.name} has only the operation 'request'")
        method = str(args["method"])
        target = self._prefix + str(args["path"])
        query = args.get("query")
        if isinstance(query, Mapping) and query:
            target += "?" + urlencode(sorted((str(k), str(v)) for k, v in query.items()))
        headers = {"Accept": "application/json", "User-Agent": "sandcell-tool-gateway"}
        body: bytes | None = None
        if "json" in args:
            body = json.dumps(args["json"]).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self._credential is not None:
            scheme = f"{self.tool.scheme} " if self.tool.scheme else ""
            headers[self.tool.header] = scheme + self._credential
        limit = self.tool.limits.max_result_bytes
        conn = self._connection()
        try:
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read(limit + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise UpstreamError(f"{self.tool.base_url} failed: {type(exc).__name__}") from None
        finally:
            conn.close()
        if len(data) > limit:
            raise UpstreamError(f"the result is larger than the tool's limit of {limit} bytes")
        content_type = response.getheader("Content-Type", "") or ""
        text = data.decode("utf-8", "replace")
        result: object = text
        if content_type.split(";")[0].strip().lower() == "application/json":
            try:
                result = json.loads(text)
            except (ValueError, RecursionError):
                result = text
        return {"status": response.status, "content_type": content_type, "body": result}

    def _connection(self) -> http.client.HTTPConnection:
        timeout = self.tool.limits.timeout_s
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def close(self) -> None:
        """Nothing is held between calls."""
