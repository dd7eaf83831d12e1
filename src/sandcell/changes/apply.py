"""Applying a recorded change set to a directory: governed, checked, atomic per file, recorded.

Before anything is written: every change must be applicable (no link pointing out of the
directory, no socket or FIFO), the target's whole state (``.git`` aside) must equal the manifest
the run started from (else the differing paths are listed and nothing is written), the rules of
:mod:`sandcell.changes.safety` must hold against the target as it is now (no ``.git`` anywhere,
no special mode bits, no link leading out through the chain of links it will hold), and, where
the profile wants one, an approval bound to this run and this exact change-set hash is consumed.
Every path is reached through directory descriptors opened ``O_NOFOLLOW`` from the target's
root, so a link in the target is never followed out of it; each file is written to a new
temporary name in its directory and renamed over the old one, so a reader sees the old file or the
new one, never half of either; each file's current content is checked against the manifest just
before it is replaced. The apply is appended to the audit log: which run, which change set,
who approved, what changed, and the target's state hash before and after.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import os
import secrets
import stat
import tarfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sandcell.audit import AuditLog
from sandcell.changes.approvals import ChangeApprovalError, ChangeApprovals
from sandcell.changes.diff import Change, binary_reason
from sandcell.changes.manifest import Entry, Manifest, differences, hash_fd, tree_state
from sandcell.changes.record import RecordedChanges
from sandcell.changes.safety import refusals
from sandcell.errors import ConfigError

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ApplyError(ConfigError):
    """A change set that cannot be applied here; nothing (or, for a failure midway, only the
    files listed as applied) was written."""


@dataclass(frozen=True, slots=True)
class ApplyReport:
    apply_id: str
    target: str
    applied: tuple[str, ...]
    before_sha256: str
    after_sha256: str
    expected_after_sha256: str
    approval: Mapping[str, object]

    @property
    def as_expected(self) -> bool:
        return self.after_sha256 == self.expected_after_sha256


def expected_after(manifest: Manifest, changes: tuple[Change, ...]) -> Manifest:
    """The state a target in ``manifest``'s state reaches once ``changes`` are applied."""
    entries = dict(manifest.entries)
    for c in changes:
        if c.old_path is not None:
            entries.pop(c.old_path, None)
        if c.new is None:
            entries.pop(c.path, None)
        else:
            entries[c.path] = c.new
    return Manifest(entries=entries)


def _contents(rec: RecordedChanges) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(rec.contents), mode="r:") as tar:
        for m in tar.getmembers():
            if m.isreg() and m.name.startswith("files/"):
                f = tar.extractfile(m)
                out[m.name[len("files/") :]] = f.read() if f is not None else b""
    return out


@contextmanager
def _parent(root_fd: int, rel: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """A descriptor of ``rel``'s directory, reached from ``root_fd`` one name at a time without
    following any link, and ``rel``'s last name."""
    *dirs, name = rel.split("/")
    fd = os.dup(root_fd)
    try:
        for d in dirs:
            try:
                nxt = os.open(d, _O_DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(d, 0o755, dir_fd=fd)
                nxt = os.open(d, _O_DIR, dir_fd=fd)
            except OSError as exc:
                raise ApplyError(
                    f"{rel!r}: {d!r} on its way is not a plain directory ({exc.strerror}); "
                    "links in the target are never followed"
                ) from None
            os.close(fd)
            fd = nxt
        yield fd, name
    finally:
        os.close(fd)


def _current(dir_fd: int, name: str) -> Entry | None:
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return Entry("symlink", 0, target=os.readlink(name, dir_fd=dir_fd))
    if stat.S_ISDIR(st.st_mode):
        return Entry("dir", stat.S_IMODE(st.st_mode))
    if not stat.S_ISREG(st.st_mode):
        raise ApplyError(f"{name!r} in the target is neither a file, a directory nor a link")
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        digest, size = hash_fd(fd)
    finally:
        os.close(fd)
    return Entry("file", stat.S_IMODE(st.st_mode), sha256=digest, size=size)


def _expect(dir_fd: int, name: str, rel: str, old: Entry | None) -> None:
    now = _current(dir_fd, name)
    if now != old:
        raise ApplyError(f"{rel!r} changed in the target while applying; stopped before it")


def _replace_file(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    tmp = f".sandcell-apply-{secrets.token_hex(8)}"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _replace_link(dir_fd: int, name: str, target: str) -> None:
    tmp = f".sandcell-apply-{secrets.token_hex(8)}"
    os.symlink(target, tmp, dir_fd=dir_fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _chmod(dir_fd: int, name: str, kind: str, mode: int) -> None:
    flags = _O_DIR if kind == "dir" else os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(name, flags | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _remove(dir_fd: int, name: str, old: Entry) -> None:
    if old.kind == "dir":
        os.rmdir(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _refuse_binary(rec: RecordedChanges, contents: Mapping[str, bytes], profile: str) -> None:
    """ApplyError if the change set writes a file a person cannot read as a diff, judged from
    the bytes that would be written, not from the recorded flag."""
    binary = [
        f"{c.path} ({why}, {c.new.size} bytes, sha256 {c.new.sha256})"
        for c in rec.changes
        if c.new is not None
        and c.new.kind == "file"
        and (why := binary_reason(contents.get(c.path, b""))) is not None
    ]
    if binary:
        raise ApplyError(
            f"run {rec.run_id}'s change set writes binary content, which profile {profile!r} "
            f"does not apply (it cannot be reviewed as a diff): {'; '.join(binary[:10])}; "
            "nothing was written. To apply it, use a profile whose [workdir] section says "
            'binary_changes = "allow" (--profile)'
        )


def _order(changes: tuple[Change, ...]) -> list[Change]:
    """Removals deepest first, then everything else shallowest first."""
    removals = [c for c in changes if c.new is None]
    rest = [c for c in changes if c.new is not None]
    removals.sort(key=lambda c: (-c.path.count("/"), c.path))
    rest.sort(key=lambda c: (c.path.count("/"), c.path))
    return removals + rest


def _apply_one(root_fd: int, c: Change, contents: Mapping[str, bytes]) -> None:
    if c.new is None:
        assert c.old is not None
        with _parent(root_fd, c.path) as (fd, name):
            _expect(fd, name, c.path, c.old)
            _remove(fd, name, c.old)
        return
    new = c.new
    with _parent(root_fd, c.path, create=True) as (fd, name):
        _expect(fd, name, c.path, None if c.action == "rename" else c.old)
        if c.action == "mode":
            _chmod(fd, name, new.kind, new.mode)
        elif new.kind == "dir":
            if c.old is not None and c.old.kind != "dir":
                _remove(fd, name, c.old)
            if c.old is None or c.old.kind != "dir":
                os.mkdir(name, 0o700, dir_fd=fd)
            _chmod(fd, name, "dir", new.mode)
        elif new.kind == "symlink":
            assert new.target is not None
            if c.old is not None and c.old.kind == "dir":
                os.rmdir(name, dir_fd=fd)  # emptied by the removals, which came first
            _replace_link(fd, name, new.target)
        else:
            if c.old is not None and c.old.kind == "dir":
                os.rmdir(name, dir_fd=fd)
            data = contents.get(c.path)
            if data is None or hashlib.sha256(data).hexdigest() != new.sha256:
                raise ApplyError(f"the recorded new content of {c.path!r} does not match its hash")
            _replace_file(fd, name, data, new.mode)
    if c.action == "rename" and c.old_path is not None and c.old is not None:
        with _parent(root_fd, c.old_path) as (fd, name):
            _expect(fd, name, c.old_path, c.old)
            _remove(fd, name, c.old)


def apply(
    rec: RecordedChanges,
    target: Path,
    *,
    approvals: ChangeApprovals,
    audit: AuditLog,
    needs_approval: bool,
    allow_binary: bool,
    profile_name: str,
    applied_by: str,
    approval_id: str | None = None,
) -> ApplyReport:
    """Apply run ``rec``'s change set to ``target`` (see the module's description).
    ``allow_binary``: the profile's ``[workdir] binary_changes`` is ``"allow"``."""
    blocked = [c for c in rec.changes if not c.applicable]
    if blocked:
        lines = "; ".join(f"{c.path}: {', '.join(c.flags) or c.action}" for c in blocked[:10])
        raise ApplyError(f"run {rec.run_id}'s change set cannot be applied: {lines}")
    if not target.is_dir():
        raise ApplyError(f"--to {str(target)!r} is not a directory")
    before = tree_state(target)
    if before.sha256 != rec.manifest.sha256:
        diffs = differences(rec.manifest, before)
        raise ApplyError(
            f"{str(target)!r} is not in the state run {rec.run_id} started from (.git aside); "
            "nothing was written. It differs at: " + "; ".join(diffs)
        )
    # Judged again here, against the target as it is now: nothing recorded earlier is trusted.
    written = {c.path: c.new for c in rec.changes if c.new is not None}
    expected = expected_after(before, rec.changes)
    refused = refusals(before.entries, expected.entries, written, rec.manifest.left_out)
    if refused:
        raise ApplyError(
            f"run {rec.run_id}'s change set cannot be applied to {str(target)!r}; nothing was "
            "written: " + "; ".join(refused[:10])
        )
    contents = _contents(rec)
    if not allow_binary:
        _refuse_binary(rec, contents, profile_name)
    approval: dict[str, object]
    if needs_approval:
        if approval_id is None:
            latest = approvals.latest(rec.run_id, rec.changeset_sha256)
            if latest is None:
                raise ChangeApprovalError(
                    f"applying run {rec.run_id}'s change set needs an approval (profile "
                    f"{profile_name!r}); a person approves it with: sandcell changes approve "
                    f"{rec.run_id}"
                )
            approval_id = latest.id
        used = approvals.consume(
            approval_id,
            run_id=rec.run_id,
            changeset_sha256=rec.changeset_sha256,
            target=str(target),
        )
        approval = {"required": True, **used.to_dict()}
    else:
        approval = {"required": False, "profile": profile_name}
    started = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")
    t0 = time.monotonic()
    applied: list[str] = []
    root_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    error: str | None = None
    try:
        for c in _order(rec.changes):
            _apply_one(root_fd, c, contents)
            applied.append(c.path)
    except (OSError, ApplyError) as exc:
        error = str(exc)
    finally:
        os.close(root_fd)
    after = tree_state(target)
    apply_id = "apply-" + uuid.uuid4().hex
    audit.append(
        {
            "run_id": apply_id,
            "kind": "changes_apply",
            "started_at": started,
            "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="microseconds"),
            "outcome": "applied" if error is None else "error",
            "reason": error or f"applied run {rec.run_id}'s change set to {target}",
            "of_run": rec.run_id,
            "changeset_sha256": rec.changeset_sha256,
            "patch_sha256": rec.body.get("patch_sha256"),
            "target": str(target),
            "target_before_sha256": before.sha256,
            "target_after_sha256": after.sha256,
            "expected_after_sha256": expected.sha256,
            "applied_by": applied_by,
            "approval": approval,
            "applied": applied,
            "usage": {"wall_ms": round((time.monotonic() - t0) * 1000, 3)},
        }
    )
    if error is not None:
        raise ApplyError(
            f"applying stopped: {error}; applied before that: {', '.join(applied) or 'nothing'} "
            f"(recorded as {apply_id})"
        )
    return ApplyReport(
        apply_id=apply_id,
        target=str(target),
        applied=tuple(applied),
        before_sha256=before.sha256,
        after_sha256=after.sha256,
        expected_after_sha256=expected.sha256,
        approval=approval,
    )
