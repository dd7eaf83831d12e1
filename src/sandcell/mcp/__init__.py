"""sandcell as an MCP server: tools to run code (one-shot and in sessions), list profiles and
fetch artifacts, each a thin layer over one :class:`~sandcell.executor.Executor`.

``sandcell mcp`` serves it over stdio (:func:`serve_stdio`); :func:`streamable_http_app` is the
same server as a streamable-HTTP ASGI app for the HTTP service's ``/mcp``. Needs the official
MCP SDK (``pip install 'sandcell[tools]'``). See docs/mcp.md.
"""

from __future__ import annotations

from sandcell.mcp.server import build_server, serve_stdio, streamable_http_app
from sandcell.mcp.tools import McpSettings, SandcellTools

__all__ = ["McpSettings", "SandcellTools", "build_server", "serve_stdio", "streamable_http_app"]
