"""Two run records side by side: what came out the same and what did not.

Compared: the outcome, the exit status and signal, stdout and stderr (by the sha256 of the raw
bytes; a short unified diff of the recorded text when they differ), the exported artifacts (by
path and sha256) and the rich outputs of a ``--display`` run (kind, text forms, images). Shown
for context, not counted as a difference of the result: the runtime, the backend and the inputs.
Nothing is left out because it is expected to differ (random seeds, the time): a program that
prints the time is reported as differing. For ``--workdir-from`` runs the change set is compared
too: the tree each started from and its patch (by sha256).
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from sandcell.audit.chain import canonical_json

MAX_DIFF_LINES = 20
"""Lines of a stdout or stderr diff shown; the rest is counted."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldCheck:
    """One compared field."""

    field: str
    matched: bool
    original: str
    replay: str
    diff: tuple[str, ...] = ()
    """For stdout and stderr that differ: a unified diff, at most :data:`MAX_DIFF_LINES` lines."""

    def to_dict(self) -> dict[str, object]:
        return {
            "field": self.field,
            "matched": self.matched,
            "original": self.original,
            "replay": self.replay,
            "diff": list(self.diff),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """The result fields of two records compared, and the context they ran in."""

    checks: tuple[FieldCheck, ...]
    context: tuple[FieldCheck, ...]

    @property
    def matched(self) -> bool:
        """Whether every result field is the same."""
        return all(c.matched for c in self.checks)

    @property
    def differing(self) -> tuple[str, ...]:
        return tuple(c.field for c in self.checks if not c.matched)

    def to_dict(self) -> dict[str, object]:
        return {
            "matched": self.matched,
            "differing": list(self.differing),
            "checks": [c.to_dict() for c in self.checks],
            "context": [c.to_dict() for c in self.context],
        }


def compare_records(original: Mapping[str, object], replay: Mapping[str, object]) -> Comparison:
    """Compare ``replay``'s record with ``original``'s (see the module docstring)."""
    workdir = "workdir" in original or "workdir" in replay
    checks = (
        _plain("outcome", original, replay),
        _plain("exit_code", original, replay),
        _plain("signal", original, replay),
        _stream("stdout", original, replay),
        _stream("stderr", original, replay),
        _artifacts(original, replay),
        _outputs(original, replay),
        *((_changes(original, replay),) if workdir else ()),
    )
    context = (
        _nested("runtime", "sha256", original, replay),
        _nested("backend", "name", original, replay),
        _inputs(original, replay),
    )
    return Comparison(checks=checks, context=context)


def _plain(name: str, a: Mapping[str, object], b: Mapping[str, object]) -> FieldCheck:
    va, vb = a.get(name), b.get(name)
    return FieldCheck(field=name, matched=va == vb, original=str(va), replay=str(vb))


def _nested(name: str, key: str, a: Mapping[str, object], b: Mapping[str, object]) -> FieldCheck:
    def get(record: Mapping[str, object]) -> str:
        section = record.get(name)
        return str(section.get(key)) if isinstance(section, Mapping) else "None"

    va, vb = get(a), get(b)
    return FieldCheck(field=f"{name}.{key}", matched=va == vb, original=va, replay=vb)


def _stream(name: str, a: Mapping[str, object], b: Mapping[str, object]) -> FieldCheck:
    ha, hb = a.get(f"{name}_sha256"), b.get(f"{name}_sha256")
    ta, tb = str(a.get(name) or ""), str(b.get(name) or "")
    summary_a = f"{len(ta.encode())} bytes, sha256 {str(ha)[:12]}"
    summary_b = f"{len(tb.encode())} bytes, sha256 {str(hb)[:12]}"
    if ha == hb:
        return FieldCheck(field=name, matched=True, original=summary_a, replay=summary_b)
    lines = list(
        difflib.unified_diff(
            ta.splitlines(),
            tb.splitlines(),
            fromfile=f"original {name}",
            tofile=f"replay {name}",
            lineterm="",
        )
    )
    if not lines:
        # Same text, other bytes: what differs is not in the recorded text (redacted, or
        # invalid UTF-8 replaced, or only the trailing newline).
        lines = ["(the recorded text is the same; the raw bytes differ)"]
    if len(lines) > MAX_DIFF_LINES:
        lines = [*lines[:MAX_DIFF_LINES], f"... {len(lines) - MAX_DIFF_LINES} more diff lines"]
    return FieldCheck(
        field=name, matched=False, original=summary_a, replay=summary_b, diff=tuple(lines)
    )


def _artifact_map(record: Mapping[str, object]) -> dict[str, str]:
    items = record.get("artifacts")
    if not isinstance(items, list):
        return {}
    return {str(i.get("path")): str(i.get("sha256")) for i in items if isinstance(i, Mapping)}


def _changes(a: Mapping[str, object], b: Mapping[str, object]) -> FieldCheck:
    """The change sets of two ``--workdir-from`` runs, by the sha256 of their patches (which
    name every path, mode, link target and content hash), and the trees they started from."""

    def named(record: Mapping[str, object]) -> tuple[str, str]:
        changes, workdir = record.get("workdir_changes"), record.get("workdir")
        patch = changes.get("patch_sha256") if isinstance(changes, Mapping) else None
        tree = workdir.get("manifest_sha256") if isinstance(workdir, Mapping) else None
        return (
            "no change set" if patch is None else f"patch sha256 {str(patch)[:12]}",
            "no working directory" if tree is None else f"tree sha256 {str(tree)[:12]}",
        )

    (pa, ta), (pb, tb) = named(a), named(b)
    diff = [f"{what}: original {x}, replay {y}" for what, x, y in (("tree", ta, tb),) if x != y]
    diff += [f"patch: original {pa}, replay {pb}"] if pa != pb else []
    return FieldCheck(
        field="changes",
        matched=not diff,
        original=f"{pa}; {ta}",
        replay=f"{pb}; {tb}",
        diff=tuple(diff),
    )


def _artifacts(a: Mapping[str, object], b: Mapping[str, object]) -> FieldCheck:
    ma, mb = _artifact_map(a), _artifact_map(b)
    diff = [f"only in the original: {p}" for p in sorted(ma.keys() - mb.keys())]
    diff += [f"only in the replay: {p}" for p in sorted(mb.keys() - ma.keys())]
    diff += [
        f"changed: {p} (sha256 {ma[p][:12]} -> {mb[p][:12]})"
        for p in sorted(ma.keys() & mb.keys())
        if ma[p] != mb[p]
    ]
    return FieldCheck(
        field="artifacts",
        matched=not diff,
        original=f"{len(ma)} file(s)",
        replay=f"{len(mb)} file(s)",
        diff=tuple(diff[:MAX_DIFF_LINES]),
    )


def _outputs(a: Mapping[str, object], b: Mapping[str, object]) -> FieldCheck:
    """Rich outputs (``--display``): their kinds, text forms and stored images, in order."""

    def shown(record: Mapping[str, object]) -> list[str]:
        items = record.get("outputs")
        if not isinstance(items, list):
            return []
        out = []
        for o in items:
            if not isinstance(o, Mapping):
                continue
            found = o.get("artifacts")
            files = found if isinstance(found, list) else []
            digests = [str(f.get("sha256"))[:12] for f in files if isinstance(f, Mapping)]
            data = o.get("data")
            text = canonical_json(data if isinstance(data, Mapping) else {})
            digest = hashlib.sha256(text.encode()).hexdigest()[:12]
            out.append(f"{o.get('kind')} {digest} {digests}")
        return out

    va, vb = shown(a), shown(b)
    diff = [
        f"#{i}: original {x}, replay {y}"
        for i, (x, y) in enumerate(zip(va, vb, strict=False))
        if x != y
    ]
    if len(va) != len(vb):
        diff.append(f"original has {len(va)} output(s), replay {len(vb)}")
    return FieldCheck(
        field="outputs",
        matched=va == vb,
        original=f"{len(va)} output(s)",
        replay=f"{len(vb)} output(s)",
        diff=tuple(diff[:MAX_DIFF_LINES]),
    )


def _inputs(a: Mapping[str, object], b: Mapping[str, object]) -> FieldCheck:
    def hashes(record: Mapping[str, object]) -> str:
        items = record.get("inputs")
        if not isinstance(items, list):
            return ""
        return ", ".join(
            f"{i.get('name')}={str(i.get('sha256'))[:12]}" for i in items if isinstance(i, Mapping)
        )

    va, vb = hashes(a), hashes(b)
    return FieldCheck(field="inputs", matched=va == vb, original=va or "none", replay=vb or "none")
