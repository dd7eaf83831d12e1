"""The hash chain of the audit log: the one text form of a record and the hash that links it.

Each entry's hash covers its position, the hash of the entry before it and its canonical text::

    hash = sha256(f"{seq}\\n{prev_hash}\\n{canonical}")      # hex digest; GENESIS_HASH before seq 1

Pure functions: :mod:`sandcell.audit` computes hashes with them when it appends, and
:mod:`sandcell.audit.verify` recomputes them to find what was edited, moved or deleted.
Anyone can re-verify a log with these two functions and a SQLite reader.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

__all__ = ["GENESIS_HASH", "canonical_json", "chain_hash"]

GENESIS_HASH = "0" * 64
"""``prev_hash`` of the first entry."""


def canonical_json(record: Mapping[str, object]) -> str:
    """The one text form of ``record`` that is stored and hashed.

    Sorted keys and no insignificant whitespace, so equal records give equal text; non-ASCII is
    kept as is (UTF-8) rather than escaped, so what is hashed is what a reader sees.
    """
    # allow_nan=False: NaN and Infinity are not JSON, and other tools must be able to re-verify.
    return json.dumps(
        record, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def chain_hash(seq: int, prev_hash: str, canonical: str) -> str:
    """Hex sha256 of the entry at ``seq`` holding ``canonical``, chained after ``prev_hash``."""
    return hashlib.sha256(f"{seq}\n{prev_hash}\n{canonical}".encode()).hexdigest()
