"""A replay report, or a comparison of two records, as lines for a terminal.

Both read the JSON forms (:meth:`ReplayReport.to_dict`, :meth:`Comparison.to_dict`), so a report
from the service prints exactly as one made here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def comparison_lines(comparison: Mapping[str, Any]) -> list[str]:
    """One line per compared field (``same`` or ``DIFFERS``), diffs indented under it, then the
    context the two runs ran in."""
    lines: list[str] = []
    for check in comparison.get("checks", []):
        if check["matched"]:
            lines.append(f"  same     {check['field']:<10} {check['original']}")
        else:
            lines.append(
                f"  DIFFERS  {check['field']:<10} original {check['original']}, "
                f"replay {check['replay']}"
            )
            lines += [f"             {d}" for d in check.get("diff", [])]
    for check in comparison.get("context", []):
        state = "same" if check["matched"] else "differs"
        shown = (
            check["original"] if check["matched"] else f"{check['original']} -> {check['replay']}"
        )
        lines.append(f"  ({state}) {check['field']}: {shown}")
    return lines


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """The replay report: what ran, what was not reproduced exactly, the comparison, a verdict."""
    profile = report.get("profile") or {}
    lines = [
        f"replay of {report['original_run_id']} on {report['backend']}, profile "
        f"{profile.get('name')}: run {report['replay_run_id']}"
    ]
    lines += [f"  note: {n}" for n in report.get("notes", [])]
    if report.get("pending") is not None:
        lines.append(f"  not run: {report['pending']}")
        return lines
    comparison = report.get("comparison") or {}
    lines += comparison_lines(comparison)
    if comparison.get("matched"):
        exact = report.get("exact")
        lines.append("result: identical" + ("" if exact else " (setup not exact, see notes)"))
    else:
        lines.append(f"result: differs ({', '.join(comparison.get('differing', []))})")
    return lines
