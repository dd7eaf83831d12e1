"""What a result says of its runtime is read from the same values as the record's."""

from __future__ import annotations

from sandcell.runtimes import runtime_for
from sandcell.runtimes.ref import ref_from_record, runtime_record, runtime_ref
from sandcell.spec import RuntimeRef


def test_sandcells_own_environment_is_named_by_none() -> None:
    own = runtime_for("python", None)
    assert runtime_ref(own, None) is None and runtime_ref(own, "default") is None
    assert "tree_sha256" not in runtime_record(own, None)


def test_a_record_names_the_built_runtime_the_result_names() -> None:
    record = {
        "name": "datascience",
        "identity": "CPython ...",
        "sha256": "e" * 64,
        "selected": "datascience",
        "tree_sha256": "c" * 64,
        "lock_sha256": "d" * 64,
    }
    assert ref_from_record(record) == RuntimeRef(
        name="datascience", tree_sha256="c" * 64, lock_sha256="d" * 64
    )
    # Records of other shapes (sandcell's own environment, or not a mapping) name none.
    assert ref_from_record({"name": "python", "identity": "x", "sha256": "e" * 64}) is None
    assert ref_from_record("datascience") is None and ref_from_record(None) is None
