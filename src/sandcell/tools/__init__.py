"""Governed tools: operations with credentials or consequences outside, run by the host.

A profile's ``[tools.NAME]`` sections (:mod:`~sandcell.tools.definitions`) name what a run may
call. The host-side :class:`~sandcell.tools.gateway.ToolGateway` holds the credentials, checks
every call (allow list, argument schema, rate and size limits, approval), calls the upstream
(:mod:`~sandcell.tools.http_tool`, :mod:`~sandcell.tools.mcp_tool`), redacts its own secrets from
results and records each call (:mod:`~sandcell.tools.records`). The sandbox reaches it through
one Unix socket with the standalone client :mod:`sandcell.tools.sandcell_tools`.

Importing this package is cheap: the gateway and its upstreams are imported where used.
"""

from __future__ import annotations

from sandcell.tools.definitions import (
    HttpTool,
    McpTool,
    ToolDefinition,
    ToolDefinitionError,
    ToolLimits,
    parse_tools,
)

__all__ = [
    "HttpTool",
    "McpTool",
    "ToolDefinition",
    "ToolDefinitionError",
    "ToolLimits",
    "parse_tools",
]
