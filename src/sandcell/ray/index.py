"""The driver's index from task to node and run id, read from a results file written on Ray."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sandcell.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRun:
    """Where a task's recorded run is: ``sandcell --home NODE_HOME audit show RUN_ID`` there."""

    node_id: str
    node_home: str
    run_id: str | None


def task_index(results: Path) -> dict[str, NodeRun]:
    """Task id → node and run of its result (the last complete line of a task counts)."""
    index: dict[str, NodeRun] = {}
    try:
        raw = results.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read results file {str(results)!r}: {exc.strerror}") from None
    for number, text in enumerate(raw.split(b"\n")[:-1], start=1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ConfigError(f"results file {str(results)!r} line {number} is not JSON") from None
        if isinstance(line, dict) and isinstance(line.get("node_id"), str):
            run_id = line.get("run_id")
            index[str(line["id"])] = NodeRun(
                node_id=line["node_id"],
                node_home=str(line.get("node_home")),
                run_id=run_id if isinstance(run_id, str) else None,
            )
    return index


__all__ = ["NodeRun", "task_index"]
