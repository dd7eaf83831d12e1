"""Request and response bodies of a session's background processes, terminals and watches
(``service/api_processes.py``): pydantic at the edge, nothing else here.

Output and input are bytes: in JSON they travel as base64 (``stdout_b64``, ``data_b64``); input
may also be given as ``text`` (UTF-8).
"""

from __future__ import annotations

import base64
import binascii
import re
import signal as signals

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandcell.sessions.processes import ProcessInfo, ProcessOutput, WatchEvent

__all__ = [
    "ProcessBody",
    "ProcessOutputBody",
    "ResizeBody",
    "SignalBody",
    "SpawnBody",
    "StdinBody",
    "TerminalSize",
    "WatchBody",
    "WatchCreatedBody",
    "WatchEventBody",
    "signal_number",
]

_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TerminalSize(_Request):
    rows: int = Field(ge=1, le=65535)
    cols: int = Field(ge=1, le=65535)


class SpawnBody(_Request):
    """A command to start in the background in the session's sandbox."""

    cmd: str | list[str] = Field(
        description="a Bash command line (run as bash -l -c CMD, as a Bash cell) or an argv; "
        "admitted by the session's profile as a Bash cell is",
        min_length=1,
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="variables added to the kernel's environment"
    )
    cwd: str | None = Field(
        default=None, description="a directory in the sandbox (default: the workspace)"
    )
    stdin: bool = Field(default=False, description="keep its input open for .../stdin")
    pty: TerminalSize | None = Field(
        default=None, description="run it on a terminal of this size (its controlling tty)"
    )
    tag: str | None = Field(default=None, max_length=200, description="kept for listings")

    @field_validator("env")
    @classmethod
    def _names(cls, env: dict[str, str]) -> dict[str, str]:
        bad = [k for k in env if not re.fullmatch(_ENV_NAME, k)]
        if bad:
            raise ValueError(f"not variable names (letters, digits, _): {', '.join(bad[:5])}")
        return env


class ProcessBody(BaseModel):
    """A process started in the session (running or exited)."""

    pid: int = Field(description="its pid inside the sandbox")
    argv: list[str]
    command: str | None = Field(description="the Bash command line, when given as one")
    env: dict[str, str]
    cwd: str | None
    tag: str | None
    pty: TerminalSize | None = Field(description="its terminal's size; null without one")
    stdin: bool = Field(description="whether it takes input")
    started_at: float = Field(description="Unix time it started (the sandbox's clock)")
    exited: bool
    exit_code: int | None
    signal: int | None = Field(description="the signal that ended it, when one did")
    run_id: str | None = Field(
        default=None,
        description="its spawn's run record; once it ended, another run of its command names "
        "this id and holds its exit status and the last bytes of its output",
    )

    @classmethod
    def of(cls, info: ProcessInfo) -> ProcessBody:
        return cls(
            pid=info.pid,
            argv=list(info.argv),
            command=info.command,
            env=dict(info.env),
            cwd=info.cwd,
            tag=info.tag,
            pty=None if info.pty is None else TerminalSize(rows=info.pty[0], cols=info.pty[1]),
            stdin=info.stdin,
            started_at=info.started_at,
            exited=info.exited,
            exit_code=info.exit_code,
            signal=info.signal,
            run_id=info.run_id,
        )


class ProcessOutputBody(BaseModel):
    """One read of a process's output. Offsets count bytes from the start of each stream: pass
    ``stdout_next``/``stderr_next`` as the next read's ``stdout_from``/``stderr_from``."""

    pid: int
    stdout_b64: str = Field(description="the bytes read from stdout (a terminal's output)")
    stderr_b64: str
    stdout_offset: int
    stderr_offset: int
    stdout_next: int
    stderr_next: int
    stdout_skipped: int = Field(
        description="bytes between the offset asked for and the oldest kept: lost to this reader"
    )
    stderr_skipped: int
    more: bool = Field(description="more output is buffered past this read")
    exited: bool
    exit_code: int | None
    signal: int | None

    @classmethod
    def of(cls, out: ProcessOutput) -> ProcessOutputBody:
        return cls(
            pid=out.pid,
            stdout_b64=base64.b64encode(out.stdout).decode("ascii"),
            stderr_b64=base64.b64encode(out.stderr).decode("ascii"),
            stdout_offset=out.stdout_offset,
            stderr_offset=out.stderr_offset,
            stdout_next=out.stdout_next,
            stderr_next=out.stderr_next,
            stdout_skipped=out.stdout_skipped,
            stderr_skipped=out.stderr_skipped,
            more=out.more,
            exited=out.exited,
            exit_code=out.exit_code,
            signal=out.signal,
        )


class StdinBody(_Request):
    """Input for the process (its terminal's, for a PTY): ``text`` or ``data_b64``, one."""

    text: str | None = None
    data_b64: str | None = None

    @model_validator(mode="after")
    def _one(self) -> StdinBody:
        if (self.text is None) == (self.data_b64 is None):
            raise ValueError("give text or data_b64 (one of them)")
        if self.data_b64 is not None:
            try:
                base64.b64decode(self.data_b64, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("data_b64 is not base64") from None
        return self

    def data(self) -> bytes:
        if self.text is not None:
            return self.text.encode("utf-8")
        return base64.b64decode(self.data_b64 or "")


def signal_number(value: int | str) -> int:
    """A signal's number from its number or its name (``TERM``, ``SIGTERM``, ``term``)."""
    if isinstance(value, int):
        try:
            return int(signals.Signals(value))
        except ValueError:
            raise ValueError(f"{value} is not a signal of this host") from None
    name = value.strip().upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    found = getattr(signals.Signals, name, None)
    if found is None:
        raise ValueError(f"{value!r} is not a signal's name (TERM, KILL, INT, HUP...)")
    return int(found)


class SignalBody(_Request):
    signal: int | str = Field(
        default="TERM", description="a number, or a name (TERM, KILL, INT, HUP...)"
    )

    @field_validator("signal")
    @classmethod
    def _known(cls, value: int | str) -> int:
        return signal_number(value)


class ResizeBody(TerminalSize):
    """The terminal's new size (the process gets SIGWINCH)."""


class WatchBody(_Request):
    path: str = Field(
        min_length=1, description="a directory in the sandbox (relative: to the workspace)"
    )
    recursive: bool = Field(default=False, description="its subdirectories too")


class WatchCreatedBody(BaseModel):
    id: int = Field(description="the watch's id, for .../watches/{id}/events")
    path: str
    recursive: bool


class WatchEventBody(BaseModel):
    type: str = Field(description="create, write, remove, rename (the old name) or chmod")
    name: str = Field(description="the path relative to the watched directory")
    is_dir: bool
    at: float = Field(description="Unix time it was seen (the sandbox's clock)")

    @classmethod
    def of(cls, event: WatchEvent) -> WatchEventBody:
        return cls(type=event.type, name=event.name, is_dir=event.is_dir, at=event.at)
