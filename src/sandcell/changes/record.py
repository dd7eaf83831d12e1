"""A run's change set as its record names it, every artifact checked against its hash.

The run record (hash-chained in the audit log) names the change set by the SHA-256 of its
artifacts, in a field the host wrote (``workdir_changes``); the artifact store holds the bytes.
A stored file whose bytes no longer hash to what the record says was tampered with (or
damaged), and is refused: nothing shows or applies it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from sandcell.artifacts import ArtifactStore
from sandcell.audit import AuditLog
from sandcell.changes.diff import Change
from sandcell.changes.manifest import Manifest
from sandcell.changes.workdir import CHANGESET, CONTENTS, MANIFEST, PATCH, RECORD_FIELD
from sandcell.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RecordedChanges:
    run_id: str
    record: Mapping[str, object]
    changeset_sha256: str
    """The hash an approval is bound to: of ``changes.json``, which names the patch's, the new
    contents' and the starting manifest's hashes."""
    body: Mapping[str, object]
    changes: tuple[Change, ...]
    patch: bytes
    contents: bytes
    manifest: Manifest

    @property
    def outcome(self) -> str:
        return str(self.record.get("outcome", ""))

    @property
    def source(self) -> str:
        return str(self.body.get("source", ""))

    @property
    def findings(self) -> list[Mapping[str, object]]:
        """The checks' findings on the diff (secret-shaped tokens and the host's secrets)."""
        raw = self.body.get("findings")
        return [f for f in raw if isinstance(f, Mapping)] if isinstance(raw, list) else []


def _verified(store: ArtifactStore, sha256: str, what: str, run_id: str) -> bytes:
    path = store.path_for(sha256)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"{what} of run {run_id} is missing from the artifact store ({exc.strerror})"
        ) from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ConfigError(
            f"{what} of run {run_id} does not match the hash its run record names: the stored "
            "file was changed after the run; it is refused"
        )
    return data


def load(audit: AuditLog, store: ArtifactStore, run_id: str) -> RecordedChanges:
    """The change set of run ``run_id``, verified; ConfigError saying what is wrong.

    The change set is found through the record's :data:`RECORD_FIELD`, which the host wrote
    from its own computation, never through the artifacts' names: the program chooses the
    names of the files it exports, and could export its own ``changes.json``."""
    entry = audit.get(run_id)
    if entry is None:
        raise ConfigError(f"no run {run_id!r} in the audit log; see sandcell audit list")
    record = entry.record
    named = record.get(RECORD_FIELD)
    if not isinstance(named, Mapping):
        rejected = record.get("rejected_exports")
        why = [
            str(r.get("reason"))
            for r in (rejected if isinstance(rejected, list) else [])
            if isinstance(r, Mapping) and r.get("path") == PATCH
        ]
        detail = f": {why[0]}" if why else " (was it run with --workdir-from DIR --export-diff?)"
        raise ConfigError(f"run {run_id} has no change set{detail}")
    hashes: dict[str, str] = {}
    for key in ("changeset_sha256", "patch_sha256", "contents_sha256", "manifest_sha256"):
        value = named.get(key)
        if not isinstance(value, str) or len(value) != 64:
            raise ConfigError(f"run {run_id}'s record names no {key}; the change set is refused")
        hashes[key] = value
    cj = _verified(store, hashes["changeset_sha256"], CHANGESET, run_id)
    try:
        body = json.loads(cj)
    except ValueError:
        raise ConfigError(f"run {run_id}'s {CHANGESET} does not parse; refused") from None
    if not isinstance(body, dict):
        raise ConfigError(f"run {run_id}'s {CHANGESET} is not an object; refused")
    patch = _verified(store, hashes["patch_sha256"], PATCH, run_id)
    contents = _verified(store, hashes["contents_sha256"], CONTENTS, run_id)
    manifest_bytes = _verified(store, hashes["manifest_sha256"], MANIFEST, run_id)
    links = {
        "patch_sha256": hashes["patch_sha256"],
        "contents_sha256": hashes["contents_sha256"],
        "manifest_artifact_sha256": hashes["manifest_sha256"],
    }
    for key, sha in links.items():
        if body.get(key) != sha:
            raise ConfigError(f"run {run_id}'s changes.json names another {key}; it is refused")
    manifest = Manifest.from_json(manifest_bytes)
    if manifest.sha256 != body.get("base_manifest_sha256"):
        raise ConfigError(f"run {run_id}'s manifest does not match its change set; refused")
    workdir = record.get("workdir")
    if not isinstance(workdir, Mapping) or workdir.get("manifest_sha256") != manifest.sha256:
        raise ConfigError(
            f"run {run_id}'s change set was not made against the snapshot its record names; refused"
        )
    return RecordedChanges(
        run_id=run_id,
        record=record,
        changeset_sha256=hashes["changeset_sha256"],
        body=body,
        changes=tuple(Change.from_dict(c) for c in body.get("changes", [])),
        patch=patch,
        contents=contents,
        manifest=manifest,
    )
