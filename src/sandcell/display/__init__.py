"""Rich outputs, host side: read back what a sandboxed cell displayed, trusting none of it.

Inside the sandbox, :mod:`sandcell.backends.inside._display` writes each output of a cell
(a value, a table, a figure) as ``NNNN.json`` (``{"kind", "data", "files"}``) plus its images
``NNNN.png`` / ``NNNN.svg`` into a directory of the workspace, :data:`DISPLAY_DIRNAME`. Those files
were written by untrusted code, which could as well have written them itself, so
:func:`collect_outputs` reads them like any other hostile export:

* the directory is opened without following a symlink, and at most ``max_entries`` names are
  looked at; only names of the form ``NNNN.json`` / ``NNNN.png`` / ``NNNN.svg`` are read;
* every file is opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked on the descriptor: a regular
  file with one link, within its size cap; it is read once, to memory, at most cap + 1 bytes
  (a session's sandbox may still be running and rewrite it: what was checked is what is stored);
* a manifest must be a JSON object of exactly the expected shape: a known kind, text forms from a
  fixed allowlist of media types (``text/plain``, ``text/html``, ``application/json``, the last
  itself valid JSON), files named after the manifest with image media types from a fixed
  allowlist (``image/png``, ``image/svg+xml``), and optionally ``"displayed": true`` (shown by
  ``display()``, not the cell's value);
* a figure may carry its chart's data (:data:`~sandcell.display.chart.CHART_TYPE`), accepted
  only in the exact shapes of :mod:`sandcell.display.chart` and stored as re-written there; a
  chart refused leaves the figure without it (and says why);
* a PNG must start with the PNG signature; an SVG must be UTF-8 XML without entity declarations
  whose root is an SVG element, with no ``script`` or ``foreignObject`` element, no ``on*`` event
  attribute and no ``javascript:`` link;
* the number of outputs and their total size are capped (:class:`DisplayLimits`).

Images go into the :class:`~sandcell.artifacts.ArtifactStore` as artifacts named
``display/NNNN.png``. Whatever is refused is reported, never raised: one
:class:`~sandcell.spec.RejectedExport` per item, with the reason, next to the run's rejected
exports.

Security limitations: ``text/html`` (a DataFrame's ``to_html``) and SVG are markup written by the
untrusted program. The checks above keep scripts out of SVG, but the HTML is only capped, not
sanitised: render it in a sandboxed frame (``<iframe sandbox>``, a strict Content-Security-Policy)
or as text, never inline in a trusted page.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, cast

from sandcell.artifacts.store import ArtifactStore
from sandcell.display.chart import CHART_TYPE, ChartRefused, checked_chart
from sandcell.errors import ConfigError, InfraError, SandcellError
from sandcell.spec import Artifact, DisplayOutput, MiB, RejectedExport

__all__ = [
    "DISPLAY_DIRNAME",
    "IMAGE_TYPES",
    "TEXT_TYPES",
    "DisplayCollection",
    "DisplayLimits",
    "collect_outputs",
    "read_outputs",
    "take_outputs",
]

DISPLAY_DIRNAME = ".sandcell-display"
"""The output directory, relative to the sandbox's working directory (one-shot runs)."""

TEXT_TYPES = ("text/plain", "text/html", "application/json")
"""Media types an output may carry as text in its manifest."""
IMAGE_TYPES: Mapping[str, str] = {"image/png": "png", "image/svg+xml": "svg"}
"""Media types an output may carry as a file, and the file's extension."""

_KINDS = ("value", "table", "figure")
_MANIFEST_RE = re.compile(r"([0-9]{4,6})\.json")
_NAME_RE = re.compile(r"[0-9]{4,6}\.(?:json|png|svg)")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_SVG_NS = "{http://www.w3.org/2000/svg}"
_XLINK_HREF = "{http://www.w3.org/1999/xlink}href"
_MAX_REPORTED = 32
"""Rejections reported one by one; past that, one line says how many more."""
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True, kw_only=True)
class DisplayLimits:
    """Caps on what is read back from one output directory."""

    max_outputs: int = 64
    """Outputs kept; later manifests are refused."""
    max_text_bytes: int = 1 * MiB
    """Largest text form (UTF-8 bytes)."""
    max_manifest_bytes: int = 8 * MiB
    """Largest manifest file (its text forms, JSON-escaped)."""
    max_image_bytes: int = 8 * MiB
    """Largest image file."""
    max_total_bytes: int = 64 * MiB
    """All outputs together: texts and images."""
    max_entries: int = 4096
    """Directory entries looked at."""

    def __post_init__(self) -> None:
        for f in fields(self):
            name, value = f.name, getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"display limit {name} must be a positive integer, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DisplayCollection:
    """What was read back: the outputs in order, and the items refused with the reason."""

    outputs: tuple[DisplayOutput, ...] = ()
    rejected: tuple[RejectedExport, ...] = ()


class _Refused(SandcellError):
    """One item is refused; the message is the reason."""


def collect_outputs(
    out_dir: Path, store: ArtifactStore, *, limits: DisplayLimits | None = None, first_seq: int = 0
) -> tuple[DisplayOutput, ...]:
    """The valid outputs in ``out_dir``, in order (see :func:`read_outputs`; refusals dropped)."""
    return read_outputs(out_dir, store, limits=limits, first_seq=first_seq).outputs


def refused_outputs(reason: str) -> DisplayCollection:
    """No outputs, and why the host would not read them (a directory it refused to open)."""
    return DisplayCollection(
        rejected=(RejectedExport(path=DISPLAY_DIRNAME, reason=f"display output: {reason}"),)
    )


def read_outputs(
    out_dir: Path, store: ArtifactStore, *, limits: DisplayLimits | None = None, first_seq: int = 0
) -> DisplayCollection:
    """Read, validate and store the outputs in ``out_dir`` numbered ``first_seq`` or later.

    ``out_dir`` itself is opened without following a link, the path above it as given: every
    part of it above must be the host's, or a descriptor already checked (``/proc/self/fd/N``).
    Where the sandbox could have put a link higher up, use :func:`read_outputs_below`.

    A missing directory has no outputs. Nothing written by the sandbox raises: each refused item
    is in ``rejected``. Raises InfraError only when the artifact store cannot be written.
    """
    return read_outputs_below(
        out_dir.parent, (out_dir.name,), store, limits=limits, first_seq=first_seq
    )


def read_outputs_below(
    root: Path,
    parts: Sequence[str],
    store: ArtifactStore,
    *,
    limits: DisplayLimits | None = None,
    first_seq: int = 0,
) -> DisplayCollection:
    """The outputs in the directory ``root/parts[0]/parts[1]/...`` (see :func:`read_outputs`).

    ``root`` is trusted: a host directory, or a live sandbox's root as the host reaches it
    (``/proc/PID/root``, a link that is meant to be followed). Every part below it is opened one
    at a time, relative to the one above, without following a link: through ``/proc/PID/root``
    an absolute link the sandbox planted would otherwise resolve against the host's root, and
    the host would read its own files as the cell's outputs.
    """
    lim = limits or DisplayLimits()
    reader = _Reader(store, lim)
    try:
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return DisplayCollection()
    except OSError as exc:
        reader.reject("", f"the output directory cannot be opened safely: {exc.strerror}")
        return reader.collection()
    try:
        for part in parts:
            if not part or part in (".", "..") or "/" in part:
                reader.reject("", f"the output directory's path has the part {part[:80]!r}")
                return reader.collection()
            try:
                below = os.open(part, _OPEN_DIR, dir_fd=dir_fd)
            except FileNotFoundError:
                return DisplayCollection()
            except OSError as exc:
                # ELOOP or ENOTDIR: the program put a symlink or a file where a directory goes.
                reader.reject("", f"the output directory cannot be opened safely: {exc.strerror}")
                return reader.collection()
            os.close(dir_fd)
            dir_fd = below
        reader.read_dir(dir_fd, first_seq)
    finally:
        os.close(dir_fd)
    return reader.collection()


def take_outputs(
    workspace: Path, store: ArtifactStore, *, limits: DisplayLimits | None = None
) -> DisplayCollection:
    """Read the outputs of a finished one-shot run from its workspace, then remove the output
    directory, so it is neither exported nor seen as a file of the program."""
    out_dir = workspace / DISPLAY_DIRNAME
    collected = read_outputs(out_dir, store, limits=limits)
    try:
        is_dir = stat.S_ISDIR(os.lstat(out_dir).st_mode)
    except OSError:
        is_dir = False
    if is_dir:
        # rmtree removes with directory descriptors and never follows a symlink inside.
        shutil.rmtree(out_dir, ignore_errors=True)
    return collected


class _Reader:
    def __init__(self, store: ArtifactStore, limits: DisplayLimits) -> None:
        self.store = store
        self.limits = limits
        self.outputs: list[DisplayOutput] = []
        self.rejected: list[RejectedExport] = []
        self.refusals = 0
        self.total = 0

    def reject(self, name: str, reason: str) -> None:
        self.refusals += 1
        if self.refusals <= _MAX_REPORTED:
            path = f"{DISPLAY_DIRNAME}/{name}" if name else DISPLAY_DIRNAME
            self.rejected.append(RejectedExport(path=path, reason=f"display output: {reason}"))

    def collection(self) -> DisplayCollection:
        rejected = list(self.rejected)
        if self.refusals > _MAX_REPORTED:
            more = self.refusals - _MAX_REPORTED
            rejected.append(
                RejectedExport(path=DISPLAY_DIRNAME, reason=f"display output: {more} more refused")
            )
        return DisplayCollection(outputs=tuple(self.outputs), rejected=tuple(rejected))

    def read_dir(self, dir_fd: int, first_seq: int) -> None:
        names: list[str] = []
        with os.scandir(dir_fd) as entries:
            for i, entry in enumerate(entries):
                if i >= self.limits.max_entries:
                    self.reject("", f"more than {self.limits.max_entries} entries; rest ignored")
                    break
                names.append(entry.name)
        manifests: list[tuple[int, str]] = []
        named: set[str] = set()
        for name in names:
            m = _MANIFEST_RE.fullmatch(name)
            if m is not None:
                manifests.append((int(m.group(1)), name))
            elif not _NAME_RE.fullmatch(name):
                self.reject(_shown(name), "not a name the display module writes")
        for seq, name in sorted(manifests):
            if seq < first_seq:
                continue
            if len(self.outputs) >= self.limits.max_outputs:
                self.reject(name, f"more than {self.limits.max_outputs} outputs")
                continue
            try:
                output, files = self._output(dir_fd, name)
            except _Refused as exc:
                self.reject(name, str(exc))
                continue
            named |= files
            self.outputs.append(output)
        for name in names:
            image = name.endswith((".png", ".svg")) and _NAME_RE.fullmatch(name) is not None
            if image and name not in named and int(name.partition(".")[0]) >= first_seq:
                self.reject(name, "no valid manifest names this file")

    def _output(self, dir_fd: int, name: str) -> tuple[DisplayOutput, set[str]]:
        raw = _read(dir_fd, name, self.limits.max_manifest_bytes)
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise _Refused(f"the manifest is not JSON ({type(exc).__name__})") from None
        kind, data, files, displayed = self._manifest(doc, stem=name.removesuffix(".json"))
        if CHART_TYPE in data:
            try:
                data[CHART_TYPE] = checked_chart(data[CHART_TYPE])
            except ChartRefused as exc:
                del data[CHART_TYPE]
                self.reject(name, f"the figure is kept without its chart: {exc}")
        size = sum(len(v.encode("utf-8")) for v in data.values())
        images: list[tuple[str, str, bytes]] = []
        for file_name, media_type in files:
            blob = _read(dir_fd, file_name, self.limits.max_image_bytes)
            _check_image(media_type, blob, file_name)
            images.append((file_name, media_type, blob))
            size += len(blob)
        if self.total + size > self.limits.max_total_bytes:
            raise _Refused(f"the outputs together are over {self.limits.max_total_bytes} bytes")
        self.total += size
        artifacts = tuple(self._store(f, t, b) for f, t, b in images)
        output = DisplayOutput(kind=kind, data=data, artifacts=artifacts, displayed=displayed)
        return output, {f for f, _, _ in images}

    def _manifest(
        self, doc: object, *, stem: str
    ) -> tuple[Literal["value", "table", "figure"], dict[str, str], list[tuple[str, str]], bool]:
        keys = {"kind", "data", "files"}
        if not isinstance(doc, dict) or set(doc) - {"displayed"} != keys:
            raise _Refused("the manifest is not an object with exactly kind, data and files")
        displayed = doc.get("displayed", False)
        if displayed is not True and "displayed" in doc:
            raise _Refused("displayed, when given, must be true")
        kind, data, files = doc["kind"], doc["data"], doc["files"]
        if kind not in _KINDS:
            raise _Refused(f"unknown kind {str(kind)[:40]!r}")
        types = (*TEXT_TYPES, CHART_TYPE) if kind == "figure" else TEXT_TYPES
        if not isinstance(data, dict) or not set(data) <= set(types):
            raise _Refused(f"data must map media types among {', '.join(types)} to text")
        for media_type, text in data.items():
            if not isinstance(text, str):
                raise _Refused(f"the {media_type} form is not text")
            try:
                encoded = text.encode("utf-8")
            except UnicodeEncodeError:
                raise _Refused(f"the {media_type} form is not valid Unicode") from None
            if len(encoded) > self.limits.max_text_bytes:
                raise _Refused(f"the {media_type} form is over {self.limits.max_text_bytes} bytes")
            if media_type == "application/json":
                try:
                    json.loads(text)
                except (ValueError, RecursionError):
                    raise _Refused("the application/json form is not JSON") from None
        if not isinstance(files, list) or len(files) > len(IMAGE_TYPES):
            raise _Refused(f"files must be a list of at most {len(IMAGE_TYPES)} images")
        out: list[tuple[str, str]] = []
        for item in files:
            if not isinstance(item, dict) or set(item) != {"name", "media_type"}:
                raise _Refused("a file entry is not an object with exactly name and media_type")
            media_type = item["media_type"]
            if media_type not in IMAGE_TYPES:
                raise _Refused(f"media type {str(media_type)[:40]!r} is not an allowed image type")
            expected = f"{stem}.{IMAGE_TYPES[media_type]}"
            if item["name"] != expected:
                raise _Refused(f"the {media_type} file must be named {expected}")
            if any(t == media_type for _, t in out):
                raise _Refused(f"two {media_type} files")
            out.append((expected, media_type))
        if kind == "figure" and not out:
            raise _Refused("a figure without an image")
        if kind != "figure" and (out or "text/plain" not in data):
            raise _Refused(f"a {kind} needs a text/plain form and no files")
        return cast(Literal["value", "table", "figure"], kind), dict(data), out, displayed

    def _store(self, name: str, media_type: str, blob: bytes) -> Artifact:
        # The bytes already checked are the bytes stored: through a memory file, never the
        # sandbox's file again.
        fd = os.memfd_create("sandcell-display", os.MFD_CLOEXEC)
        try:
            _write_all(fd, blob)
            os.lseek(fd, 0, os.SEEK_SET)
            sha, size = self.store.put_fd(fd, len(blob))
        except OSError as exc:
            raise InfraError(f"cannot stage a display output for the store: {exc}") from exc
        finally:
            os.close(fd)
        return Artifact(path=f"display/{name}", sha256=sha, size=size, media_type=media_type)


def _shown(name: str) -> str:
    """A name as a reason may quote it: printable, short."""
    text = name.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
    return text[:80] + ("..." if len(text) > 80 else "")


def _read(dir_fd: int, name: str, cap: int) -> bytes:
    """The content of regular file ``name`` in ``dir_fd``, at most ``cap`` bytes, or _Refused."""
    try:
        fd = os.open(name, _OPEN_FILE, dir_fd=dir_fd)
    except FileNotFoundError:
        raise _Refused(f"{name} is missing") from None
    except OSError as exc:  # ELOOP: a symlink
        raise _Refused(f"{name} cannot be opened safely: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused(f"{name} is not a regular file")
        if st.st_nlink != 1:
            raise _Refused(f"{name} has {st.st_nlink} hard links")
        if st.st_size > cap:
            raise _Refused(f"{name} is {st.st_size} bytes, over the cap of {cap}")
        chunks: list[bytes] = []
        got = 0
        while got <= cap:
            chunk = os.read(fd, min(1 * MiB, cap + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > cap:
            raise _Refused(f"{name} grew over the cap of {cap} bytes while read")
        return b"".join(chunks)
    except OSError as exc:
        raise _Refused(f"{name} cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)


def _check_image(media_type: str, blob: bytes, name: str) -> None:
    if media_type == "image/png":
        if not blob.startswith(_PNG_MAGIC):
            raise _Refused(f"{name} is not a PNG (no PNG signature)")
        return
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise _Refused(f"{name} is not UTF-8 text") from None
    # Entity declarations are how XML bombs and external entities start; an SVG needs none.
    if "<!ENTITY" in text.upper():
        raise _Refused(f"{name} declares XML entities")
    # Imported here: only a run that shows an SVG needs an XML parser, and the executor that
    # imports this module is on the path of every command line run.
    import xml.etree.ElementTree as ET

    try:
        # Entity declarations were refused above: no XML bomb, no external entity to resolve.
        root = ET.fromstring(text)  # noqa: S314
    except (ET.ParseError, ValueError, RecursionError):
        raise _Refused(f"{name} is not well-formed XML") from None
    if root.tag != f"{_SVG_NS}svg":
        raise _Refused(f"{name} is not an SVG document (root element {root.tag[:60]!r})")
    for element in root.iter():
        tag = element.tag if isinstance(element.tag, str) else ""
        local = tag.rpartition("}")[2].lower()
        if local in ("script", "foreignobject"):
            raise _Refused(f"{name} contains a {local} element")
        for attr, value in element.attrib.items():
            attr_local = attr.rpartition("}")[2].lower()
            if attr_local.startswith("on"):
                raise _Refused(f"{name} has an event handler attribute ({attr_local})")
            if attr_local == "href" or attr == _XLINK_HREF:
                target = re.sub(r"[\s\x00-\x1f]", "", value).lower()
                if target.startswith(("javascript:", "vbscript:")) or (
                    target.startswith("data:") and not target.startswith("data:image/")
                ):
                    raise _Refused(f"{name} links to {target[:20]!r}")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
