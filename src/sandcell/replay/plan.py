"""From a run record to the request that re-runs it, or a refusal saying why it cannot.

A replay runs what the record says ran, nothing guessed. What must be the same or the replay is
refused (:class:`ReplayRefused`, naming the thing and the fix): the profile (by sha256, unless the
caller asks for the current one), every input (by sha256, read again from its host path), the
stdin bytes (kept in the artifact store by sha256), the wheel-cache packages (by wheel sha256),
the environment variable names (their values are never recorded: the caller gives them again).
What may differ and is said, not refused: the runtime (the host's interpreter and packages; an
upgrade would otherwise make every older run unreplayable, and the comparison shows its effect),
and the backend when the caller overrides it. A session cell is refused: its result depends on
the interpreter state the earlier cells of its session left, which its record does not hold. A
``--workdir-from`` run is replayed from what its record keeps: the caller's program, and the
snapshot of its working directory in the artifact store (by sha256).

Records written before :data:`sandcell.replay.evidence.RECORD_VERSION` lack some fields: the plan
says which (in :attr:`ReplayPlan.notes`) and marks the replay as not exact.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sandcell.artifacts.store import ArtifactStore
from sandcell.changes.program import ARCHIVE_INPUT, CHANGES_FILE
from sandcell.errors import ConfigError
from sandcell.inputs import inspect_input
from sandcell.packages.wheel_cache import WheelCache
from sandcell.policy.profiles import Profile, load_profile
from sandcell.replay.evidence import RECORD_VERSION
from sandcell.runtimes import runtime_for
from sandcell.spec import LANGUAGES, InputFile, IsolationMode, Limits, RunRequest

_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class ReplayRefused(ConfigError):
    """The recorded run cannot be replayed as recorded; the message says what and how to fix it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayPlan:
    """What a replay runs, and what it could not keep as it was."""

    run_id: str
    """The original run."""
    request: RunRequest
    profile: Profile
    backend: str
    """The backend the replay runs on: the recorded one unless overridden."""
    recorded_backend: str
    schema: Mapping[str, object] | None
    invariants: tuple[str, ...]
    result_file: str | None
    notes: tuple[str, ...]
    """Each thing the replay does not reproduce exactly, in a sentence."""
    exact: bool
    """False when anything in :attr:`notes` makes the replay differ from the original's setup."""
    profile_changed: bool
    runtime_changed: bool
    workdir: Mapping[str, object] | None = None
    """The record's ``workdir`` section of a ``--workdir-from`` run: the replay runs the caller's
    program on the snapshot the run kept in the artifact store (:mod:`sandcell.changes.run`)."""

    def record_fields(self) -> dict[str, object]:
        """What the replay's own record says about it (``replay_of`` and ``replay``)."""
        return {
            "replay_of": self.run_id,
            "replay": {
                "of": self.run_id,
                "exact": self.exact,
                "profile": "current" if self.profile_changed else "recorded",
                "backend": {"recorded": self.recorded_backend, "used": self.backend},
                "runtime_changed": self.runtime_changed,
                "env_supplied": sorted(self.request.env),
                "notes": list(self.notes),
            },
        }


def build_plan(
    record: Mapping[str, object],
    *,
    store: ArtifactStore,
    wheels: WheelCache,
    use_current_profile: bool = False,
    backend: str | None = None,
    env: Mapping[str, str] | None = None,
    load: Callable[[str], Profile] = load_profile,
) -> ReplayPlan:
    """The plan to replay ``record``; raises :class:`ReplayRefused` when it cannot be replayed
    as recorded (see the module docstring)."""
    run_id = str(record.get("run_id", ""))
    notes: list[str] = []
    if record.get("session_id"):
        raise ReplayRefused(
            f"run {run_id} is a cell of session {record.get('session_id')}: its result depends "
            "on the state the session's earlier cells left in the interpreter, which no record "
            "holds, so it cannot be replayed on its own; run the session's cells again in a new "
            "session (sandcell session)"
        )
    code, language = record.get("code"), record.get("language")
    workdir = record.get("workdir")
    if isinstance(workdir, Mapping):
        code = _workdir_program(workdir, store, run_id)
    else:
        workdir = None
    if not isinstance(code, str) or language not in LANGUAGES:
        raise ReplayRefused(f"the record of run {run_id} holds no code or language to replay")
    old = record.get("record_version") is None
    if old:
        notes.append(
            f"the record predates replay records (version {RECORD_VERSION}): its packages, "
            "Landlock setting and declared result were not recorded"
        )
    if record.get("wrapped") and workdir is None:
        notes.append(
            "the record holds the program as the sandbox ran it (wrapped by a batch harness); "
            "the replay's checks judge that text, where the original's judged the caller's"
        )
    profile, profile_changed = _profile(record, run_id, use_current_profile, load)
    if profile_changed:
        notes.append(
            f"the profile {profile.name!r} changed since the run; replayed under the current one "
            f"(sha256 {profile.sha256[:12]}) as asked"
        )
    try:
        limits = Limits(**_mapping(record.get("limits"), "limits", run_id))  # type: ignore[arg-type]
        mode = IsolationMode(record.get("mode", IsolationMode.STRICT.value))
    except (TypeError, ValueError) as exc:
        raise ReplayRefused(
            f"the record of run {run_id} has unusable limits or mode: {exc}"
        ) from None
    recorded_inputs = _list(record.get("inputs"), "inputs", run_id)
    if workdir is not None:
        # The snapshot archive was an input of the frame: the replay gives the kept one again.
        recorded_inputs = [
            i
            for i in recorded_inputs
            if not (isinstance(i, Mapping) and i.get("name") == ARCHIVE_INPUT)
        ]
    inputs = tuple(_input(item, run_id) for item in recorded_inputs)
    stdin = _stdin(record, store, run_id)
    given_env = _env(record, env or {}, run_id)
    if given_env:
        notes.append(
            "environment values were given again by the caller (values are never recorded, so "
            f"they are not checked): {', '.join(sorted(given_env))}"
        )
    packages = _packages(record, wheels, run_id, notes, old=old)
    schema, invariants, result_file = _declared(record, notes, old=old)
    landlock = record.get("landlock")
    recorded_runtime = _mapping(record.get("runtime", {}), "runtime", run_id)
    selected = _runtime_ref(recorded_runtime, notes)
    runtime = runtime_for(language, selected)
    runtime_changed = recorded_runtime.get("sha256") != runtime.sha256
    if runtime_changed:
        notes.append(
            f"the runtime differs: recorded {recorded_runtime.get('name')} "
            f"(sha256 {str(recorded_runtime.get('sha256'))[:12]}), now {runtime.name} "
            f"(sha256 {runtime.sha256[:12]}); the replay runs on the current one"
        )
    recorded_backend = str(_mapping(record.get("backend", {}), "backend", run_id).get("name", ""))
    if not recorded_backend:
        raise ReplayRefused(f"the record of run {run_id} does not say which backend ran it")
    used_backend = backend or recorded_backend
    if used_backend != recorded_backend:
        notes.append(
            f"run on backend {used_backend!r} instead of the recorded {recorded_backend!r}, "
            "as asked (--backend)"
        )
    network = record.get("network")
    if isinstance(network, Mapping) and network.get("connections"):
        notes.append(
            "the original reached hosts through its egress proxy; what they answer now may differ"
        )
    exports = _list(record.get("exports", []), "exports", run_id)
    if workdir is not None:
        exports = [e for e in exports if e != CHANGES_FILE]
    try:
        request = RunRequest(
            code=code,
            language=language,
            inputs=inputs,
            exports=tuple(str(e) for e in exports),
            limits=limits,
            stdin=stdin,
            env=given_env,
            packages=packages,
            mode=mode,
            landlock=landlock if isinstance(landlock, bool) else None,
            display=bool(record.get("display", False)),
            runtime=selected,
        )
    except ConfigError as exc:
        raise ReplayRefused(f"the record of run {run_id} is not a valid request: {exc}") from None
    inexact = profile_changed or runtime_changed or used_backend != recorded_backend or old
    return ReplayPlan(
        run_id=run_id,
        request=request,
        profile=profile,
        backend=used_backend,
        recorded_backend=recorded_backend,
        schema=schema,
        invariants=invariants,
        result_file=result_file,
        notes=tuple(notes),
        exact=not inexact and not notes,
        profile_changed=profile_changed,
        runtime_changed=runtime_changed,
        workdir=workdir,
    )


def _workdir_program(workdir: Mapping[str, object], store: ArtifactStore, run_id: str) -> str:
    """The caller's program of a ``--workdir-from`` run, once its kept snapshot is checked to be
    in the store; ReplayRefused for a record that kept neither (made before they were kept)."""
    program = workdir.get("program")
    kept = workdir.get("snapshot")
    if not isinstance(program, str) or not isinstance(kept, Mapping):
        raise ReplayRefused(
            f"run {run_id} ran with --workdir-from {workdir.get('source')} before sandcell kept "
            "the caller's program and the snapshot with the record; run it again with sandcell "
            "run --workdir-from"
        )
    digest = kept.get("archive_sha256")
    if not isinstance(digest, str) or not store.has(digest):
        raise ReplayRefused(
            f"the snapshot of the working directory of run {run_id} ({workdir.get('source')}, "
            f"sha256 {str(digest)[:12]}) is no longer in the artifact store ({store.root}); run "
            "it again with sandcell run --workdir-from"
        )
    return program


def _declared(
    record: Mapping[str, object], notes: list[str], *, old: bool
) -> tuple[Mapping[str, object] | None, tuple[str, ...], str | None]:
    """The declared result of the run (schema, textual invariants, result file), and a note for
    each part a record cannot hold."""
    declared = record.get("declared")
    if not isinstance(declared, Mapping):
        if record.get("outcome") not in ("denied", "awaiting_approval") and not old:
            notes.append("the record holds no declared result; the replay validates none")
        return None, (), None
    raw_schema = declared.get("schema")
    raw_inv = declared.get("invariants")
    raw_file = declared.get("result_file")
    if declared.get("model"):
        notes.append(
            f"the original validated its result with the pydantic model "
            f"{declared.get('model')}, which a record cannot hold; the replay does not"
        )
    if declared.get("unrecorded_invariants"):
        notes.append(
            f"{declared.get('unrecorded_invariants')} callable invariant(s) of the original "
            "cannot be recorded; the replay does not check them"
        )
    return (
        raw_schema if isinstance(raw_schema, Mapping) else None,
        tuple(str(i) for i in raw_inv) if isinstance(raw_inv, list) else (),
        raw_file if isinstance(raw_file, str) else None,
    )


def _profile(
    record: Mapping[str, object], run_id: str, use_current: bool, load: Callable[[str], Profile]
) -> tuple[Profile, bool]:
    policy = _mapping(record.get("policy"), "policy", run_id)
    recorded = _mapping(policy.get("profile"), "policy.profile", run_id)
    name, source = str(recorded.get("name", "")), str(recorded.get("source", ""))
    # A built-in is loaded by name; a user profile from the file it was loaded from.
    where = name if source.startswith("builtin:") or not source else source
    try:
        profile = load(where)
    except ConfigError as exc:
        raise ReplayRefused(
            f"the profile of run {run_id} ({name!r}, {source}) cannot be loaded now: {exc}"
        ) from None
    if profile.sha256 == recorded.get("sha256"):
        return profile, False
    if not use_current:
        raise ReplayRefused(
            f"profile {name!r} ({source}) changed since run {run_id}: recorded sha256 "
            f"{str(recorded.get('sha256'))[:12]}, now {profile.sha256[:12]}; restore the "
            "profile to replay the run as it was, or replay it under the current profile with "
            "--use-current-profile (the replay's record says so)"
        )
    return profile, True


def _input(item: object, run_id: str) -> InputFile:
    entry = _mapping(item, "inputs", run_id)
    name, host_path = str(entry.get("name", "")), str(entry.get("host_path", ""))
    path = Path(host_path)
    if not path.exists() and not path.is_symlink():
        raise ReplayRefused(
            f"input {name!r} of run {run_id} is gone: {host_path} does not exist; restore it "
            f"(sha256 {str(entry.get('sha256'))[:12]}) to replay the run"
        )
    found = InputFile(host_path=path, name=name)
    try:
        now = inspect_input(found)
    except ConfigError as exc:
        raise ReplayRefused(f"input {name!r} of run {run_id} cannot be used now: {exc}") from None
    if now.get("sha256") != entry.get("sha256") or now.get("kind") != entry.get("kind"):
        raise ReplayRefused(
            f"input {name!r} of run {run_id} changed since the run: {host_path} had sha256 "
            f"{str(entry.get('sha256'))[:12]}, now {str(now.get('sha256'))[:12]}; restore its "
            "content to replay the run"
        )
    return found


def _stdin(record: Mapping[str, object], store: ArtifactStore, run_id: str) -> bytes:
    digest = record.get("stdin_sha256", _EMPTY_SHA256)
    if digest == _EMPTY_SHA256:
        return b""
    if not isinstance(digest, str) or not store.has(digest):
        why = (
            "the record predates kept stdin"
            if record.get("record_version") is None
            else "it is no longer in the artifact store"
        )
        raise ReplayRefused(
            f"the stdin of run {run_id} (sha256 {str(digest)[:12]}) cannot be fed again: {why}"
        )
    data = store.path_for(digest).read_bytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise ReplayRefused(
            f"the kept stdin of run {run_id} no longer matches its sha256 {digest[:12]}: the "
            f"artifact store was changed ({store.root})"
        )
    return data


def _env(record: Mapping[str, object], env: Mapping[str, str], run_id: str) -> dict[str, str]:
    names = {str(n) for n in _list(record.get("env_names", []), "env_names", run_id)}
    missing = sorted(names - set(env))
    extra = sorted(set(env) - names)
    if missing:
        raise ReplayRefused(
            f"run {run_id} was given the environment variables {', '.join(missing)}, whose "
            "values are never recorded; give them again (--env NAME=VALUE)"
        )
    if extra:
        raise ReplayRefused(
            f"run {run_id} had no environment variables {', '.join(extra)}; a replay gets only "
            "those the original had"
        )
    return dict(env)


def _packages(
    record: Mapping[str, object], wheels: WheelCache, run_id: str, notes: list[str], *, old: bool
) -> tuple[Path, ...]:
    if old:
        if record.get("language") == "python":
            notes.append("its packages are resolved from the current wheel cache, unverified")
        return ()
    paths: list[Path] = []
    for item in _list(record.get("packages", []), "packages", run_id):
        entry = _mapping(item, "packages", run_id)
        name = entry.get("name")
        if not isinstance(name, str):
            path = Path(str(entry.get("path")))
            if not path.is_dir():
                raise ReplayRefused(
                    f"the package directory {path} of run {run_id} is gone; restore it"
                )
            notes.append(f"package directory {path} is outside the wheel cache, unverified")
            paths.append(path)
            continue
        pkg = wheels.get(name)
        pin = f"{name}=={entry.get('version')}"
        if pkg is None:
            raise ReplayRefused(
                f"package {pin} of run {run_id} is no longer in the wheel cache; add it back "
                f"(sandcell packages add {pin})"
            )
        if pkg.version != entry.get("version") or pkg.sha256 != entry.get("sha256"):
            raise ReplayRefused(
                f"package {name} of run {run_id} changed in the wheel cache: recorded {pin} "
                f"(wheel sha256 {str(entry.get('sha256'))[:12]}), now {pkg.version} "
                f"({pkg.sha256[:12]}); put {pin} back in the cache to replay the run"
            )
        paths.append(pkg.path)
    return tuple(paths)


def _mapping(value: object, what: str, run_id: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise ReplayRefused(f"the record of run {run_id} has no usable {what!r} field")
    return value


def _list(value: object, what: str, run_id: str) -> list[object]:
    if not isinstance(value, list):
        raise ReplayRefused(f"the record of run {run_id} has no usable {what!r} field")
    return value


def _runtime_ref(recorded: Mapping[str, object], notes: list[str]) -> str | None:
    """The runtime a replay runs in: the exact build the record names while the store keeps it
    (``name@tree``), else the name's current build (the comparison notes the change); None for
    the default runtime."""
    name, tree = recorded.get("selected"), recorded.get("tree_sha256")
    if not isinstance(name, str) or not name:
        return None
    if isinstance(tree, str) and tree:
        from sandcell.runtimes.store import find

        try:
            find(f"{name}@{tree}")
        except ConfigError:
            notes.append(
                f"the build {tree[:12]} of runtime {name} is gone; its current build is used"
            )
            return name
        return f"{name}@{tree}"
    return name
