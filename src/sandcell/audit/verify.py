"""What :meth:`sandcell.audit.AuditLog.verify` makes of a chain: every problem, classified.

The approach: first give every row its *original* position. A row whose hash verifies at its
current ``seq`` is where it was written. A row whose hash does not is either edited
(``changed``) or intact but moved (``reordered``); which one is decided by finding the position
its links say it was written at (one after the row its ``prev_hash`` names, one before the row
that names its hash, or the head's count if the head names it) and checking whether its hash
verifies there. Since ``seq`` is hashed, only the true original position can verify. Then
positions nobody holds are ``deleted``, and links between neighbouring positions that do not
match reveal rewritten hashes (``changed``) or rows re-hashed into another order
(``reordered``). Every row with any inconsistency gets at least one problem, so an empty result
means the chain is exactly what sandcell wrote (or a full consistent rewrite).

Pure: it works on rows already read from the database (in one snapshot) and writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sandcell.audit.chain import GENESIS_HASH, chain_hash

__all__ = ["ProblemKind", "VerifyProblem", "VerifyReport", "verify_rows"]

ProblemKind = Literal["changed", "deleted", "reordered"]


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyProblem:
    """One inconsistency :meth:`AuditLog.verify` found."""

    seq: int
    """The entry concerned: the row's current ``seq``, the first missing ``seq`` for ``deleted``,
    or 0 for a problem with the head row itself."""
    run_id: str | None
    """The run concerned, or ``None`` when its row is gone (``deleted``)."""
    kind: ProblemKind
    detail: str
    """One sentence for a human, naming the run(s) and what was found."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyReport:
    """Result of :meth:`AuditLog.verify`."""

    ok: bool
    """True when every entry verifies, the chain is unbroken and the head matches."""
    count: int
    """Entries present in the log."""
    problems: tuple[VerifyProblem, ...]
    """Ordered by ``seq``; empty when ``ok``."""


def verify_rows(rows: Sequence[Sequence[Any]], heads: Sequence[Sequence[Any]]) -> VerifyReport:
    """Check ``rows`` (``seq, run_id, record, prev_hash, hash``, ordered by ``seq``) against
    each other and against ``heads`` (the ``count, hash`` rows of the head table, read in the
    same snapshot; exactly one when nothing was tampered with)."""
    chain = [
        _Row(
            seq=int(r[0]),
            run_id=str(r[1]),
            record=str(r[2]),
            prev_hash=str(r[3]),
            hash=str(r[4]),
        )
        for r in rows
    ]
    head = (int(heads[0][0]), str(heads[0][1])) if len(heads) == 1 else None
    problems = _Verifier(chain, head, head_rows=len(heads)).run()
    return VerifyReport(ok=not problems, count=len(chain), problems=tuple(problems))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Row:
    seq: int
    run_id: str
    record: str
    prev_hash: str
    hash: str


class _Verifier:
    """Classifies what is wrong with a chain (see the module docstring); one instance per
    :meth:`AuditLog.verify`."""

    def __init__(self, rows: list[_Row], head: tuple[int, str] | None, *, head_rows: int) -> None:
        self.rows = rows
        self.head = head
        self.head_rows = head_rows
        self.by_hash: dict[str, int] = {}
        self.by_prev: dict[str, int] = {}
        for i, r in enumerate(rows):
            # setdefault: duplicated hashes only come from tampering; the first one wins and the
            # duplicate shows up as changed.
            self.by_hash.setdefault(r.hash, i)
            self.by_prev.setdefault(r.prev_hash, i)
        self.position: dict[int, int] = {}  # row index -> original seq
        self.flagged: dict[int, VerifyProblem] = {}  # row index -> its (first) problem
        self.extra: list[VerifyProblem] = []  # problems about rows that are gone
        self.unplaced: list[int] = []  # rows whose hash does not verify where they stand

    def run(self) -> list[VerifyProblem]:
        self._check_rows()
        self._place_moved_rows()
        holder = self._positions()
        self._check_gaps_and_head(holder)
        self._check_links(holder)
        problems = [*self.flagged.values(), *self.extra]
        problems.sort(key=lambda p: (p.seq, p.kind))
        return problems

    # Row by row: does the record parse, match its run_id column, and verify where it stands?
    def _check_rows(self) -> None:
        for i, r in enumerate(self.rows):
            try:
                parsed = json.loads(r.record)
            except json.JSONDecodeError:
                self.position[i] = r.seq
                self._flag(
                    i, "changed", f"run {r.run_id} (seq {r.seq}): the stored record is not JSON"
                )
                continue
            record_run_id = parsed.get("run_id") if isinstance(parsed, dict) else None
            if record_run_id != r.run_id:
                self.position[i] = r.seq
                self._flag(
                    i,
                    "changed",
                    f"run {r.run_id} (seq {r.seq}): the run_id column does not match the record, "
                    f"which names run {record_run_id}",
                )
                continue
            if chain_hash(r.seq, r.prev_hash, r.record) == r.hash:
                self.position[i] = r.seq
            else:
                self.unplaced.append(i)

    def _candidates(self, i: int) -> list[int]:
        """Original positions the links of row ``i`` point to, from neighbours already placed."""
        r = self.rows[i]
        found: list[int] = []
        if r.prev_hash == GENESIS_HASH:
            found.append(1)
        else:
            pred = self.by_hash.get(r.prev_hash)
            if pred is not None and pred != i and pred in self.position:
                found.append(self.position[pred] + 1)
        succ = self.by_prev.get(r.hash)
        if succ is not None and succ != i and succ in self.position:
            found.append(self.position[succ] - 1)
        if self.head is not None and self.head[1] == r.hash:
            found.append(self.head[0])
        return found

    # Rows that do not verify where they stand: moved (verify at the position their links give)
    # or changed. Worked through like a flood fill, because a moved row may only be placeable once
    # its neighbour is (e.g. a run of renumbered rows anchored only by the head).
    def _place_moved_rows(self) -> None:
        pending = set(self.unplaced)
        queue = list(self.unplaced)
        while queue:
            i = queue.pop()
            if i not in pending:
                continue
            candidates = self._candidates(i)
            if not candidates:
                continue  # retried when a neighbour gets placed
            pending.discard(i)
            r = self.rows[i]
            verified = (c for c in candidates if c != r.seq and self._verifies_at(c, r))
            original = next(verified, None)
            if original is None:
                self.position[i] = r.seq
                self._flag(
                    i,
                    "changed",
                    f"run {r.run_id} (seq {r.seq}): the stored record no longer matches its hash; "
                    "it was edited after it was written",
                )
                # A changed row keeps its stored hash, so its neighbours can still be placed by it.
            else:
                self.position[i] = original
                self._flag(
                    i,
                    "reordered",
                    f"run {r.run_id} is stored at seq {r.seq} but was written at seq {original}: "
                    "it was moved or renumbered",
                )
            for neighbour in (self.by_hash.get(r.prev_hash), self.by_prev.get(r.hash)):
                if neighbour is not None and neighbour in pending:
                    queue.append(neighbour)
        for i in sorted(pending):  # no placed neighbour at all: cannot tell moved from edited
            r = self.rows[i]
            self.position[i] = r.seq
            self._flag(
                i,
                "changed",
                f"run {r.run_id} (seq {r.seq}): the stored record no longer matches its hash, and "
                "neither neighbour is intact to tell whether it was moved or edited",
            )

    def _positions(self) -> dict[int, int]:
        """Original seq -> row index; a second row claiming a position is flagged as changed."""
        holder: dict[int, int] = {}
        for i in sorted(self.position, key=lambda j: (j in self.flagged, self.rows[j].seq)):
            pos = self.position[i]
            if pos in holder:
                r, other = self.rows[i], self.rows[holder[pos]]
                self._flag(
                    i,
                    "changed",
                    f"run {r.run_id} (seq {r.seq}) claims position {pos}, which run {other.run_id} "
                    "holds: one of them was forged",
                )
            else:
                holder[pos] = i
        return holder

    # Positions between 1 and the head's count that no row holds were deleted; rows past the head
    # were added outside sandcell; the head must name the hash of the newest row.
    def _check_gaps_and_head(self, holder: dict[int, int]) -> None:
        if self.head is None:
            self.extra.append(
                VerifyProblem(
                    seq=0,
                    run_id=None,
                    kind="deleted",
                    detail=(
                        "the head row is missing"
                        if self.head_rows == 0
                        else f"the head table has {self.head_rows} rows instead of one"
                    )
                    + ", so entries deleted from the end of the log cannot be detected",
                )
            )
        last = max(holder, default=0)
        expected = self.head[0] if self.head is not None else last
        start: int | None = None
        for pos in range(1, max(last, expected) + 2):
            if pos not in holder and pos <= expected:
                if start is None:
                    start = pos
            elif start is not None:
                self.extra.append(self._gap(start, pos - 1, holder))
                start = None
        for pos in sorted(p for p in holder if p < 1):
            r = self.rows[holder[pos]]
            self._flag(
                holder[pos],
                "changed",
                f"run {r.run_id} (seq {r.seq}) sits before the first entry: it was added outside "
                "sandcell",
            )
        if self.head is None:
            return
        count, head_hash = self.head
        for pos in sorted(p for p in holder if p > count):
            i = holder[pos]
            r = self.rows[i]
            self._flag(
                i,
                "changed",
                f"run {r.run_id} (seq {r.seq}) is past the head, which records {count} entries: "
                "it was added outside sandcell",
            )
        if count in holder and self.rows[holder[count]].hash != head_hash:
            r = self.rows[holder[count]]
            self._flag(
                holder[count],
                "changed",
                f"run {r.run_id} (seq {r.seq}) is the newest entry but its hash is not the one the "
                "head recorded: it was rewritten and its hash recomputed",
            )
        if count == 0 and head_hash != GENESIS_HASH:
            self.extra.append(
                VerifyProblem(
                    seq=0,
                    run_id=None,
                    kind="changed",
                    detail="the head of an empty log names a hash",
                )
            )

    def _gap(self, first: int, last: int, holder: dict[int, int]) -> VerifyProblem:
        n = last - first + 1
        what = (
            f"the entry at seq {first} was"
            if n == 1
            else f"the {n} entries at seq {first} to {last} were"
        )
        before = self.rows[holder[first - 1]] if first - 1 in holder else None
        after = self.rows[holder[last + 1]] if last + 1 in holder else None
        if before is not None and after is not None:
            where = (
                f"between run {before.run_id} (seq {first - 1}) and run {after.run_id} "
                f"(seq {last + 1}), which links to a hash no remaining entry has"
            )
        elif after is not None:
            where = f"before run {after.run_id} (seq {last + 1}), the oldest remaining entry"
        elif before is not None:
            where = (
                f"after run {before.run_id} (seq {first - 1}): the head records "
                f"{self.head[0] if self.head else '?'} entries"
            )
        else:
            where = "and no entry around it remains"
        return VerifyProblem(
            seq=first, run_id=None, kind="deleted", detail=f"{what} deleted {where}"
        )

    # Each placed row must link to the hash of the row at the position before it.
    def _check_links(self, holder: dict[int, int]) -> None:
        for pos in sorted(holder):
            i = holder[pos]
            if i in self.flagged:
                continue  # already reported; its link is as suspect as its content
            r = self.rows[i]
            if pos == 1:
                if r.prev_hash != GENESIS_HASH:
                    self._link_problem(i, pos, None)
                continue
            if pos - 1 not in holder:
                continue  # the gap is reported as deleted
            before = holder[pos - 1]
            if r.prev_hash != self.rows[before].hash:
                self._link_problem(i, pos, before)

    def _link_problem(self, i: int, pos: int, before: int | None) -> None:
        r = self.rows[i]
        target = self.by_hash.get(r.prev_hash)
        if r.prev_hash == GENESIS_HASH or (target is not None and target != before):
            after = "the start of the log" if target is None else f"run {self.rows[target].run_id}"
            self._flag(
                i,
                "reordered",
                f"run {r.run_id} (seq {r.seq}) was written after {after}, not after the entry now "
                "before it: entries were moved and re-hashed",
            )
        elif before is None:
            self._flag(
                i,
                "changed",
                f"run {r.run_id} (seq 1) does not link to the start of the log: it was rewritten "
                "and its hash recomputed",
            )
        else:
            # The row before no longer has the hash this one was chained to, and no row has it:
            # the row before was rewritten with a recomputed hash (or this row's link was).
            b = self.rows[before]
            problem = VerifyProblem(
                seq=b.seq,
                run_id=b.run_id,
                kind="changed",
                detail=(
                    f"run {b.run_id} (seq {b.seq}) no longer has the hash that run {r.run_id} "
                    f"(seq {r.seq}) was chained to: one of them was rewritten and its hash "
                    "recomputed"
                ),
            )
            if before in self.flagged:
                return
            self.flagged[before] = problem

    @staticmethod
    def _verifies_at(seq: int, r: _Row) -> bool:
        return chain_hash(seq, r.prev_hash, r.record) == r.hash

    def _flag(self, i: int, kind: ProblemKind, detail: str) -> None:
        if i not in self.flagged:
            r = self.rows[i]
            self.flagged[i] = VerifyProblem(seq=r.seq, run_id=r.run_id, kind=kind, detail=detail)
