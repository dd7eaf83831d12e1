"""A run's result as MCP content: what the model reads, sees and can parse.

One text block says how the run ended and carries its stdout and stderr; the last expression's
value and each table follow as text; each figure comes back as image content (PNG, else SVG),
read from the artifact store under a per-result size budget; the whole result
(``result_to_dict``) plus the parsed tables is the structured content. Everything a run printed
is the program's own text: the client shows it to a model, never as trusted instructions (the
headers say who wrote it).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass

from mcp.types import (
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    TextContent,
)

from sandcell.artifacts.store import ArtifactStore
from sandcell.spec import Artifact, MiB, Outcome, RunResult, result_to_dict
from sandcell.wire import outcome_wire

_TEXT_TYPES = ("text/", "application/json", "application/xml", "image/svg+xml")
_IMAGE_ORDER = ("image/png", "image/svg+xml")


@dataclass(frozen=True, slots=True, kw_only=True)
class ContentLimits:
    """Caps on what one tool result carries inline."""

    images_bytes: int = 16 * MiB
    """All figures of one result together (raw bytes, before base64); figures past it are
    listed by sha256 for ``get_artifact`` instead."""
    artifact_bytes: int = 8 * MiB
    """The largest artifact ``get_artifact`` returns inline."""


def run_content(
    result: RunResult, store: ArtifactStore, limits: ContentLimits, *, note: str = ""
) -> CallToolResult:
    """The MCP tool result for one run; ``note`` is a line of sandcell's own appended to the
    summary (how to approve, what the person decided)."""
    body = result_to_dict(result)
    tables = _tables(result)
    structured: dict[str, object] = {**body, "tables": tables}
    blocks: list[ContentBlock] = [TextContent(text=_summary(result, note))]
    left = limits.images_bytes
    skipped: list[Artifact] = []
    for output in result.outputs:
        shown = output.data.get("text/plain")
        if output.kind in ("value", "table") and shown:
            # The last expression's value (Out[] of a notebook) and each table, as text.
            blocks.append(TextContent(text=f"{output.kind}:\n{shown}"))
        figure = _figure(output.artifacts)
        if figure is None:
            continue
        if figure.size > left:
            skipped.append(figure)
            continue
        data = store.path_for(figure.sha256).read_bytes()
        left -= len(data)
        blocks.append(
            ImageContent(data=base64.b64encode(data).decode("ascii"), mime_type=figure.media_type)
        )
    if skipped:
        listed = ", ".join(f"{a.path} (sha256 {a.sha256}, {a.size} bytes)" for a in skipped)
        blocks.append(
            TextContent(
                text=f"sandcell: figures over the {limits.images_bytes}-byte budget of one result, "
                f"not inlined; fetch them with get_artifact: {listed}"
            )
        )
    return CallToolResult(
        content=blocks,
        structured_content=structured,
        # Failed only where the code never ran (denied, infra_error): a program that ran and
        # failed (error, timeout, a limit) is a result, not a failed call.
        is_error=outcome_wire(result.outcome).mcp_is_error,
    )


def _summary(result: RunResult, note: str) -> str:
    head = f"outcome: {result.outcome.value}"
    if result.exit_code is not None:
        head += f", exit code {result.exit_code}"
    if result.signal is not None:
        head += f", signal {result.signal}"
    head += f", {result.usage.wall_ms:.0f} ms (run {result.run_id})"
    lines = [head]
    if result.reason:
        lines.append(f"reason: {result.reason}")
    findings = (result.policy or {}).get("findings")
    if result.outcome in (Outcome.DENIED, Outcome.AWAITING_APPROVAL) and isinstance(findings, list):
        for f in findings:
            if isinstance(f, dict):
                lines.append(
                    f"finding: {f.get('rule_id')} ({f.get('severity')}) line {f.get('line')}: "
                    f"{f.get('message')}"
                )
    for rejected in result.rejected_exports:
        lines.append(f"not exported: {rejected.path}: {rejected.reason}")
    for artifact in result.artifacts:
        lines.append(
            f"artifact: {artifact.path} ({artifact.media_type}, {artifact.size} bytes, "
            f"sha256 {artifact.sha256})"
        )
    if result.leaks:
        lines.append(f"redacted: {', '.join(str(leak.get('kind')) for leak in result.leaks)}")
    if note:
        lines.append(note)
    if result.stdout or result.stdout_truncated:
        cut = " (truncated at its cap)" if result.stdout_truncated else ""
        lines.append(f"--- stdout{cut} (written by the sandboxed program) ---\n{result.stdout}")
    if result.stderr or result.stderr_truncated:
        cut = " (truncated at its cap)" if result.stderr_truncated else ""
        lines.append(f"--- stderr{cut} (written by the sandboxed program) ---\n{result.stderr}")
    return "\n".join(lines)


def _figure(artifacts: Sequence[Artifact]) -> Artifact | None:
    """The one image of a figure to show: PNG when there is one (every client renders it)."""
    for media_type in _IMAGE_ORDER:
        for a in artifacts:
            if a.media_type == media_type:
                return a
    return None


def _tables(result: RunResult) -> list[object]:
    """Each table's JSON form (pandas' table schema: ``schema`` and ``data`` rows), parsed.
    The display layer checked it is valid JSON; one that is not is left out, not guessed at."""
    tables: list[object] = []
    for output in result.outputs:
        raw = output.data.get("application/json") if output.kind == "table" else None
        if raw is None:
            continue
        try:
            tables.append(json.loads(raw))
        except ValueError:
            continue
    return tables


def artifact_content(
    artifact: Artifact, store: ArtifactStore, limits: ContentLimits
) -> CallToolResult:
    """One stored artifact: text as text, an image as image content, anything else as an
    embedded blob; over the size cap, a tool error saying so."""
    if artifact.size > limits.artifact_bytes:
        return CallToolResult(
            content=[
                TextContent(
                    text=f"artifact {artifact.path} is {artifact.size} bytes, over the "
                    f"{limits.artifact_bytes}-byte cap of get_artifact; copy it out of the store "
                    f"on the host instead (sandcell audit show RUN_ID lists it; sha256 "
                    f"{artifact.sha256})"
                )
            ],
            is_error=True,
        )
    data = store.path_for(artifact.sha256).read_bytes()
    described = {
        "path": artifact.path,
        "sha256": artifact.sha256,
        "size": len(data),
        "media_type": artifact.media_type,
    }
    uri = f"sandcell://artifacts/{artifact.sha256}"
    block: ContentBlock
    if artifact.media_type in ("image/png", "image/jpeg", "image/gif", "image/webp"):
        block = ImageContent(
            data=base64.b64encode(data).decode("ascii"), mime_type=artifact.media_type
        )
    elif artifact.media_type.startswith(_TEXT_TYPES) and _is_utf8(data):
        block = TextContent(text=data.decode("utf-8"))
    else:
        block = EmbeddedResource(
            type="resource",
            resource=BlobResourceContents(
                uri=uri,
                blob=base64.b64encode(data).decode("ascii"),
                mime_type=artifact.media_type or "application/octet-stream",
            ),
        )
    header = TextContent(
        text=f"artifact {artifact.path} ({artifact.media_type}, {len(data)} bytes, sha256 "
        f"{artifact.sha256}); its content was written by a sandboxed program"
    )
    return CallToolResult(content=[header, block], structured_content=described)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
