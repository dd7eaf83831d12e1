"""The results file: one JSON line per finished task, durable line by line, read back to resume.

Each line is written with one ``write`` and then flushed and fsynced, so a killed batch loses at
most the tasks that were running. A last line without its newline is what a kill mid-write
leaves: it is ignored (and cut off) and that task runs again. A damaged line anywhere else is an
error, as is a result recorded for a different version of a task (its ``task_sha256`` differs).
An exclusive lock on the file keeps two batches from writing it at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from sandcell.errors import ConfigError, InfraError


@dataclass(frozen=True, slots=True, kw_only=True)
class Recorded:
    """What resuming needs of a result line already in the file (not its output)."""

    task_sha256: str | None
    outcome: str
    passed: bool

    @classmethod
    def of(cls, line: Mapping[str, object]) -> Recorded:
        sha = line.get("task_sha256")
        return cls(
            task_sha256=sha if isinstance(sha, str) else None,
            outcome=str(line.get("outcome")),
            passed=line.get("passed") is True,
        )


class ResultsFile:
    """An open results file: the lines already there, and :meth:`append` for new ones."""

    def __init__(self, path: Path, *, restart: bool = False) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot open results file {str(path)!r}: {exc.strerror}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise ConfigError(
                f"results file {str(path)!r} is being written by another sandcell batch; wait "
                "for it, or pass another --results file"
            ) from None
        self.truncated_line: int | None = None
        """The number of the incomplete last line that was cut off, if there was one."""
        try:
            if restart:
                os.ftruncate(self._fd, 0)
                os.fsync(self._fd)
            self.recorded: dict[str, Recorded] = self._read()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)  # closing releases the lock
                self._fd = -1

    def _read(self) -> dict[str, Recorded]:
        data = b""
        while chunk := os.pread(self._fd, 1 << 20, len(data)):
            data += chunk
        recorded: dict[str, Recorded] = {}
        lines = data.split(b"\n")
        complete, tail = lines[:-1], lines[-1]
        for number, raw in enumerate(complete, start=1):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ConfigError(
                    f"results file {str(self.path)!r} line {number} is not valid JSON; fix or "
                    "remove it, or start over with --restart"
                ) from None
            if not isinstance(line, dict) or not isinstance(line.get("id"), str):
                raise ConfigError(
                    f"results file {str(self.path)!r} line {number} has no task id; it is not a "
                    "sandcell batch results file (pass another --results file, or --restart)"
                )
            rec = Recorded.of(line)
            if rec.outcome in ("infra_error", "refused"):
                # sandcell failed before the code ran, or no run could take the task's request
                # (an input since fixed, say): resuming runs it again (the new line, written
                # later, is the one that counts).
                recorded.pop(line["id"], None)
            else:
                recorded[line["id"]] = rec
        if tail:
            # A kill mid-write: cut the fragment off so the next line starts on a line of its own.
            self.truncated_line = len(complete) + 1
            os.ftruncate(self._fd, len(data) - len(tail))
            os.fsync(self._fd)
        return recorded

    def append(self, line: Mapping[str, object]) -> None:
        """Write one result line durably (one write, flushed to disk before returning)."""
        payload = (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._fd < 0:
                raise ConfigError(f"results file {str(self.path)!r} is closed")
            end = os.fstat(self._fd).st_size  # only this object writes the file (the lock)
            written = 0
            try:
                while written < len(payload):
                    written += os.write(self._fd, payload[written:])
                os.fsync(self._fd)
            except OSError as exc:
                # A full disk can take part of a line: cut it off, or the next line written
                # (once space is back) would be glued to it and the file could not be resumed.
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, end)
                raise InfraError(
                    f"cannot write a result line to {str(self.path)!r}: {exc.strerror or exc}; "
                    "its task has no result and runs again when the batch is resumed"
                ) from exc


__all__ = ["Recorded", "ResultsFile"]
