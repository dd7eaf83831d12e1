"""One ``--workdir-from`` run: the snapshot before, the change set after.

:class:`WorkdirRun` takes the snapshot (checked against the run's workspace limits before any
copying), wraps the admitted request (:mod:`sandcell.changes.program`), and after the run turns
the sandbox's change archive, which left as an ordinary export and passed the export checks,
into the run's change-set artifacts, stored and hashed like any artifact and so recorded with the
run: ``changes.patch`` (the diff), ``changes.json`` (the machine-readable change set),
``changes.tar`` (the new content of what changed, used by ``changes apply``) and
``workdir.manifest.json`` (the state the run started from).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from sandcell.artifacts import ArtifactStore, ExportLimits
from sandcell.changes import snapshot
from sandcell.changes.credentials import LeftOut
from sandcell.changes.diff import ChangeSet, compute
from sandcell.changes.manifest import Manifest
from sandcell.changes.program import ARCHIVE_INPUT, CHANGES_FILE, wrap
from sandcell.errors import ConfigError
from sandcell.policy.checks import check
from sandcell.spec import Artifact, InputFile, Language, Limits, RejectedExport, RunRequest
from sandcell.validation import scan_artifact

if TYPE_CHECKING:
    from sandcell.pipeline import PostCollect

PATCH = "changes.patch"
CHANGESET = "changes.json"
CONTENTS = "changes.tar"
MANIFEST = "workdir.manifest.json"
ARTIFACT_NAMES = (PATCH, CHANGESET, CONTENTS, MANIFEST)
RECORD_FIELD = "workdir_changes"
"""The run record's field naming the change set by the hashes of its artifacts. The record is
written by the host, so this is what :mod:`sandcell.changes.record` trusts; an artifact's path
is not (the program chooses the names of the files it exports)."""


def reserve_names(
    artifacts: tuple[Artifact, ...],
) -> tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]]:
    """The program's exports, less any under a change-set artifact's name (refused, saying
    why): two artifacts of one run under one name would let a reader take the program's file
    for sandcell's."""
    kept = tuple(a for a in artifacts if a.path not in ARTIFACT_NAMES)
    refused = tuple(
        RejectedExport(
            path=a.path,
            reason=f"{a.path!r} is the name of sandcell's own change-set artifact in a "
            "--workdir-from --export-diff run; the program may not export a file under it "
            "(write it under another name)",
        )
        for a in artifacts
        if a.path in ARTIFACT_NAMES
    )
    return kept, refused


def _digest(kept: Mapping[str, object], key: str) -> str:
    value = kept.get(key)
    if not isinstance(value, str) or len(value) != 64:
        raise ConfigError(f"the record names no {key} of its snapshot")
    return value


def _read_verified(store: ArtifactStore, sha256: str) -> bytes:
    try:
        data = store.path_for(sha256).read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"the kept snapshot {sha256[:12]} is no longer in the artifact store ({exc.strerror})"
        ) from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ConfigError(f"the kept snapshot {sha256[:12]} was changed in the artifact store")
    return data


def _copy_verified(store: ArtifactStore, sha256: str, dest: Path) -> None:
    """Copy stored content to ``dest`` (a new file), hashing it on the way."""
    h = hashlib.sha256()
    try:
        with store.path_for(sha256).open("rb") as src, dest.open("xb") as out:
            while chunk := src.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
    except FileNotFoundError:
        raise ConfigError(
            f"the kept snapshot {sha256[:12]} is no longer in the artifact store"
        ) from None
    if h.hexdigest() != sha256:
        raise ConfigError(f"the kept snapshot {sha256[:12]} was changed in the artifact store")


def store_bytes(store: ArtifactStore, data: bytes, max_bytes: int) -> tuple[str, int]:
    """Store ``data`` (at most ``max_bytes``) in the artifact store: its digest and size."""
    fd = os.memfd_create("sandcell-changes", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        return store.put_fd(fd, max_bytes)
    finally:
        os.close(fd)


_CHECKED: dict[str, Language] = {
    ".py": "python",
    ".sh": "bash",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
}


def code_language(path: str, data: bytes) -> Language | None:
    """The language the code checks judge a changed file in: by its extension, else by its
    ``#!`` line (an executable script needs no extension); None for anything else."""
    by_name = _CHECKED.get(posixpath.splitext(path)[1])
    if by_name is not None or not data.startswith(b"#!"):
        return by_name
    first = data[:256].split(b"\n", 1)[0]
    if b"python" in first:
        return "python"
    if first.rstrip().endswith((b"sh", b"bash", b"dash")):
        return "bash"
    if b"node" in first:
        return "javascript"
    return None


def findings(cs: ChangeSet, known_secrets: tuple[str, ...]) -> list[dict[str, object]]:
    """The checks' findings on a change set: secret-shaped tokens and the host's secrets in the
    patch (as in any exported file), and the static code checks on every changed Python,
    shell, JavaScript or TypeScript file (as they judge a program before it runs), each naming
    where. A code file the checks cannot read as text (a NUL byte, not UTF-8) is a finding
    itself, never skipped."""
    out: list[dict[str, object]] = [
        {
            "check": "secrets",
            "path": PATCH,
            "severity": x.severity,
            "line": x.line,
            "what": x.kind,
            "detail": x.preview,
        }
        for x in scan_artifact(cs.patch, path=PATCH, known_secrets=known_secrets)
    ]
    for path, data in sorted(cs.contents.items()):
        language = code_language(path, data)
        if language is None:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or "\x00" in text:
            out.append(
                {
                    "check": "code",
                    "path": path,
                    "severity": "warning",
                    "line": None,
                    "what": "unreadable",
                    "detail": f"a {language} file that is not UTF-8 text without NUL bytes: "
                    "the code checks cannot read it; review its bytes (it is shown as binary)",
                }
            )
            continue
        for f in check(text, language, allowed_imports=None, network=False):
            out.append(
                {
                    "check": "code",
                    "path": path,
                    "severity": f.severity,
                    "line": f.line,
                    "what": f.rule_id,
                    "detail": f.message,
                }
            )
    return out


class WorkdirRun:
    """The snapshot of one run's working directory; a context manager that removes its copy
    afterwards. Made from a directory (:meth:`take`) or, for a replay, from the snapshot a
    recorded run kept in the artifact store (:meth:`from_store`)."""

    def __init__(self, snap: snapshot.Snapshot, tmp: Path) -> None:
        self.snapshot = snap
        self._tmp = tmp
        self.findings: list[dict[str, object]] = []

    @classmethod
    def take(cls, source: Path, limits: Limits, *, leave_out: Sequence[str] = ()) -> WorkdirRun:
        """Snapshot ``source`` (checked against ``limits`` before anything is copied)."""
        if not source.is_dir():
            raise ConfigError(f"--workdir-from {str(source)!r} is not a directory; pass one")
        tmp = Path(tempfile.mkdtemp(prefix="sandcell-workdir-"))
        try:
            snap = snapshot.take(source, tmp / ARCHIVE_INPUT, limits, leave_out=leave_out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return cls(snap, tmp)

    @classmethod
    def from_store(cls, store: ArtifactStore, kept: Mapping[str, object]) -> WorkdirRun:
        """The snapshot a run kept (:meth:`keep`'s fields from its record), every byte checked
        against the hashes the record names; ConfigError when it is gone or was changed."""
        archive_sha = _digest(kept, "archive_sha256")
        manifest_sha = _digest(kept, "manifest_artifact_sha256")
        raw_left = kept.get("left_out")
        left_out = tuple(
            LeftOut(str(x.get("path")), str(x.get("why")))
            for x in (raw_left if isinstance(raw_left, list) else [])
            if isinstance(x, Mapping)
        )
        tmp = Path(tempfile.mkdtemp(prefix="sandcell-workdir-"))
        try:
            archive = tmp / ARCHIVE_INPUT
            _copy_verified(store, archive_sha, archive)
            manifest = Manifest.from_json(_read_verified(store, manifest_sha))
            if manifest.sha256 != kept.get("tree_sha256"):
                raise ConfigError("the kept manifest is not of the tree the record names")
            source = Path(str(kept.get("source", "")))
            return cls(snapshot.Snapshot(source, archive, manifest, left_out), tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def keep(self, store: ArtifactStore) -> dict[str, object]:
        """Store the snapshot (its archive and manifest) in the artifact store, so that a replay
        rebuilds the very tree the run started from; the fields that name it in the record."""
        fd = os.open(self.snapshot.archive, os.O_RDONLY | os.O_CLOEXEC)
        try:
            archive_sha, size = store.put_fd(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        manifest_json = self.snapshot.manifest.to_json()
        manifest_sha, _ = store_bytes(store, manifest_json, len(manifest_json))
        return {
            "source": str(self.snapshot.source),
            "archive_sha256": archive_sha,
            "archive_bytes": size,
            "manifest_artifact_sha256": manifest_sha,
            "tree_sha256": self.snapshot.manifest.sha256,
            "left_out": [x.to_dict() for x in self.snapshot.left_out],
        }

    def __enter__(self) -> WorkdirRun:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def wrap(self, request: RunRequest) -> RunRequest:
        if request.display:
            raise ConfigError("--workdir-from cannot be combined with --display; drop one")
        if any(i.name == ARCHIVE_INPUT for i in request.inputs):
            raise ConfigError(f"an input may not be named {ARCHIVE_INPUT!r} with --workdir-from")
        return wrap(request, InputFile(host_path=self.snapshot.archive, name=ARCHIVE_INPUT))

    def record(self) -> dict[str, object]:
        """What the run record says of the working directory."""
        m = self.snapshot.manifest
        return {
            "source": str(self.snapshot.source),
            "manifest_sha256": m.sha256,
            "entries": len(m.entries),
            "git_entries": m.git_entries,
            "bytes": m.total_bytes,
            # What the sandbox did not get as it is here (credentials), so that a test that
            # failed for want of one is explained.
            "left_out": [x.to_dict() for x in self.snapshot.left_out],
        }

    def post_collect(
        self, store: ArtifactStore, limits: ExportLimits, known_secrets: tuple[str, ...]
    ) -> PostCollect:
        """The executor's ``post_collect`` hook: change archive in, change-set artifacts out,
        and the change set named in the run's record (:data:`RECORD_FIELD`)."""

        def hook(
            ws: Path, artifacts: tuple[Artifact, ...], rejected: tuple[RejectedExport, ...]
        ) -> tuple[tuple[Artifact, ...], tuple[RejectedExport, ...], Mapping[str, object]]:
            del ws
            kept, refused = reserve_names(artifacts)
            archive = [a for a in kept if a.path == CHANGES_FILE]
            kept = tuple(a for a in kept if a.path != CHANGES_FILE)
            why = [r.reason for r in rejected if r.path == CHANGES_FILE]
            others = (*(r for r in rejected if r.path != CHANGES_FILE), *refused)
            if not archive:
                reason = (
                    f"no change set: the change archive was refused ({why[0]})"
                    if why
                    else "no change set: the program did not finish (it was stopped before "
                    "the changes could be recorded)"
                )
                return kept, (*others, RejectedExport(path=PATCH, reason=reason)), {}
            try:
                made = self._artifacts(store, limits, archive[0], known_secrets)
            except ConfigError as exc:
                reason = f"no change set: {exc}"
                return kept, (*others, RejectedExport(path=PATCH, reason=reason)), {}
            named = {a.path: a.sha256 for a in made}
            field = {
                "changeset_sha256": named[CHANGESET],
                "patch_sha256": named[PATCH],
                "contents_sha256": named[CONTENTS],
                "manifest_sha256": named[MANIFEST],
            }
            return (*kept, *made), others, {RECORD_FIELD: field}

        return hook

    def _artifacts(
        self,
        store: ArtifactStore,
        limits: ExportLimits,
        archive: Artifact,
        known_secrets: tuple[str, ...],
    ) -> tuple[Artifact, ...]:
        data = store.path_for(archive.sha256).read_bytes()
        if hashlib.sha256(data).hexdigest() != archive.sha256:
            raise ConfigError("the stored change archive does not match its hash")
        manifest = self.snapshot.manifest
        with tarfile.open(self.snapshot.archive) as snap:
            cs = compute(data, manifest, snap)
        self.findings = findings(cs, known_secrets)
        manifest_json = manifest.to_json()
        m_sha, m_size = store_bytes(store, manifest_json, limits.max_file_bytes)
        p_sha, p_size = store_bytes(store, cs.patch, limits.max_file_bytes)
        body = {
            "version": 1,
            "source": str(self.snapshot.source),
            "base_manifest_sha256": manifest.sha256,
            "manifest_artifact_sha256": m_sha,
            "patch_sha256": p_sha,
            "contents_sha256": archive.sha256,
            "changes": [c.to_dict() for c in cs.changes],
            "findings": self.findings,
        }
        cj = json.dumps(body, sort_keys=True, indent=1).encode()
        c_sha, c_size = store_bytes(store, cj, limits.max_file_bytes)
        return (
            Artifact(path=PATCH, sha256=p_sha, size=p_size, media_type="text/x-diff"),
            Artifact(path=CHANGESET, sha256=c_sha, size=c_size, media_type="application/json"),
            Artifact(
                path=CONTENTS,
                sha256=archive.sha256,
                size=archive.size,
                media_type="application/x-tar",
            ),
            Artifact(path=MANIFEST, sha256=m_sha, size=m_size, media_type="application/json"),
        )
