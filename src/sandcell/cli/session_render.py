"""How ``sandcell session`` shows what lasts of a session: sizes, expiries, a saved state in one
line, and a table of resource samples (``session show``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

_KEPT = {
    "memory": "memory (variables, processes and files)",
    "files": "files only (the interpreter starts empty on resume)",
}


def size(n: object) -> str:
    """``n`` bytes for a person: ``517 B``, ``3.4 KiB``, ``12.0 MiB``, ``1.2 GiB``."""
    value = float(n) if isinstance(n, int | float) and not isinstance(n, bool) else 0.0
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def expiry(expires_at: object) -> str:
    """An ISO expiry as ``2026-12-06 11:30Z``, or ``never`` for a state kept until deleted."""
    if not isinstance(expires_at, str):
        return "never"
    try:
        when = dt.datetime.fromisoformat(expires_at).astimezone(dt.UTC)
    except ValueError:
        return expires_at
    return when.strftime("%Y-%m-%d %H:%MZ")


def state_line(what: str, state: Mapping[str, object]) -> str:
    """One line for a saved state: ``paused session ID: kept memory (...), 12.0 MiB, expires
    2026-12-06 11:30Z``."""
    mode = str(state.get("mode"))
    kept = _KEPT.get(mode, mode)
    expires = state.get("expires_at")
    until = f"expires {expiry(expires)}" if isinstance(expires, str) else "kept until deleted"
    return f"{what}: kept {kept}, {size(state.get('stored_bytes'))}, {until}"


def metrics_table(samples: Sequence[Mapping[str, object]]) -> list[str]:
    """The samples as lines of a table (time, CPU %, memory and disk used of their limit)."""
    lines = [f"{'TIME':<10}{'CPU':>8}  {'MEMORY':<24}DISK"]
    for m in samples:
        stamp = str(m.get("timestamp", ""))
        try:
            clock = dt.datetime.fromisoformat(stamp).astimezone(dt.UTC).strftime("%H:%M:%S")
        except ValueError:
            clock = stamp[:8]
        cpu = m.get("cpu_used_pct")
        cpu_text = f"{cpu:.1f}%" if isinstance(cpu, int | float) else "?"
        memory = f"{size(m.get('mem_used_bytes'))} / {size(m.get('mem_total_bytes'))}"
        disk = f"{size(m.get('disk_used_bytes'))} / {size(m.get('disk_total_bytes'))}"
        lines.append(f"{clock:<10}{cpu_text:>8}  {memory:<24}{disk:<24}".rstrip())
    return lines


__all__ = ["expiry", "metrics_table", "size", "state_line"]
