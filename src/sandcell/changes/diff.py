"""The change set of a run: what its program changed in the working directory, against the
manifest the run started from.

Input is the archive the sandbox wrote (:mod:`sandcell.changes.program`), which is untrusted:
every path is checked (relative, ordinary names, never under ``.git``), only regular files,
directories and symbolic links are taken, and each entry is compared with the host's own
manifest, so an entry the sandbox claims changed but did not is dropped. Text files become a
unified diff; binary files, deletions, renames (a deleted file whose exact content and mode
reappear under a new name), mode changes and symbolic links are stated explicitly. What
:mod:`sandcell.changes.safety` refuses (a link leading out of the directory, a repository inside
it) is flagged and can never be applied; special mode bits are stripped, and the change says so.
"""

from __future__ import annotations

import difflib
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sandcell.changes.manifest import Entry, Manifest, is_git
from sandcell.changes.safety import LEFT_OUT_FLAG, escaping_links, git_prefix, strip_mode
from sandcell.errors import ConfigError

MAX_DEPTH = 64
MAX_TEXT_DIFF_BYTES = 1 << 20
"""A text file larger than this is described like a binary one (hashes and sizes)."""


@dataclass(frozen=True, slots=True)
class Change:
    path: str
    action: str
    """``add``, ``modify``, ``delete``, ``rename``, ``mode`` or ``unsupported``."""
    old: Entry | None
    new: Entry | None
    old_path: str | None = None
    binary: bool = False
    flags: tuple[str, ...] = ()
    """Why it can never be applied; empty when it can."""
    notes: tuple[str, ...] = ()
    """What the host changed in it before recording it (special mode bits stripped)."""

    @property
    def applicable(self) -> bool:
        return self.action != "unsupported" and not self.flags

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "action": self.action,
            "old_path": self.old_path,
            "old": None if self.old is None else self.old.to_dict(),
            "new": None if self.new is None else self.new.to_dict(),
            "binary": self.binary,
            "flags": list(self.flags),
            "notes": list(self.notes),
            "applicable": self.applicable,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Change:
        def entry(v: object) -> Entry | None:
            return None if v is None else Entry.from_dict(v)  # type: ignore[arg-type]

        flags = d.get("flags") or []
        notes = d.get("notes") or []
        old_path = d.get("old_path")
        return cls(
            path=check_path(str(d["path"])),
            action=str(d["action"]),
            old=entry(d.get("old")),
            new=entry(d.get("new")),
            old_path=None if old_path is None else check_path(str(old_path)),
            binary=bool(d.get("binary")),
            flags=tuple(str(f) for f in flags),  # type: ignore[attr-defined]
            notes=tuple(str(n) for n in notes),  # type: ignore[attr-defined]
        )


@dataclass(frozen=True, slots=True)
class ChangeSet:
    changes: tuple[Change, ...]
    patch: bytes
    contents: dict[str, bytes] = field(default_factory=dict)
    """New content of each added or modified regular file, by path (not serialised)."""


def check_path(rel: str) -> str:
    """``rel`` if it is a plain relative path of ordinary names, not under ``.git``; else
    ConfigError (a change set naming anything else is refused, never applied)."""
    parts = rel.split("/")
    if (
        not rel
        or rel.startswith("/")
        or "\x00" in rel
        or len(parts) > MAX_DEPTH
        or any(p in ("", ".", "..") or len(p.encode()) > 255 for p in parts)
    ):
        raise ConfigError(f"the change set names a path that is not allowed: {rel!r}")
    if is_git(rel):
        raise ConfigError(f"the change set touches {rel!r}: changes under .git are never applied")
    return rel


def _decoded(data: bytes) -> tuple[str | None, str | None]:
    """``data`` as text and None, or None and why it is shown as binary (decoded once)."""
    if b"\x00" in data:
        return None, "holds a NUL byte"
    if len(data) > MAX_TEXT_DIFF_BYTES:
        return None, f"over {MAX_TEXT_DIFF_BYTES // (1 << 20)} MiB"
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, "not UTF-8"


def binary_reason(data: bytes) -> str | None:
    """Why ``data`` is shown as binary rather than as a text diff, or None for text."""
    return _decoded(data)[1]


def _text(data: bytes) -> str | None:
    return _decoded(data)[0]


def _lines(text: str) -> list[str]:
    """``text`` split after each newline only, as git splits it: ``str.splitlines`` would also
    break at a carriage return, form feed or U+2028, so the patch would show lines the file does
    not have."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def compute(changes_tar: bytes, manifest: Manifest, snapshot: tarfile.TarFile) -> ChangeSet:
    """The change set the sandbox's archive describes, against ``manifest``; ``snapshot`` (the
    archive the run started from) gives the old content of text files. The rules of
    :mod:`sandcell.changes.safety` become the changes' flags (never applicable) and notes."""
    meta: Mapping[str, object] = {}
    new: dict[str, Entry] = {}
    notes: dict[str, str] = {}
    contents: dict[str, bytes] = {}
    try:
        tar = tarfile.open(fileobj=io.BytesIO(changes_tar), mode="r:")  # noqa: SIM115 - closed below
    except tarfile.TarError as exc:
        raise ConfigError(f"the sandbox's change archive does not parse: {exc}") from None
    with tar:
        for m in tar.getmembers():
            if m.name == "meta.json" and m.isfile():
                f = tar.extractfile(m)
                meta = json.loads(f.read()) if f is not None else {}
                continue
            if not m.name.startswith("files/"):
                raise ConfigError(f"the sandbox's change archive has a stray entry {m.name!r}")
            rel = check_path(m.name[len("files/") :])
            mode, note = strip_mode(m.mode)
            if note is not None and not m.issym():
                notes[rel] = note
            if m.isreg():
                f = tar.extractfile(m)
                data = f.read() if f is not None else b""
                contents[rel] = data
                new[rel] = Entry("file", mode, sha256=_sha(data), size=len(data))
            elif m.issym():
                new[rel] = Entry("symlink", 0, target=m.linkname)
            elif m.isdir():
                new[rel] = Entry("dir", mode)
            else:
                raise ConfigError(f"the sandbox's change archive has {rel!r} of an unusable kind")
    deleted = [check_path(str(p)) for p in meta.get("deleted", []) or []]  # type: ignore[attr-defined]
    other = [check_path(str(p)) for p in meta.get("other", []) or []]  # type: ignore[attr-defined]

    out: list[Change] = []
    gone = {p: manifest.entries[p] for p in deleted if p in manifest.entries and p not in new}
    # A repository inside the tree is one refused change, not one per file of it.
    repos: dict[str, int] = {}
    for p in [*new, *gone, *other]:
        prefix = git_prefix(p)
        if prefix is not None:
            repos[prefix] = repos.get(prefix, 0) + 1
    in_repos = {p: new[p] for p in repos if p in new}
    new = {p: e for p, e in new.items() if git_prefix(p) is None}
    gone = {p: e for p, e in gone.items() if git_prefix(p) is None}
    other = [p for p in other if git_prefix(p) is None]
    added = {p: e for p, e in new.items() if p not in manifest.entries}
    # A rename: a deleted file whose content and mode reappear, once, under a new name.
    renamed: dict[str, str] = {}
    by_content = {(e.sha256, e.mode): p for p, e in gone.items() if e.kind == "file"}
    for p, e in sorted(added.items()):
        key = (e.sha256, e.mode)
        if e.kind == "file" and key in by_content:
            renamed[p] = by_content.pop(key)
    for old_p in renamed.values():
        del gone[old_p]
    after = dict(manifest.entries)
    for p in gone:
        after.pop(p, None)
    for old_p in renamed.values():
        after.pop(old_p, None)
    after.update(new)
    leading_out = escaping_links(manifest.entries, after, new)
    protected = frozenset(manifest.left_out)
    for p in sorted(set(new) | set(gone) | set(other) | set(repos) | set(leading_out)):
        old = manifest.entries.get(p)
        if p in repos:
            out.append(
                Change(
                    p,
                    "unsupported",
                    old,
                    in_repos.get(p),
                    flags=(
                        f"a repository's own files ({repos[p]} entries under {p!r}): "
                        "a .git inside the change set is never applied",
                    ),
                )
            )
            continue
        if p in other:
            out.append(
                Change(
                    p,
                    "unsupported",
                    old,
                    None,
                    flags=("a socket or FIFO made by the program: never applied",),
                )
            )
            continue
        if p in gone:
            out.append(Change(p, "delete", old, None, binary=_is_binary(old, snapshot, p)))
            continue
        flags: tuple[str, ...] = ()
        if p in leading_out:
            flags = (f"symbolic link pointing outside the directory: {leading_out[p]}",)
        if p in protected:
            flags = (*flags, LEFT_OUT_FLAG)
        if p not in new:
            # An unchanged link that other changes made lead out: it is the change set's doing.
            out.append(Change(p, "unsupported", old, old, flags=flags))
            continue
        e = new[p]
        kept_notes = (notes[p],) if p in notes else ()
        if p in renamed:
            out.append(
                Change(
                    p,
                    "rename",
                    manifest.entries[renamed[p]],
                    e,
                    old_path=renamed[p],
                    binary=_text(contents[p]) is None,
                    notes=kept_notes,
                )
            )
            continue
        if old == e:
            continue
        if old is None:
            action = "add"
        elif old.kind == e.kind and old.sha256 == e.sha256 and old.target == e.target:
            action = "mode"
        else:
            action = "modify"
        binary = e.kind == "file" and _text(contents[p]) is None
        if old is not None and old.kind == "file" and not binary:
            binary = _is_binary(old, snapshot, p)
        out.append(Change(p, action, old, e, binary=binary, flags=flags, notes=kept_notes))
    changes = tuple(out)
    kept = {c.path: contents[c.path] for c in changes if c.path in contents}
    return ChangeSet(changes, render(changes, kept, snapshot), kept)


def _old_bytes(snapshot: tarfile.TarFile, path: str) -> bytes:
    try:
        f = snapshot.extractfile(path)
    except KeyError:
        return b""
    return f.read() if f is not None else b""


def _is_binary(old: Entry | None, snapshot: tarfile.TarFile, path: str) -> bool:
    if old is None or old.kind != "file":
        return False
    return _text(_old_bytes(snapshot, path)) is None


def _mode(e: Entry) -> str:
    kind = {"file": 0o100000, "symlink": 0o120000, "dir": 0o040000}[e.kind]
    return f"{kind | e.mode:06o}"


def _describe(e: Entry) -> str:
    if e.kind == "symlink":
        return f"symbolic link -> {e.target}"
    if e.kind == "dir":
        return f"directory, mode {e.mode:04o}"
    return f"file, mode {e.mode:04o}, {e.size} bytes, sha256 {e.sha256}"


def _sized(e: Entry) -> str:
    return f"{e.size} bytes, sha256 {e.sha256}"


def _why(reason: str | None) -> str:
    return "" if reason is None else f" ({reason})"


def render(
    changes: Sequence[Change], contents: Mapping[str, bytes], snapshot: tarfile.TarFile
) -> bytes:
    """The change set as a patch: git-style headers, unified diffs of text files, and a
    ``# sandcell:`` line for everything a unified diff cannot say."""
    lines: list[str] = []
    for c in changes:
        a = c.old_path or c.path
        lines.append(f"diff --git a/{a} b/{c.path}")
        if c.action == "rename":
            lines += [f"rename from {a}", f"rename to {c.path}"]
        if c.old is not None and c.new is not None and _mode(c.old) != _mode(c.new):
            lines += [f"old mode {_mode(c.old)}", f"new mode {_mode(c.new)}"]
        elif c.old is None and c.new is not None:
            lines.append(f"new file mode {_mode(c.new)}")
        elif c.new is None and c.old is not None and c.action == "delete":
            lines.append(f"deleted file mode {_mode(c.old)}")
        for flag in c.flags:
            lines.append(f"# sandcell: NOT APPLICABLE: {flag}")
        for note in c.notes:
            lines.append(f"# sandcell: {note}")
        if c.old is not None and c.new is not None and c.old.kind != c.new.kind:
            lines.append(f"# sandcell: was {_describe(c.old)}; now {_describe(c.new)}")
        if c.action in ("rename", "mode", "unsupported"):
            continue
        old_kind = c.old.kind if c.old else None
        new_kind = c.new.kind if c.new else None
        if "symlink" in (old_kind, new_kind) or "dir" in (old_kind, new_kind):
            if c.old is not None:
                lines.append(f"# sandcell: old: {_describe(c.old)}")
            if c.new is not None:
                lines.append(f"# sandcell: new: {_describe(c.new)}")
            if old_kind != "file" and new_kind != "file":
                continue
        if c.binary:
            old_file = c.old if c.old is not None and c.old.kind == "file" else None
            new_file = c.new if c.new is not None and c.new.kind == "file" else None
            lines.append(
                f"Binary files {'a/' + a if old_file else '/dev/null'} and "
                f"{'b/' + c.path if new_file else '/dev/null'} differ"
            )
            # A binary change is described by what identifies its content exactly.
            if old_file is not None:
                why = binary_reason(_old_bytes(snapshot, a))
                lines.append(f"# sandcell: binary old: {_sized(old_file)}{_why(why)}")
            if new_file is not None:
                why = binary_reason(contents.get(c.path, b""))
                lines.append(f"# sandcell: binary new: {_sized(new_file)}{_why(why)}")
            continue
        old_text = _text(_old_bytes(snapshot, a)) if old_kind == "file" else ""
        new_text = _text(contents.get(c.path, b"")) if new_kind == "file" else ""
        diff = difflib.unified_diff(
            _lines(old_text or ""),
            _lines(new_text or ""),
            fromfile=f"a/{a}" if old_kind == "file" else "/dev/null",
            tofile=f"b/{c.path}" if new_kind == "file" else "/dev/null",
        )
        for line in diff:
            lines.append(line.rstrip("\n"))
            if not line.endswith("\n"):
                lines.append("\\ No newline at end of file")
    return ("\n".join(lines) + "\n").encode() if lines else b""
