"""What the gateway needs of an upstream (an HTTP API, an MCP server)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from sandcell.errors import SandcellError


class UpstreamError(SandcellError):
    """The upstream could not be reached, failed, or answered too much; shown to the program
    (after redaction), so the message must not carry the credential."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Operation:
    """One callable operation, as ``list`` shows it."""

    name: str
    """Without the tool's prefix (``search_tickets``)."""
    description: str
    input_schema: Mapping[str, object]


class Upstream(Protocol):
    def operations(self) -> tuple[Operation, ...]:
        """The operations the profile allows (the upstream may offer more)."""
        ...

    def call(self, operation: str, args: Mapping[str, object]) -> object:
        """Call one allowed operation with checked arguments; a JSON-ready result.

        Raises:
            UpstreamError: on any failure of the upstream.
        """
        ...

    def close(self) -> None:
        """Release what the upstream holds."""
        ...
