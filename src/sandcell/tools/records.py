"""What the tool gateway keeps of a run: one frozen record per request."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Literal

Decision = Literal["allowed", "refused", "denied", "failed"]
"""``allowed``: the upstream was called and answered. ``refused``: a check failed (allow list,
schema, limits, nobody to approve). ``denied``: an approver said no. ``failed``: the upstream
was called and failed (or its result was too large)."""


def canonical(value: object) -> str:
    """``value`` as canonical JSON (sorted keys, no spaces): the text :func:`digest` hashes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def text_digest(text: str) -> str:
    """SHA-256 of a JSON text (as :func:`digest` hashes the canonical text)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def digest(value: object) -> str:
    """SHA-256 of ``value`` as canonical JSON (sorted keys, no spaces)."""
    return text_digest(canonical(value))


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallRecord:
    """One request to the gateway, answered or refused."""

    seq: int
    """Order of arrival in the run, from 1."""
    operation: Literal["list", "call", "invalid"]
    tool: str
    """``tool`` or ``tool.operation`` as asked; empty for ``list`` and unreadable requests."""
    args_sha256: str | None
    """Of the arguments as canonical JSON; None when none could be read."""
    result_sha256: str | None
    """Of the result as returned to the program (after redaction); None when refused."""
    decision: Decision
    reason: str
    """Why it was refused, denied or failed; ``ok`` when allowed."""
    approver: str | None
    """Who approved or denied; None when no approval was needed or nobody could approve."""
    request_bytes: int
    result_bytes: int
    redactions: int
    """Secrets of the gateway replaced in the result."""
    started_at: float
    duration_s: float

    def to_record(self) -> dict[str, object]:
        """Plain JSON-ready data, for the run record."""
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayReport:
    """Everything the gateway saw in one run, returned when it stops."""

    profile: str
    records: tuple[ToolCallRecord, ...]
    unrecorded: int = 0
    """Requests past the record cap."""

    def to_record(self) -> dict[str, object]:
        """Plain JSON-ready data, for the run record."""
        return {
            "profile": self.profile,
            "calls": [r.to_record() for r in self.records],
            "unrecorded": self.unrecorded,
        }
