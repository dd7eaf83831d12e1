"""A small MCP server for the tool gateway's tests, built with the official ``mcp`` SDK.

``python tests/mcp_ticket_server.py stdio`` serves over stdin/stdout;
``python tests/mcp_ticket_server.py http PORT`` serves streamable HTTP on 127.0.0.1:PORT.
The ``echo_secret`` tool returns the credential it was given (``TICKETS_TOKEN`` in its
environment, or the bearer token of the HTTP request), so tests can prove the gateway redacts it.
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("tickets")
_TICKETS = [
    {"id": 1, "title": "refund for order 17", "status": "open"},
    {"id": 2, "title": "login broken", "status": "closed"},
    {"id": 3, "title": "refund twice", "status": "open"},
]


@server.tool(description="Search tickets whose title contains the query.")
def search_tickets(query: str, limit: int = 10) -> list[dict[str, object]]:
    return [t for t in _TICKETS if query in str(t["title"])][:limit]


@server.tool(description="Open a ticket.")
def create_ticket(title: str) -> dict[str, object]:
    return {"id": 99, "title": title, "status": "open"}


@server.tool(description="Return the server's credential (a test of redaction).")
def echo_secret() -> str:
    return f"token is {os.environ.get('TICKETS_TOKEN', 'unset')}"


@server.tool(description="Return a large text.")
def big(size: int) -> str:
    return "x" * size


@server.tool(description="Not allowed by any test profile.")
def delete_everything() -> str:
    return "deleted"


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
