"""Inputs of a run or session started over MCP: given inline, or named on the host under a root.

A client may send an input's content (``text``, or ``base64`` for bytes): sandcell writes it into
a private directory that lives as long as the run or session and shows it read-only under
``/inputs/NAME`` like any input. Naming a host ``path`` is refused unless the server was started
with input roots (``sandcell mcp --input-root DIR``) and the path, resolved, lies under one: the
model choosing the path is not the person who owns the files, so the server fails closed.
"""

from __future__ import annotations

import base64
import binascii
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from pydantic import BaseModel, ConfigDict, Field

from sandcell.errors import ConfigError
from sandcell.spec import InputFile, MiB

MAX_INLINE_BYTES = 16 * MiB
"""All inline inputs of one run or session together (decoded bytes)."""


class InputItem(BaseModel):
    """One input file: exactly one of ``text``, ``base64`` or ``path``."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None,
        description="file name under /inputs (and in the working directory); required for "
        "text and base64, defaults to the last component of path",
    )
    text: str | None = Field(default=None, description="the file's content as UTF-8 text")
    base64: str | None = Field(default=None, description="the file's content, base64-encoded")
    path: str | None = Field(
        default=None,
        description="a host file or directory under one of the server's input roots "
        "(sandcell mcp --input-root DIR); refused when the server has none",
    )


class StagedInputs:
    """The :class:`InputFile` values of a request, and the private directory holding the
    inline ones until :meth:`close`."""

    def __init__(self, files: tuple[InputFile, ...], directory: Path | None) -> None:
        self.files = files
        self._directory = directory

    def close(self) -> None:
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def __enter__(self) -> StagedInputs:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def stage_inputs(
    items: Sequence[InputItem] | None, roots: Sequence[Path], *, max_inline_bytes: int
) -> StagedInputs:
    """Check every item, then write the inline ones; raises ConfigError naming the item."""
    if not items:
        return StagedInputs((), None)
    inline: list[tuple[str, bytes]] = []
    files: list[InputFile | str] = []
    total = 0
    seen: set[str] = set()
    for i, item in enumerate(items):
        given = [k for k in ("text", "base64", "path") if getattr(item, k) is not None]
        if len(given) != 1:
            raise ConfigError(
                f"inputs[{i}] must have exactly one of text, base64 or path, got "
                f"{', '.join(given) or 'none'}"
            )
        if item.path is not None:
            found = _rooted(item.path, item.name, roots, i)
            _unique(found.name, seen, i)
            files.append(found)
            continue
        name = _unique(_name(item.name, i), seen, i)
        data = _decode(item, i)
        total += len(data)
        if total > max_inline_bytes:
            raise ConfigError(
                f"inline inputs are over {max_inline_bytes} bytes together; send less, or start "
                "the server with --input-root DIR and name files under it by path"
            )
        inline.append((name, data))
        files.append(name)
    directory = Path(tempfile.mkdtemp(prefix="sandcell-mcp-inputs-")) if inline else None
    try:
        written = _write(directory, inline) if directory is not None else {}
        out = tuple(f if isinstance(f, InputFile) else written[f] for f in files)
    except BaseException:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    return StagedInputs(out, directory)


def _name(name: str | None, i: int) -> str:
    if not name:
        raise ConfigError(f"inputs[{i}] needs a name (the file name under /inputs)")
    if "/" in name or "\x00" in name or name in (".", "..") or len(name.encode()) > 255:
        raise ConfigError(
            f"inputs[{i}].name {name!r} is not a plain file name; use a name without '/' "
            "of at most 255 bytes"
        )
    return name


def _unique(name: str, seen: set[str], i: int) -> str:
    if name in seen:
        raise ConfigError(f"inputs[{i}]: two inputs are both named {name!r}; rename one")
    seen.add(name)
    return name


def _decode(item: InputItem, i: int) -> bytes:
    if item.text is not None:
        return item.text.encode("utf-8")
    try:
        return base64.b64decode(item.base64 or "", validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"inputs[{i}].base64 is not valid base64") from None


def _rooted(path: str, name: str | None, roots: Sequence[Path], i: int) -> InputFile:
    if not roots:
        raise ConfigError(
            f"inputs[{i}].path: this server takes no host paths; send the content as text or "
            "base64, or start it with sandcell mcp --input-root DIR"
        )
    resolved = Path(path).expanduser().resolve()
    if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
        shown = ", ".join(str(r) for r in roots)
        raise ConfigError(
            f"inputs[{i}].path {path!r} is not under an input root of this server ({shown}); "
            "name a file under one of them, or send its content inline"
        )
    if not resolved.exists():
        raise ConfigError(f"inputs[{i}].path {path!r} does not exist")
    return InputFile(host_path=resolved, name=_name(name or resolved.name, i))


def _write(directory: Path, inline: Sequence[tuple[str, bytes]]) -> dict[str, InputFile]:
    out: dict[str, InputFile] = {}
    for name, data in inline:
        target = directory / name
        # O_EXCL: a fresh private directory, names checked unique; never follow or overwrite.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        out[name] = InputFile(host_path=target, name=name)
    return out
