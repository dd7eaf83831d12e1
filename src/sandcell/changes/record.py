"""A run's change set as its record names it, every artifact checked against its hash.

The run record (hash-chained in the audit log) lists the change-set artifacts with their
SHA-256; the artifact store holds the bytes. A stored file whose bytes no longer hash to what the
record says was tampered with (or damaged), and is refused: nothing shows or applies it.
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
from sandcell.changes.workdir import CHANGESET, CONTENTS, MANIFEST, PATCH
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
    """The change set of run ``run_id``, verified; ConfigError saying what is wrong."""
    entry = audit.get(run_id)
    if entry is None:
        raise ConfigError(f"no run {run_id!r} in the audit log; see sandcell audit list")
    record = entry.record
    raw = record.get("artifacts")
    artifacts = {
        str(a.get("path")): str(a.get("sha256"))
        for a in (raw if isinstance(raw, list) else [])
        if isinstance(a, Mapping)
    }
    if CHANGESET not in artifacts:
        rejected = record.get("rejected_exports")
        why = [
            str(r.get("reason"))
            for r in (rejected if isinstance(rejected, list) else [])
            if isinstance(r, Mapping) and r.get("path") == PATCH
        ]
        detail = f": {why[0]}" if why else " (was it run with --workdir-from DIR --export-diff?)"
        raise ConfigError(f"run {run_id} has no change set{detail}")
    for name in (PATCH, CONTENTS, MANIFEST):
        if name not in artifacts:
            raise ConfigError(f"run {run_id}'s record lacks its {name}; the change set is refused")
    cj = _verified(store, artifacts[CHANGESET], CHANGESET, run_id)
    body = json.loads(cj)
    patch = _verified(store, artifacts[PATCH], PATCH, run_id)
    contents = _verified(store, artifacts[CONTENTS], CONTENTS, run_id)
    manifest_bytes = _verified(store, artifacts[MANIFEST], MANIFEST, run_id)
    links = {
        "patch_sha256": artifacts[PATCH],
        "contents_sha256": artifacts[CONTENTS],
        "manifest_artifact_sha256": artifacts[MANIFEST],
    }
    for key, sha in links.items():
        if body.get(key) != sha:
            raise ConfigError(f"run {run_id}'s changes.json names another {key}; it is refused")
    manifest = Manifest.from_json(manifest_bytes)
    if manifest.sha256 != body.get("base_manifest_sha256"):
        raise ConfigError(f"run {run_id}'s manifest does not match its change set; refused")
    return RecordedChanges(
        run_id=run_id,
        record=record,
        changeset_sha256=artifacts[CHANGESET],
        body=body,
        changes=tuple(Change.from_dict(c) for c in body.get("changes", [])),
        patch=patch,
        contents=contents,
        manifest=manifest,
    )
