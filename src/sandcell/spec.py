"""The values of the execution layer: what to run, under which limits, and what came out.

Everything here is a frozen dataclass: built once, checked once, passed around without copies.
Units are in the names (``_s``, ``_ms``, ``_bytes``).
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

from sandcell.errors import ConfigError

Language = Literal["python", "bash", "javascript", "typescript"]
LANGUAGES: tuple[Language, ...] = ("python", "bash", "javascript", "typescript")
NODE_LANGUAGES: frozenset[Language] = frozenset({"javascript", "typescript"})
"""The languages Node.js runs (the ``node`` runtime): TypeScript by Node's own type stripping."""
LANGUAGE_ALIASES: Mapping[str, Language] = {
    "python": "python",
    "py": "python",
    "bash": "bash",
    "sh": "bash",
    "shell": "bash",
    "javascript": "javascript",
    "js": "javascript",
    "node": "javascript",
    "typescript": "typescript",
    "ts": "typescript",
}
"""Every name a caller may give a language by (the CLI's ``--lang``, the service, MCP, E2B)."""
NODE_RESERVED_ENV = ("NODE_OPTIONS", "NODE_PATH", "NODE_REPL_EXTERNAL_MODULE", "NODE_DEBUG_NATIVE")
"""Variables that change how Node.js itself starts (flags, module search, native debugging): a
JavaScript or TypeScript run may not set them; its flags are the runtime's."""
NODE_MIN_PIDS = 16
"""The smallest ``max_pids`` of a JavaScript or TypeScript run: Node.js starts ten threads of its
own (V8's workers, libuv's pool), which count as processes; with fewer it aborts or hangs."""


def language_named(name: str) -> Language:
    """The language ``name`` stands for (``js`` is ``javascript``), or a :class:`ConfigError`
    that lists the names there are."""
    language = LANGUAGE_ALIASES.get(name.strip().lower())
    if language is None:
        raise ConfigError(
            f"unknown language {name!r}; choose one of {', '.join(LANGUAGES)} (or js, ts, sh)"
        )
    return language


DEFAULT_RUNTIME = "default"
"""The runtime that is the environment sandcell itself runs in (see :mod:`sandcell.runtimes`)."""

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Hard limits of one run, each enforced by the kernel, never by the code's good will."""

    wall_time_s: float = 30.0
    """Wall-clock limit; at the limit the whole process tree is killed (outcome ``timeout``)."""
    cpu_time_s: int = 60
    """CPU seconds per process (RLIMIT_CPU); exceeding it is reported as ``timeout``."""
    memory_bytes: int = 512 * MiB
    """Memory of the whole sandbox (cgroup), swap included; exceeding it gives ``memory_limit``."""
    max_pids: int = 64
    """Processes and threads alive at once in the sandbox (pids cgroup)."""
    max_open_files: int = 256
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    max_file_bytes: int = 128 * MiB
    """Largest file a process may write (RLIMIT_FSIZE)."""
    workspace_bytes: int = 256 * MiB
    """Size of the writable working directory (a tmpfs); a full workspace gives ENOSPC."""
    workspace_inodes: int = 16384
    """Files and directories the working directory may hold."""
    tmp_bytes: int = 64 * MiB
    """Size of the private ``/tmp``."""
    stdout_bytes: int = 1 * MiB
    """Captured stdout; more than this truncates the stream and ends the run (``output_limit``)."""
    stderr_bytes: int = 1 * MiB
    """Captured stderr, capped independently of stdout."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"limit {f.name} must be a number, got {value!r}")
            if not math.isfinite(value):
                # NaN compares false with everything: it would pass every check and ceiling.
                raise ConfigError(f"limit {f.name} must be a finite number, got {value!r}")
            if value <= 0:
                raise ConfigError(f"limit {f.name} must be positive, got {value!r}")
        if self.memory_bytes < 16 * MiB:
            raise ConfigError(
                f"limit memory_bytes={self.memory_bytes} is below 16 MiB, too small to start an "
                "interpreter; raise it"
            )
        if self.max_pids < 2:
            raise ConfigError(
                "limit max_pids must be at least 2 (the sandbox init and the program)"
            )

    def with_(self, **changes: float | int | None) -> Limits:
        """A copy with the given limits replaced; ``None`` values are ignored (no change at all
        gives this frozen, already checked instance back: every run without limits of its own
        asks for the defaults)."""
        given = {k: v for k, v in changes.items() if v is not None}
        if not given:
            return self
        return replace(self, **given)  # type: ignore[arg-type]


class IsolationMode(enum.Enum):
    """How limits are enforced: ``STRICT`` by default; a weaker mode only when asked for by name."""

    STRICT = "strict"
    """cgroups for memory, pids and CPU accounting; a host without them raises
    IsolationUnavailable."""
    RLIMITS = "rlimits"
    """Weaker, for users without cgroup delegation: memory by RLIMIT_AS, processes by RLIMIT_NPROC
    (counted in the sandbox's user namespace), no whole-tree memory accounting. Recorded in
    every run record."""


@dataclass(frozen=True, slots=True, kw_only=True)
class InputFile:
    """A host file or directory made visible read-only inside the sandbox under ``/inputs``."""

    host_path: Path
    """Absolute path on the host."""
    name: str
    """Name under ``/inputs`` (and, for convenience, in the working directory)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRequest:
    """One program to run in a fresh sandbox."""

    code: str
    """The program text."""
    language: Language = "python"
    inputs: tuple[InputFile, ...] = ()
    exports: tuple[str, ...] = ()
    """Globs, relative to the working directory, of files to export as artifacts."""
    limits: Limits | None = None
    """The run's limits; None takes the profile's defaults (the executor resolves them and
    refuses any limit above the profile's ceiling)."""
    stdin: bytes = b""
    """Bytes fed to the program's standard input (then closed)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for the program. Nothing of the caller's environment is passed otherwise;
    only the names of these variables are recorded, never the values."""
    packages: tuple[Path, ...] = ()
    """Host directories of packages from the wheel cache (prepared ahead of time), mounted
    read-only under ``/packages`` and importable after the runtime's own packages."""
    mode: IsolationMode = IsolationMode.STRICT
    landlock: bool | None = None
    """``True`` requires Landlock, ``False`` disables it, ``None`` uses it where available."""
    display: bool = False
    """Python only: capture rich outputs as a notebook would (the last expression's value,
    DataFrames as tables, open matplotlib figures as PNG and SVG) into ``RunResult.outputs``."""
    runtime: str | None = None
    """The runtime to run in (``sandcell runtime list``); None: the profile's (the executor
    fills it in), or ``default`` for a backend called directly."""

    @property
    def effective_limits(self) -> Limits:
        """The limits a backend enforces: the given ones, else the built-in defaults."""
        return self.limits if self.limits is not None else Limits()

    def __post_init__(self) -> None:
        if self.language not in LANGUAGES:
            raise ConfigError(
                f"unknown language {self.language!r}; choose one of {', '.join(LANGUAGES)}"
            )
        if "\x00" in self.code:
            raise ConfigError("the code contains a NUL byte; pass text, not binary data")
        for name, value in self.env.items():
            if not name or "=" in name or "\x00" in name or "\x00" in value:
                raise ConfigError(f"invalid environment variable name or value: {name!r}")
            if self.language in NODE_LANGUAGES and name in NODE_RESERVED_ENV:
                raise ConfigError(
                    f"a {self.language} run may not set {name}: it changes how Node.js starts "
                    "(its flags and module search are the runtime's); remove it from the "
                    "environment"
                )
        pids = self.effective_limits.max_pids
        if self.language in NODE_LANGUAGES and pids < NODE_MIN_PIDS:
            raise ConfigError(
                f"a {self.language} run needs max_pids of at least {NODE_MIN_PIDS}, not {pids}: "
                "Node.js starts about ten threads of its own (V8's workers, libuv's pool), and "
                "each counts; raise the limit (--pids)"
            )
        seen: set[str] = set()
        for item in self.inputs:
            if item.name in seen:
                raise ConfigError(f"two inputs are both named {item.name!r}; rename one of them")
            seen.add(item.name)


def input_from_path(path: str | os.PathLike[str]) -> InputFile:
    """An :class:`InputFile` for an existing host path, named after its last component."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"input {str(path)!r} does not exist; pass an existing file or directory")
    resolved = p.resolve()
    name = resolved.name
    if not name or name in {".", ".."}:
        raise ConfigError(
            f"input {str(path)!r} has no usable name; pass a file or a named directory"
        )
    return InputFile(host_path=resolved, name=name)


class Outcome(enum.Enum):
    """How a run ended. Exactly one per run."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"
    KILLED = "killed"
    INFRA_ERROR = "infra_error"
    DENIED = "denied"
    """The policy refused the code before it ran (the findings say why)."""
    AWAITING_APPROVAL = "awaiting_approval"
    """The policy wants a person to approve the code first; it has not run."""
    INVALID_OUTPUT = "invalid_output"
    """It ran, but its declared result failed validation; nothing is handed on as if right."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Resources used by the whole process tree of the run."""

    wall_ms: float
    cpu_ms: float | None
    """CPU time of every process of the run, user and system; None where it cannot be measured."""
    peak_memory_bytes: int | None
    """Peak memory of the sandbox (cgroup high-water mark); None where it cannot be measured."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Artifact:
    """An exported file, stored once under its SHA-256."""

    path: str
    """Path relative to the working directory, as the code wrote it."""
    sha256: str
    size: int
    media_type: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RejectedExport:
    """A file that matched an export glob but was refused, and why."""

    path: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DisplayOutput:
    """One rich output of a run, as a notebook shows it: a value, a table or a figure.

    ``data`` maps a media type to its text form (``text/plain``, ``text/html``,
    ``application/json``); binary forms (``image/png``, ``image/svg+xml``) are stored as artifacts.
    """

    kind: Literal["value", "table", "figure"]
    data: Mapping[str, str] = field(default_factory=dict)
    artifacts: tuple[Artifact, ...] = ()
    displayed: bool = False
    """Shown by ``display()`` as the cell went, rather than as its value (a notebook's main
    result) or a figure left open at its end."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StartInfo:
    """How the sandbox of a run was started (recorded with every run)."""

    mode: Literal["cold", "template", "pool"] = "cold"
    """``cold``: a new sandbox from scratch; ``template``: forked at call time from a
    pre-initialised template that never ran untrusted code, then isolated as a fresh sandbox;
    ``pool``: the same, forked ahead of time and waiting unused."""
    template: str | None = None
    """The template's id (its runtime, preloaded modules and when it started)."""
    preloaded: tuple[str, ...] = ()
    """Modules imported in the template before the fork."""
    wait_ms: float = 0.0
    """Time spent waiting for a sandbox to become available."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Enforcement:
    """Which isolation layers were actually active for the run."""

    backend: str
    layers: Mapping[str, str]
    """Layer name to how it was enforced (``"cgroup v1"``, ``"seccomp bpf, 45 syscalls"``...)."""
    mode: IsolationMode
    weakened: tuple[str, ...] = ()
    """Layers that ran in a weaker form because the caller asked for a weaker mode by name."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeRef:
    """The built runtime a run used, named as its record names it."""

    name: str
    """The runtime asked for (``datascience``; the record's ``selected``)."""
    tree_sha256: str
    """The content hash of the tree it ran in (its store name)."""
    lock_sha256: str
    """The hash of the lock that tree was built from."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """Everything observed about one run."""

    run_id: str
    outcome: Outcome
    exit_code: int | None
    """The program's exit status, or None when it was killed by a signal or never ran."""
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    usage: Usage
    artifacts: tuple[Artifact, ...]
    rejected_exports: tuple[RejectedExport, ...]
    enforcement: Enforcement | None
    reason: str = ""
    """A sentence on why the run ended as it did (which limit, which signal, what failed)."""
    started_at: str = ""
    """ISO 8601 UTC time the run started."""
    policy: Mapping[str, object] | None = None
    """The profile (name, sha256), the decision and the findings of the checks before the run,
    and the approval (who, when) where one was needed."""
    validation: Mapping[str, object] | None = None
    """The declared result and its validation (``valid``, ``errors``, ``value``), if declared."""
    leaks: tuple[Mapping[str, object], ...] = ()
    """Token and key patterns found (and redacted) in what left the sandbox."""
    outputs: tuple[DisplayOutput, ...] = ()
    """Rich outputs (requested with ``RunRequest.display`` or in a session), in order."""
    start: StartInfo = field(default_factory=StartInfo)
    session_id: str | None = None
    """The session this run was a cell of, if any."""
    network: Mapping[str, object] | None = None
    """Every connection the run tried through its egress proxy (None: its profile allows no
    network): ``connections`` (host, port, address, allowed, reason, bytes, times), totals."""
    tools: Mapping[str, object] | None = None
    """Every governed tool call of the run (None: its profile has no tools): ``calls`` (tool,
    argument and result hashes, decision, approver, sizes, duration)."""
    runtime: RuntimeRef | None = None
    """The built runtime the run used; None when it used sandcell's own environment
    (``default``), which has no tree or lock of its own."""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK


def result_to_dict(result: RunResult) -> dict[str, object]:
    """The JSON form of a result (the ``--json`` output and the HTTP body)."""
    e = result.enforcement
    return {
        "run_id": result.run_id,
        "outcome": result.outcome.value,
        "reason": result.reason,
        "exit_code": result.exit_code,
        "signal": result.signal,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
        "usage": {
            "wall_ms": result.usage.wall_ms,
            "cpu_ms": result.usage.cpu_ms,
            "peak_memory_bytes": result.usage.peak_memory_bytes,
        },
        "artifacts": [artifact_to_dict(a) for a in result.artifacts],
        "rejected_exports": [{"path": r.path, "reason": r.reason} for r in result.rejected_exports],
        "enforcement": None
        if e is None
        else {
            "backend": e.backend,
            "mode": e.mode.value,
            "layers": dict(e.layers),
            "weakened": list(e.weakened),
        },
        "started_at": result.started_at,
        "policy": dict(result.policy) if result.policy is not None else None,
        "validation": _json_validation(result.validation),
        "leaks": [dict(leak) for leak in result.leaks],
        "outputs": [output_to_dict(o) for o in result.outputs],
        "start": start_to_dict(result.start),
        "session_id": result.session_id,
        "network": None if result.network is None else dict(result.network),
        "tools": None if result.tools is None else dict(result.tools),
        "runtime": None if result.runtime is None else runtime_ref_to_dict(result.runtime),
    }


def runtime_ref_to_dict(ref: RuntimeRef) -> dict[str, object]:
    """The JSON form of a result's ``runtime``."""
    return {"name": ref.name, "tree_sha256": ref.tree_sha256, "lock_sha256": ref.lock_sha256}


def result_from_dict(data: Mapping[str, object]) -> RunResult:
    """The result a :func:`result_to_dict` form describes (an HTTP body, a ``--json`` line):
    ``result_from_dict(result_to_dict(r)) == r`` for a result as the executor returns it (a
    validated pydantic value comes back as its JSON form). A form that does not fit raises
    ConfigError naming the field."""
    try:
        usage = _section(data, "usage")
        e = data.get("enforcement")
        enforcement = None
        if e is not None:
            e = _as_mapping(e, "enforcement")
            enforcement = Enforcement(
                backend=str(e["backend"]),
                layers={str(k): str(v) for k, v in _as_mapping(e["layers"], "layers").items()},
                mode=IsolationMode(e["mode"]),
                weakened=tuple(str(w) for w in _as_list(e.get("weakened", []), "weakened")),
            )
        start = _section(data, "start")
        return RunResult(
            run_id=str(data["run_id"]),
            outcome=Outcome(data["outcome"]),
            reason=str(data.get("reason", "")),
            exit_code=_opt_int(data.get("exit_code")),
            signal=_opt_int(data.get("signal")),
            stdout=str(data.get("stdout", "")),
            stderr=str(data.get("stderr", "")),
            stdout_truncated=bool(data.get("stdout_truncated", False)),
            stderr_truncated=bool(data.get("stderr_truncated", False)),
            usage=Usage(
                wall_ms=float(usage.get("wall_ms") or 0.0),  # type: ignore[arg-type]
                cpu_ms=_opt_float(usage.get("cpu_ms")),
                peak_memory_bytes=_opt_int(usage.get("peak_memory_bytes")),
            ),
            artifacts=_artifacts(data.get("artifacts", [])),
            rejected_exports=tuple(
                RejectedExport(path=str(r["path"]), reason=str(r["reason"]))
                for r in (
                    _as_mapping(x, "rejected_exports") for x in _list(data, "rejected_exports")
                )
            ),
            enforcement=enforcement,
            started_at=str(data.get("started_at", "")),
            policy=_opt_mapping(data.get("policy"), "policy"),
            validation=_opt_mapping(data.get("validation"), "validation"),
            leaks=tuple(_as_mapping(x, "leaks") for x in _list(data, "leaks")),
            outputs=tuple(
                DisplayOutput(
                    kind=o["kind"],  # type: ignore[arg-type]
                    data={
                        str(k): str(v) for k, v in _as_mapping(o.get("data", {}), "data").items()
                    },
                    artifacts=_artifacts(o.get("artifacts", [])),
                    displayed=o.get("displayed") is True,
                )
                for o in (_as_mapping(x, "outputs") for x in _list(data, "outputs"))
            ),
            start=StartInfo(
                mode=start.get("mode", "cold"),  # type: ignore[arg-type]
                template=None if start.get("template") is None else str(start.get("template")),
                preloaded=tuple(str(m) for m in _as_list(start.get("preloaded", []), "preloaded")),
                wait_ms=float(start.get("wait_ms") or 0.0),  # type: ignore[arg-type]
            ),
            session_id=None if data.get("session_id") is None else str(data.get("session_id")),
            network=_opt_mapping(data.get("network"), "network"),
            tools=_opt_mapping(data.get("tools"), "tools"),
            runtime=_runtime_ref(data.get("runtime")),
        )
    except KeyError as exc:
        raise ConfigError(f"a run result without its {exc.args[0]!r} field") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"a run result that does not fit its form: {exc}") from None


def _runtime_ref(value: object) -> RuntimeRef | None:
    if value is None:
        return None
    ref = _as_mapping(value, "runtime")
    return RuntimeRef(
        name=str(ref["name"]),
        tree_sha256=str(ref["tree_sha256"]),
        lock_sha256=str(ref["lock_sha256"]),
    )


def _as_mapping(value: object, what: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"a run result whose {what!r} is not an object")
    return value


def _as_list(value: object, what: str) -> list[object]:
    if not isinstance(value, list | tuple):
        raise ConfigError(f"a run result whose {what!r} is not a list")
    return list(value)


def _list(data: Mapping[str, object], key: str) -> list[object]:
    return _as_list(data.get(key, []), key)


def _section(data: Mapping[str, object], key: str) -> Mapping[str, object]:
    value = data.get(key)
    return {} if value is None else _as_mapping(value, key)


def _opt_mapping(value: object, what: str) -> Mapping[str, object] | None:
    return None if value is None else dict(_as_mapping(value, what))


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def _opt_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _artifacts(value: object) -> tuple[Artifact, ...]:
    return tuple(
        Artifact(
            path=str(a["path"]),
            sha256=str(a["sha256"]),
            size=int(a["size"]),  # type: ignore[call-overload]
            media_type=str(a["media_type"]),
        )
        for a in (_as_mapping(x, "artifacts") for x in _as_list(value, "artifacts"))
    )


def artifact_to_dict(a: Artifact) -> dict[str, object]:
    return {"path": a.path, "sha256": a.sha256, "size": a.size, "media_type": a.media_type}


def output_to_dict(o: DisplayOutput) -> dict[str, object]:
    out: dict[str, object] = {
        "kind": o.kind,
        "data": dict(o.data),
        "artifacts": [artifact_to_dict(a) for a in o.artifacts],
    }
    if o.displayed:  # only then: records of outputs without it keep their shape
        out["displayed"] = True
    return out


def start_to_dict(s: StartInfo) -> dict[str, object]:
    return {
        "mode": s.mode,
        "template": s.template,
        "preloaded": list(s.preloaded),
        "wait_ms": s.wait_ms,
    }


def _json_validation(validation: Mapping[str, object] | None) -> dict[str, object] | None:
    """The validation part in JSON form: a pydantic model as the caller gets it becomes its
    JSON dump."""
    if validation is None:
        return None
    out = dict(validation)
    dump = getattr(out.get("value"), "model_dump", None)
    if callable(dump):
        out["value"] = dump(mode="json")
    return out
