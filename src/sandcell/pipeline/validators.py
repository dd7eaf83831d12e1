"""What a run's declared result is checked against, and how the result is found among its files.

Prepared before the run (:func:`sandcell.pipeline.prepare.prepare`), so that a bad schema or
invariant is refused before anything runs; read after it (:func:`sandcell.pipeline.finish.finish`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandcell.artifacts.store import ArtifactStore
from sandcell.backends.base import BackendResult
from sandcell.policy.gate import Admission
from sandcell.spec import Artifact
from sandcell.validation import InvariantLike, default_checks, parse_invariant

if TYPE_CHECKING:
    import pydantic


@dataclass(frozen=True, slots=True, kw_only=True)
class Validators:
    """The declared result of one run: a JSON Schema (the caller's, else the profile's), a
    pydantic model, invariants (textual ones parsed) and the file it is read from (None: the
    last JSON line of stdout)."""

    schema: Mapping[str, object] | None
    model: type[pydantic.BaseModel] | None
    invariants: Sequence[InvariantLike]
    result_file: str | None

    @property
    def declared(self) -> bool:
        """Whether the run has a result to validate at all."""
        return bool(self.schema or self.model or self.invariants or self.result_file)

    @classmethod
    def make(
        cls,
        admission: Admission,
        *,
        schema: Mapping[str, object] | None,
        model: type[pydantic.BaseModel] | None,
        invariants: Sequence[InvariantLike],
    ) -> Validators:
        """The validators of the admitted run; ConfigError for a bad schema or invariant."""
        schema = schema if schema is not None else admission.profile.validation.result_schema
        if schema is not None:
            # In a confined worker: the schema is the requester's, and checking a large one
            # would hold the service's interpreter lock for seconds.
            default_checks().check_schema(schema)
        parsed = [parse_invariant(i) if isinstance(i, str) else i for i in invariants]
        return cls(schema=schema, model=model, invariants=parsed, result_file=admission.result_file)


def result_bytes(
    store: ArtifactStore, artifacts: Sequence[Artifact], result_file: str | None
) -> bytes | None:
    """The declared result file's bytes among the run's ``artifacts`` (None: no result file;
    empty: declared but not exported, which validation reports)."""
    if result_file is None:
        return None
    for a in artifacts:
        if a.path == result_file:
            return store.path_for(a.sha256).read_bytes()
    return b""


def missing_result(br: BackendResult, result_file: str | None) -> str | None:
    """Why the declared result file is not among the run's artifacts; None when it is (or when
    the result comes from stdout)."""
    if result_file is None or any(a.path == result_file for a in br.artifacts):
        return None
    for rejected in br.rejected_exports:
        if rejected.path == result_file:
            return f"the result file {result_file!r} was not exported: {rejected.reason}"
    return f"the result file {result_file!r} was not written by the program"
