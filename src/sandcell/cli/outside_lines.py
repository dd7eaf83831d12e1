"""What a run did outside its sandbox, readably: connection attempts and governed tool calls.

A run record's ``network`` (the egress proxy's ``connections``) and ``tools`` (the gateway's
``calls``) are shown by ``sandcell audit show`` one row each, and summed up in one line by
``sandcell run``. Host names, reasons and tool names come from the sandbox or from upstreams, so
every row is made safe for a terminal and kept on one line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from sandcell.validation import neutralise

__all__ = ["connection_rows", "outside_summary", "tool_call_rows"]

_HASH_CHARS = 16


def _one_line(value: object) -> str:
    text = str(value).replace("\r", "\\r").replace("\n", "\\n")
    return neutralise(text)


def _size(n: object) -> str:
    """``n`` bytes for a person: ``517 B``, ``3.4 KiB``, ``12.0 MiB``."""
    value = float(n) if isinstance(n, int | float) and not isinstance(n, bool) else 0.0
    for unit in ("B", "KiB", "MiB"):
        if value < 1024 or unit == "MiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _rows(section: object, key: str) -> list[Mapping[str, object]]:
    if not isinstance(section, Mapping):
        return []
    rows = section.get(key)
    if not isinstance(rows, Sequence) or isinstance(rows, str):
        return []
    return [r for r in rows if isinstance(r, Mapping)]


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _endpoint(row: Mapping[str, object]) -> str:
    host, port = str(row.get("host", "?")), row.get("port", "?")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _seconds(start: object, end: object) -> str:
    if isinstance(start, int | float) and isinstance(end, int | float) and end >= start:
        return f"{end - start:.2f} s"
    return "? s"


def _hash(value: object) -> str:
    return str(value)[:_HASH_CHARS] if isinstance(value, str) and value else "-"


def _refused_dropped(network: object) -> int:
    """Refused attempts the record counts but does not list (``unrecorded`` in records written
    before allowed attempts were always kept)."""
    if not isinstance(network, Mapping):
        return 0
    for key in ("refused_dropped", "unrecorded"):
        value = network.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def connection_rows(network: object) -> list[str]:
    """A heading and one row per connection attempt of a record's ``network`` (none: [])."""
    if not isinstance(network, Mapping):
        return []
    rows = _rows(network, "connections")
    dropped = _refused_dropped(network)
    refused = sum(1 for r in rows if not r.get("allowed")) + dropped
    up = network.get("bytes_up_total", network.get("bytes_up", 0))
    down = network.get("bytes_down_total", network.get("bytes_down", 0))
    lines = [
        f"connections (profile {_one_line(network.get('profile', '?'))}): "
        f"{_count(len(rows) + dropped, 'attempt')}, {refused} refused, "
        f"{_size(up)} up, {_size(down)} down"
    ]
    for r in rows:
        allowed = bool(r.get("allowed"))
        parts = [
            f"{r.get('seq')!s:>3} {r.get('method')!s:<7} {_endpoint(r)} "
            + ("allowed" if allowed else "refused"),
        ]
        if r.get("address"):
            parts.append(f"address {r['address']}")
        if r.get("sni"):
            parts.append(f"sni {r['sni']}")
        if r.get("status") is not None:
            parts.append(f"status {r['status']}")
        parts.append(f"up {_size(r.get('bytes_up', 0))}, down {_size(r.get('bytes_down', 0))}")
        parts.append(_seconds(r.get("started_at"), r.get("ended_at")))
        parts.append(str(r.get("reason", "")))
        lines.append("  " + _one_line(" | ".join(parts)))
    if dropped:
        lines.append(
            f"  ... and {dropped} more refused {'attempt' if dropped == 1 else 'attempts'} "
            "past the cap on refused records, not listed"
        )
    return lines


def _approval(r: Mapping[str, object]) -> str | None:
    approver = r.get("approver")
    if not approver:
        return None
    verb = "denied" if r.get("decision") == "denied" else "approved"
    return f"{verb} by {approver}"


def tool_call_rows(tools: object) -> list[str]:
    """A heading and one row per request of a record's ``tools`` (none: [])."""
    if not isinstance(tools, Mapping):
        return []
    rows = _rows(tools, "calls")
    decisions = Counter(str(r.get("decision", "?")) for r in rows)
    counted = ", ".join(f"{n} {d}" for d, n in sorted(decisions.items()))
    lines = [
        f"tool calls (profile {_one_line(tools.get('profile', '?'))}): "
        f"{_count(len(rows), 'request')}" + (f" ({counted})" if counted else "")
    ]
    for r in rows:
        name = str(r.get("tool") or "")
        parts = [f"{r.get('seq')!s:>3} {r.get('operation')!s:<4} {name} {r.get('decision')}"]
        approval = _approval(r)
        if approval:
            parts.append(approval)
        parts.append(
            f"request {_size(r.get('request_bytes', 0))}, result {_size(r.get('result_bytes', 0))}"
        )
        if r.get("redactions"):
            parts.append(f"{r['redactions']} redacted")
        duration = r.get("duration_s")
        parts.append(f"{duration:.2f} s" if isinstance(duration, int | float) else "? s")
        parts.append(
            f"sha256 args {_hash(r.get('args_sha256'))} result {_hash(r.get('result_sha256'))}"
        )
        if r.get("reason") and r.get("reason") != "ok":
            parts.append(str(r["reason"]))
        lines.append("  " + _one_line(" | ".join(parts)))
    unrecorded = tools.get("unrecorded")
    if isinstance(unrecorded, int) and unrecorded > 0:
        lines.append(f"  ... and {unrecorded} more requests past the record cap")
    return lines


def outside_summary(network: object, tools: object) -> str | None:
    """One short line of what a run did outside (None when it tried nothing): for ``run``."""
    parts = []
    connections = _rows(network, "connections")
    dropped = _refused_dropped(network)
    if connections or dropped:
        refused = sum(1 for r in connections if not r.get("allowed")) + dropped
        unlisted = f", {dropped} not listed" if dropped else ""
        parts.append(
            f"{_count(len(connections) + dropped, 'connection')} ({refused} refused{unlisted})"
        )
    calls = [r for r in _rows(tools, "calls") if r.get("operation") != "list"]
    if calls:
        decisions = Counter(str(r.get("decision", "?")) for r in calls)
        counted = ", ".join(f"{n} {d}" for d, n in sorted(decisions.items()))
        parts.append(f"{_count(len(calls), 'tool call')} ({counted})")
    return "; ".join(parts) if parts else None
