"""Task files: one JSON object per line, validated with pydantic at the edge, then frozen.

A line::

    {"id": "sum-1", "code": "print(sum(map(int, input().split())))", "stdin": "1 2\\n",
     "expected_stdout": "3"}

Fields: ``id`` (required, unique; a string or an integer), ``code`` (required), ``language``
(``python``, ``bash``, ``javascript`` or ``typescript``, or a short name such as ``js``, ``ts``;
default ``python``), ``inputs`` (paths, relative to the tasks file's
directory, made visible read-only as with ``sandcell run --input``), ``stdin`` (text),
``expected_stdout``, ``compare`` (``strip``, the default: trailing whitespace of each line and
blank lines at the start and end are ignored; ``exact``: the text must be identical), ``test``
(Python code run after the program in the same run, e.g. HumanEval's ``check(candidate)``, which
calls the program's functions from a process of its own; see :mod:`sandcell.batch.judge`; a task
in another language cannot have one), ``limits`` (:class:`~sandcell.spec.Limits` field names, e.g.
``{"wall_time_s": 5, "memory_bytes": 268435456}``) and ``exports`` (globs, as ``--export``).

Everything is checked before anything runs, against the profile the batch runs under (language,
inputs, exports, limits below its ceilings); every error names its line number and field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sandcell.errors import ConfigError
from sandcell.inputs import check_input_path
from sandcell.spec import InputFile, IsolationMode, RunRequest, input_from_path, language_named

if TYPE_CHECKING:
    from sandcell.policy.profiles import Profile

Compare = Literal["exact", "strip"]

_MAX_ERRORS_SHOWN = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    """One validated task of a batch."""

    id: str
    line: int
    """Line number in the tasks file, from 1."""
    request: RunRequest
    """The program alone; the runner puts it and ``test`` under the judge's harness."""
    expected_stdout: str | None = None
    compare: Compare = "strip"
    test: str | None = None
    sha256: str
    """Hash of the line's content: a result recorded for another version of the task is stale."""


def _task_model() -> type[object]:
    """The pydantic model of one line, built on first use: pydantic loads only for a batch."""
    try:
        from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr
    except ImportError as exc:  # pragma: no cover - pydantic is in the test environment
        raise ConfigError(
            "sandcell batch validates task lines with pydantic, which is not installed; "
            "install it: pip install 'sandcell[pydantic]'"
        ) from exc

    class TaskLine(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

        id: StrictStr | StrictInt = Field(union_mode="left_to_right")
        code: str
        language: str = "python"
        inputs: list[str] = Field(default_factory=list)
        stdin: str = ""
        expected_stdout: str | None = None
        compare: Compare = "strip"
        test: str | None = None
        limits: dict[str, StrictInt | float] = Field(default_factory=dict)
        exports: list[str] = Field(default_factory=list)

    return TaskLine


def load_tasks(
    path: Path,
    profile: Profile,
    *,
    default_limits: Mapping[str, float | None] | None = None,
    mode: IsolationMode = IsolationMode.STRICT,
) -> list[Task]:
    """Read and check every line of ``path``; raise one ConfigError listing every bad line.

    ``default_limits`` apply to a task that does not set that limit itself (``--timeout``).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"tasks file {str(path)!r} does not exist") from None
    except UnicodeDecodeError:
        raise ConfigError(f"tasks file {str(path)!r} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"cannot read tasks file {str(path)!r}: {exc.strerror}") from None
    ctx = _Context(
        model=_task_model(),
        base=path.resolve().parent,
        profile=profile,
        default_limits=default_limits or {},
        mode=mode,
    )
    tasks: list[Task] = []
    errors: list[str] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            task = _parse_line(raw, number, ctx)
        except ConfigError as exc:
            errors.append(str(exc))
            continue
        if task.id in first_line:
            errors.append(
                f"line {number}: field 'id': {task.id!r} is also the id of line "
                f"{first_line[task.id]}; ids must be unique"
            )
            continue
        first_line[task.id] = number
        tasks.append(task)
    if errors:
        shown = errors[:_MAX_ERRORS_SHOWN]
        more = len(errors) - len(shown)
        raise ConfigError(
            f"tasks file {str(path)!r} has {len(errors)} bad line(s); nothing was run:\n  "
            + "\n  ".join(shown)
            + (f"\n  ... and {more} more" if more else "")
        )
    if not tasks:
        raise ConfigError(f"tasks file {str(path)!r} has no tasks; write one JSON object a line")
    return tasks


@dataclass(frozen=True, slots=True, kw_only=True)
class _Context:
    """What every line is checked against."""

    model: type[object]
    base: Path
    """The tasks file's directory: relative input paths start here."""
    profile: Profile
    default_limits: Mapping[str, float | None]
    mode: IsolationMode


def _parse_line(raw: str, number: int, ctx: _Context) -> Task:
    from pydantic import BaseModel, ValidationError

    model, base, profile = ctx.model, ctx.base, ctx.profile
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"line {number}: not valid JSON: {exc.msg} (column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"line {number}: a task is a JSON object, got {type(data).__name__}")
    try:
        line = model.model_validate(data)  # type: ignore[attr-defined]
    except ValidationError as exc:
        raise ConfigError(f"line {number}: " + _pydantic_errors(exc)) from None
    assert isinstance(line, BaseModel)
    fields = line.model_dump()
    task_id = str(fields["id"])
    if not task_id.strip():
        raise ConfigError(f"line {number}: field 'id': must not be empty")

    def bad(field: str, why: str) -> ConfigError:
        return ConfigError(f"line {number}: field {field!r}: {why}")

    try:
        language = language_named(fields["language"])
    except ConfigError as exc:
        raise bad("language", str(exc)) from None
    if not profile.allows_language(language):
        raise bad("language", f"profile {profile.name!r} does not allow {language} programs")
    if fields["test"] is not None and not fields["test"].strip():
        raise bad("test", "is empty; leave it out, or give the test code")
    if fields["test"] is not None and language != "python":
        raise bad(
            "test",
            f"a {language} task cannot have a test: it would run in the program's own "
            "interpreter, where the program can fake its outcome; compare its output with "
            "expected_stdout",
        )
    inputs: list[InputFile] = []
    for item in fields["inputs"]:
        try:
            given = input_from_path(base / item)
            # Refused here, with the line, rather than when the task's turn comes.
            check_input_path(given.host_path)
            inputs.append(given)
        except ConfigError as exc:
            raise bad("inputs", str(exc)) from None
    if not profile.allows_inputs(len(inputs)):
        raise bad(
            "inputs",
            f"profile {profile.name!r} allows at most {profile.filesystem.max_inputs} inputs, "
            f"the task has {len(inputs)}",
        )
    for glob in fields["exports"]:
        if not profile.allows_export(glob):
            raise bad("exports", f"profile {profile.name!r} does not allow exporting {glob!r}")
    try:
        limits = profile.limits_for({**ctx.default_limits, **fields["limits"]})
    except ConfigError as exc:
        raise bad("limits", str(exc)) from None
    try:
        request = RunRequest(
            code=fields["code"],
            language=language,
            inputs=tuple(inputs),
            exports=tuple(fields["exports"]),
            limits=limits,
            stdin=fields["stdin"].encode("utf-8"),
            mode=ctx.mode,
        )
    except ConfigError as exc:
        raise ConfigError(f"line {number}: {exc}") from None
    canonical = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return Task(
        id=task_id,
        line=number,
        request=request,
        expected_stdout=fields["expected_stdout"],
        compare=fields["compare"],
        test=fields["test"],
        sha256=hashlib.sha256(canonical.encode()).hexdigest(),
    )


_UNION_KINDS = {"str": "a string", "int": "an integer", "float": "a number"}


def _pydantic_errors(exc: object) -> str:
    from pydantic import ValidationError

    assert isinstance(exc, ValidationError)
    kinds: dict[str, list[str]] = {}
    messages: dict[str, list[str]] = {}
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        # A union reports once per member ('id.str', 'id.int'): one line per field instead.
        kind = _UNION_KINDS.get(loc[-1]) if len(loc) > 1 else None
        if kind is not None:
            loc.pop()
        name = ".".join(loc) or "?"
        if kind is not None:
            kinds.setdefault(name, []).append(kind)
            continue
        msg = "unknown field; remove it" if err["type"] == "extra_forbidden" else err["msg"]
        messages.setdefault(name, []).append(msg)
    parts = [f"field {n!r}: must be " + " or ".join(k) for n, k in kinds.items()]
    parts += [f"field {n!r}: " + "; ".join(m) for n, m in messages.items()]
    return "; ".join(parts)


__all__ = ["Compare", "Task", "load_tasks"]
