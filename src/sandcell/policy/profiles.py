"""Profiles: the permission matrix, one row per class of job.

A profile says what one class of job may do: filesystem (inputs, export globs), network, limits
(a default and a ceiling for every limit of the execution layer), runtime (languages, imports,
packages), checks (which rules apply, at what severity), validation (the result schema) and
approval. Profiles are TOML files; sandcell ships ``strict`` (the default), ``analysis`` and
``supervised``, and users add their own in a profile directory.

Two rules hold for every setting:

* **Empty means nothing is allowed.** ``export_globs = []`` allows no export, ``languages = []``
  no language, ``allowed_imports = []`` nothing beyond the safe standard library.
* **Absent means the default, which denies.** A missing key or section takes the default of
  its section dataclass (:class:`FilesystemRules`, :class:`LimitRules`...), which is exactly
  what the built-in ``strict`` profile says.

The sections live in :mod:`sandcell.policy._profile_sections` and the line-aware TOML reading
in :mod:`sandcell.policy._toml_lines`; everything public is importable from here.

A profile file is checked completely when it is loaded; an error names the file, the line and
the reason (:class:`ProfileError`). A limit above its ceiling is refused, never clamped. The
profile's name, source and SHA-256 go into every run record (:meth:`Profile.to_record`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from importlib.resources import files
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

import platformdirs

from sandcell.artifacts import validate_globs
from sandcell.backends.registry import LADDER, BackendName, check_name, rank
from sandcell.errors import ConfigError
from sandcell.network.allowlist import host_problem
from sandcell.policy._profile_sections import (
    APPROVAL_MODES,
    LIMIT_KEYS,
    RUNTIME_IMPORTS,
    SEVERITIES,
    STRICT_CEILINGS,
    Approval,
    CheckRules,
    FilesystemRules,
    IngressRules,
    IsolationRules,
    LimitRules,
    NetworkMode,
    NetworkRules,
    RuntimeRules,
    SectionError,
    Severity,
    ValidationRules,
    WorkdirRules,
    glob_covers,
    plain,
    show_limit,
)
from sandcell.policy._toml_lines import ProfileError, TomlDoc
from sandcell.spec import Limits
from sandcell.tools.definitions import ToolDefinition, ToolDefinitionError, parse_tools

__all__ = [
    "APPROVAL_MODES",
    "DEFAULT_PROFILE",
    "LIMIT_KEYS",
    "SEVERITIES",
    "STRICT_CEILINGS",
    "Approval",
    "CheckRules",
    "FilesystemRules",
    "IngressRules",
    "IsolationRules",
    "LimitRules",
    "NetworkMode",
    "NetworkRules",
    "Profile",
    "ProfileError",
    "ProfileSummary",
    "RuntimeRules",
    "Severity",
    "ValidationRules",
    "WorkdirRules",
    "builtin_names",
    "default_profile_dir",
    "host_problem",
    "list_profiles",
    "load_profile",
    "parse_profile",
    "render_list",
    "render_matrix",
]

DEFAULT_PROFILE = "strict"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_MAX_FILE_BYTES = 1024 * 1024  # a profile or schema file larger than this is surely a mistake


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """One row of the permission matrix. Build it with :func:`load_profile`."""

    name: str
    description: str = ""
    source: str
    """``builtin:<name>``, or the path of the profile file."""
    sha256: str
    """Of the file's bytes (followed by the schema file's, when one is referenced)."""
    filesystem: FilesystemRules = field(default_factory=FilesystemRules)
    network: NetworkRules = field(default_factory=NetworkRules)
    ingress: IngressRules = field(default_factory=IngressRules)
    """``[ingress] ports``: a session's servers reachable from outside through sandcell."""
    isolation: IsolationRules = field(default_factory=IsolationRules)
    limits: LimitRules = field(default_factory=LimitRules)
    runtime: RuntimeRules = field(default_factory=RuntimeRules)
    checks: CheckRules = field(default_factory=CheckRules)
    validation: ValidationRules = field(default_factory=ValidationRules)
    workdir: WorkdirRules = field(default_factory=WorkdirRules)
    approval: Approval = "on_findings"
    """When a run waits for a person: ``never`` (warnings are recorded, the run goes on),
    ``on_findings`` (a run with a ``warning`` finding waits), ``always`` (every run waits).
    A ``deny`` finding stops the run in every mode (``sandcell.policy.checks.findings.decide``).
    Absent: ``on_findings``."""
    submitter_may_approve: bool = False
    """Whether, on the service, the key that submitted a run may also approve it (and the tool
    calls it waits on). Off: only a tenant's approver key (``sandcell tenants add-approver``)
    approves, so an agent holding the tenant's key cannot approve itself. Absent: false."""
    tools: tuple[ToolDefinition, ...] = ()
    """``[tools.NAME]`` sections: governed tools a run may call through the host's tool gateway
    (:mod:`sandcell.tools`). Absent: none."""

    def __post_init__(self) -> None:
        if self.approval not in APPROVAL_MODES:
            raise SectionError(
                f"unknown approval {self.approval!r}; use {', '.join(APPROVAL_MODES)}", "approval"
            )

    def allows_language(self, language: str) -> bool:
        """Whether programs in ``language`` may run."""
        return language in self.runtime.languages

    def import_allowlist(self) -> frozenset[str] | None:
        """Top-level modules allowed beyond the safe standard library; None allows any.

        This is the ``allowed_imports`` argument of the Python checks.
        """
        allowed = self.runtime.allowed_imports
        if "*" in allowed:
            return None
        # The gateway's client is how a run reaches its tools: allowed wherever tools are.
        return frozenset(allowed) | ({"sandcell_tools"} if self.tools else set())

    def allows_network(self) -> bool:
        """Whether the run may reach any host (only through the egress proxy)."""
        return self.network.mode == "allowlist" and bool(self.network.hosts)

    def allows_inputs(self, count: int) -> bool:
        """Whether a run may be given ``count`` inputs."""
        return count <= self.filesystem.max_inputs

    def allows_export(self, glob: str) -> bool:
        """Whether the export ``glob`` is covered by one of the profile's export globs.

        Covered: identical to one after normalisation, or matched by one as a path
        (``out/**`` covers ``out/*.png``; ``*.png`` covers ``chart.png`` but not ``*``).

        Raises:
            ConfigError: if ``glob`` itself is invalid (see :func:`validate_globs`).
        """
        requested = tuple(validate_globs([glob])[0].split("/"))
        return any(
            glob_covers(tuple(g.split("/")), requested) for g in self.filesystem.export_globs
        )

    def limits_for(self, requested: Mapping[str, float | None] | None = None) -> Limits:
        """The limits of a run: the defaults, with the requested :class:`Limits` fields replaced.

        ``None`` values are ignored. Raises ConfigError for an unknown limit, and for a request
        above the ceiling: it names the limit, the value, the ceiling and the profile. Never
        clamps.
        """
        names = {f.name for f in fields(Limits)}
        changes: dict[str, float] = {}
        for key, value in (requested or {}).items():
            if key not in names:
                raise ConfigError(
                    f"unknown limit {key!r}; known limits: {', '.join(sorted(names))}"
                )
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"limit {key} must be a number, got {value!r}")
            if not math.isfinite(value):
                # NaN passes every ceiling comparison; infinity is no limit at all.
                raise ConfigError(f"limit {key} must be a finite number, got {value!r}")
            ceiling = getattr(self.limits.ceilings, key)
            if value > ceiling:
                raise ConfigError(
                    f"limit {key}={plain(value)} ({show_limit(key, value)}) is above the "
                    f"ceiling {plain(ceiling)} ({show_limit(key, ceiling)}) of profile "
                    f"{self.name!r}; ask for at most the ceiling, or use a profile with a "
                    "higher one (sandcell policy list)"
                )
            changes[key] = value
        return self.limits.defaults.with_(**changes)

    def backend_for(self, requested: str | None) -> BackendName:
        """The backend of a run that asked for ``requested`` (None: it named none).

        Raises ConfigError when ``requested`` is weaker than the profile's minimum: a run is
        never moved to another rung than the one it asked for.
        """
        if requested is None:
            return check_name(self.isolation.backend)
        name = check_name(requested)
        minimum = check_name(self.isolation.minimum)
        if rank(name) < rank(minimum):
            stronger = ", ".join(b for b in LADDER if rank(b) >= rank(minimum))
            raise ConfigError(
                f"backend {name!r} is weaker than the minimum {minimum!r} of profile "
                f"{self.name!r}; ask for {stronger} (--backend), or use a profile that accepts "
                f"{name!r}"
            )
        return name

    def to_record(self) -> dict[str, object]:
        """What the run record keeps of the profile."""
        return {
            "name": self.name,
            "source": self.source,
            "sha256": self.sha256,
            "approval": self.approval,
        }


# --------------------------------------------------------------------------------------------
# Loading


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileSummary:
    """One line of ``sandcell policy list``."""

    name: str
    source: str
    description: str = ""
    approval: Approval | None = None
    problem: str | None = None
    """Why the profile cannot be used (invalid, shadows a built-in); None when it can."""


_SECTIONS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "filesystem": ("max_inputs", "export_globs"),
        "network": (
            "mode",
            "hosts",
            "allow_addresses",
            "resolve",
            "max_connections",
            "max_concurrent",
            "max_mb_up",
            "max_mb_down",
        ),
        "ingress": ("ports",),
        "isolation": ("backend", "minimum"),
        "runtime": (
            "languages",
            "runtime",
            "runtimes",
            "preload",
            "allowed_imports",
            "allowed_packages",
        ),
        "limits": tuple(LIMIT_KEYS),
        "ceilings": tuple(LIMIT_KEYS),
        "checks": ("disabled", "severity"),
        "validation": ("result_schema", "result_schema_file", "result_file"),
        "workdir": ("binary_changes", "leave_out"),
    }
)
_T = TypeVar("_T")


def _rules(doc: TomlDoc, section: str, cls: Callable[..., _T], **values: object) -> _T:
    """``cls(**values)`` without the absent (None) values, so those keep their default; a
    field error becomes a ProfileError at the line of the offending key or item."""
    try:
        return cls(**{k: v for k, v in values.items() if v is not None})
    except SectionError as exc:
        path, item = (*([section] if section else []), exc.field), exc.item
        if cls is LimitRules:  # point at the [limits] key if the file has it, else [ceilings]
            key = next(k for k, (f, _) in LIMIT_KEYS.items() if f == exc.field)
            path = ("limits" if doc.integer(("limits", key), number=True) else "ceilings", key)
        elif exc.field == "severity" and item is not None:  # one key per rule
            path, item = (*path, item), None
        elif exc.field == "result_schema" and doc.string(("validation", "result_schema_file")):
            path = ("validation", "result_schema_file")
        doc.fail(exc.reason, path, item)


def _limits(doc: TomlDoc, section: str, base: Limits) -> Limits:
    changes: dict[str, float] = {}
    for key, (name, unit) in LIMIT_KEYS.items():
        value = doc.integer((section, key), number=key == "wall_time_s")
        if value is not None:
            if value <= 0:
                doc.fail(f"[{section}] {key} must be positive, got {value}", (section, key))
            changes[name] = value * unit
    try:
        return base.with_(**changes)
    except ConfigError as exc:  # a floor of Limits itself (memory, pids); it names the field
        key = next((k for k, (f, _) in LIMIT_KEYS.items() if f in str(exc)), "")
        doc.fail(str(exc), (section, key))


def _schema(doc: TomlDoc, base_dir: Path | None) -> tuple[object, bytes]:
    """The result schema, inline or from ``result_schema_file``, and the bytes to hash."""
    inline = doc.table(("validation",), _SECTIONS["validation"]).get("result_schema")
    name = doc.string(("validation", "result_schema_file"))
    if name is None:
        return inline, b""
    where = ("validation", "result_schema_file")
    if inline is not None:
        doc.fail("give result_schema or result_schema_file, not both", where)
    if base_dir is None:
        doc.fail("a built-in profile cannot reference a schema file", where)
    path = base_dir / name
    try:
        raw = path.read_bytes()
    except OSError as exc:
        doc.fail(f"schema file {str(path)!r} cannot be read: {exc.strerror}", where)
    try:
        return json.loads(raw), b"\0" + raw
    except ValueError as exc:
        doc.fail(f"schema file {str(path)!r} is not JSON: {exc}", where)


def _tools(doc: TomlDoc) -> tuple[ToolDefinition, ...]:
    table = doc.table(("tools",), None)
    try:
        return parse_tools(table)
    except ToolDefinitionError as exc:
        key = () if exc.key == "name" else (exc.key,)
        doc.fail(str(exc), ("tools", exc.tool, *key), exc.item)


def parse_profile(raw: bytes, *, name: str, source: str, base_dir: Path | None = None) -> Profile:
    """Check the bytes of a profile file completely and build the :class:`Profile`.

    ``source`` names the file in errors and records; ``base_dir`` is where a
    ``result_schema_file`` is looked for (None: schema files are refused).

    Raises:
        ProfileError: naming the file, the line and the reason.
    """
    doc = TomlDoc(source, raw)
    doc.table((), ("description", "approval", "submitter_may_approve", "tools", *_SECTIONS))
    for section, keys in _SECTIONS.items():
        doc.table((section,), keys)
    severity = doc.table(("checks", "severity"), None)
    for rule in severity:
        doc.string(("checks", "severity", rule))
    schema, schema_bytes = _schema(doc, base_dir)
    tools = _tools(doc)
    defaults, ceilings = _limits(doc, "limits", Limits()), _limits(doc, "ceilings", STRICT_CEILINGS)
    fs, net, rt, chk, val = "filesystem", "network", "runtime", "checks", "validation"
    iso = "isolation"
    minimum = doc.string((iso, "minimum"))
    backend = doc.string((iso, "backend"))
    if backend is None and minimum in LADDER and rank(minimum) > 0:
        backend = minimum  # absent backend: the weakest the minimum allows
    return _rules(
        doc,
        "",
        Profile,
        name=name,
        source=source,
        sha256=hashlib.sha256(raw + schema_bytes).hexdigest(),
        description=doc.string(("description",)),
        approval=doc.string(("approval",)),
        submitter_may_approve=doc.boolean(("submitter_may_approve",)),
        tools=tools,
        filesystem=_rules(
            doc,
            fs,
            FilesystemRules,
            max_inputs=doc.integer((fs, "max_inputs")),
            export_globs=doc.strings((fs, "export_globs")),
        ),
        network=_rules(
            doc,
            net,
            NetworkRules,
            mode=doc.string((net, "mode")),
            hosts=doc.strings((net, "hosts")),
            allow_addresses=doc.strings((net, "allow_addresses")),
            resolve=doc.strings((net, "resolve")),
            max_connections=doc.integer((net, "max_connections")),
            max_concurrent=doc.integer((net, "max_concurrent")),
            max_mb_up=doc.integer((net, "max_mb_up")),
            max_mb_down=doc.integer((net, "max_mb_down")),
        ),
        ingress=_rules(doc, "ingress", IngressRules, ports=doc.integers(("ingress", "ports"))),
        isolation=_rules(doc, iso, IsolationRules, backend=backend, minimum=minimum),
        limits=_rules(doc, "limits", LimitRules, defaults=defaults, ceilings=ceilings),
        runtime=_rules(
            doc,
            rt,
            RuntimeRules,
            languages=doc.strings((rt, "languages")),
            runtime=doc.string((rt, "runtime")),
            runtimes=doc.strings((rt, "runtimes")),
            preload=doc.strings((rt, "preload")),
            allowed_imports=doc.strings((rt, "allowed_imports")),
            allowed_packages=doc.strings((rt, "allowed_packages")),
        ),
        checks=_rules(
            doc, chk, CheckRules, disabled=doc.strings((chk, "disabled")), severity=severity
        ),
        validation=_rules(
            doc,
            val,
            ValidationRules,
            result_schema=schema,
            result_file=doc.string((val, "result_file")),
        ),
        workdir=_rules(
            doc,
            "workdir",
            WorkdirRules,
            binary_changes=doc.string(("workdir", "binary_changes")),
            leave_out=doc.strings(("workdir", "leave_out")),
        ),
    )


def default_profile_dir() -> Path:
    """``$SANDCELL_PROFILES``, else ``profiles`` in ``$SANDCELL_HOME`` or the user config dir."""
    explicit = os.environ.get("SANDCELL_PROFILES")
    if explicit:
        return Path(explicit)
    home = os.environ.get("SANDCELL_HOME")
    return (Path(home) if home else platformdirs.user_config_path("sandcell")) / "profiles"


def builtin_names() -> tuple[str, ...]:
    """Names of the profiles shipped with sandcell, the default first."""
    folder = files("sandcell.policy") / "builtin"
    names = [e.name.removesuffix(".toml") for e in folder.iterdir() if e.name.endswith(".toml")]
    return tuple(sorted(names, key=lambda n: (n != DEFAULT_PROFILE, n)))


def _load_builtin(name: str) -> Profile:
    raw = (files("sandcell.policy") / "builtin" / f"{name}.toml").read_bytes()
    return parse_profile(raw, name=name, source=f"builtin:{name}")


def _load_file(path: Path) -> Profile:
    path = path.expanduser().resolve()
    name = path.name.removesuffix(".toml")
    if not _NAME.match(name):
        raise ConfigError(f"profile file {str(path)!r}: rename it to letters, digits, '_.-'")
    if name in builtin_names():
        # The name goes into run records: "strict" must always mean the built-in strict.
        raise ConfigError(
            f"profile file {str(path)!r} has the name of the built-in profile {name!r}; "
            "rename the file (built-in profiles cannot be shadowed)"
        )
    try:
        with path.open("rb") as f:
            raw = f.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"profile file {str(path)!r} cannot be read: {exc.strerror}") from None
    if len(raw) > _MAX_FILE_BYTES:
        raise ProfileError(str(path), None, f"larger than {_MAX_FILE_BYTES} bytes")
    return parse_profile(raw, name=name, source=str(path), base_dir=path.parent)


def load_profile(
    name_or_path: str = DEFAULT_PROFILE, *, profile_dir: Path | None = None
) -> Profile:
    """The profile named ``name_or_path``: a path if it contains ``/`` or ends with ``.toml``,
    else a built-in name or ``<profile_dir>/<name>.toml`` (default :func:`default_profile_dir`).

    A user file may not take a built-in's name (that would change what the name means in run
    records): such a file makes loading that name fail until it is renamed.

    Raises:
        ProfileError: the file is invalid (file, line, reason).
        ConfigError: the name is unknown (the message lists the available ones) or shadowed.
    """
    if "/" in name_or_path or name_or_path.endswith(".toml"):
        return _load_file(Path(name_or_path))
    folder = profile_dir if profile_dir is not None else default_profile_dir()
    user = folder / f"{name_or_path}.toml"
    if _NAME.match(name_or_path) and name_or_path in builtin_names():
        if user.exists():
            raise ConfigError(
                f"profile file {str(user)!r} shadows the built-in profile {name_or_path!r}; "
                "rename it (built-in profiles cannot be shadowed)"
            )
        return _load_builtin(name_or_path)
    if _NAME.match(name_or_path) and user.is_file():
        return _load_file(user)
    names = [s.name for s in list_profiles(folder) if s.problem is None]
    raise ConfigError(
        f"unknown profile {name_or_path!r}; available: {', '.join(names)} (or a path to a "
        f".toml file; user profiles go in {str(folder)!r})"
    )


def list_profiles(profile_dir: Path | None = None) -> list[ProfileSummary]:
    """The built-in profiles, then those of ``profile_dir``; a broken one says why."""
    folder = profile_dir if profile_dir is not None else default_profile_dir()
    loaders: list[tuple[str, str, Callable[[], Profile]]] = [
        (n, f"builtin:{n}", partial(_load_builtin, n)) for n in builtin_names()
    ]
    paths = sorted(folder.glob("*.toml")) if folder.is_dir() else []
    loaders += [(p.stem, str(p), partial(_load_file, p)) for p in paths]
    out: list[ProfileSummary] = []
    for name, source, load in loaders:
        try:
            profile = load()
        except ConfigError as exc:
            out.append(ProfileSummary(name=name, source=source, problem=str(exc)))
        else:
            out.append(
                ProfileSummary(
                    name=name,
                    source=source,
                    description=profile.description,
                    approval=profile.approval,
                )
            )
    return out


# --------------------------------------------------------------------------------------------
# Rendering


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = [header, tuple("-" * w for w in widths), *rows]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines
    )


def _items(values: Sequence[str], empty: str = "none") -> str:
    return ", ".join(values) if values else empty


def render_matrix(profile: Profile) -> str:
    """The profile as a table of section, setting and value (``sandcell policy show``)."""
    fs, net, rt, chk, val = (
        profile.filesystem,
        profile.network,
        profile.runtime,
        profile.checks,
        profile.validation,
    )

    def _limit(name: str) -> str:
        default = getattr(profile.limits.defaults, name)
        ceiling = getattr(profile.limits.ceilings, name)
        return f"{show_limit(name, default)} (ceiling {show_limit(name, ceiling)})"

    offers = "what the runtime offers (default: numpy, pandas, matplotlib)"
    shown = [offers if m == RUNTIME_IMPORTS else m for m in rt.allowed_imports]
    imports = "any" if "*" in rt.allowed_imports else _items(shown, "")
    severity = _items([f"{r}={s}" for r, s in chk.severity.items()], "each rule's own")
    schema = "none" if val.result_schema is None else _clip(json.dumps(dict(val.result_schema)))
    rows = [
        ("filesystem", "inputs", f"up to {fs.max_inputs}, read-only" if fs.max_inputs else "none"),
        ("filesystem", "workspace", f"writable, {_limit('workspace_bytes')}"),
        ("filesystem", "export_globs", _items(fs.export_globs)),
        ("network", "mode", net.mode),
        ("network", "hosts", _items([r.show() for r in net.allowlist.rules])),
        ("network", "allow_addresses", _items(net.allow_addresses)),
        *([("network", "resolve", _items(net.resolve))] if net.resolve else []),
        *(
            [
                (
                    "network",
                    "caps",
                    f"{net.max_connections} connections ({net.max_concurrent} "
                    f"at once), {net.max_mb_up} MiB up, {net.max_mb_down} MiB down",
                ),
            ]
            if net.mode == "allowlist"
            else []
        ),
        *(
            [("ingress", "ports", _items([str(p) for p in profile.ingress.ports]))]
            if profile.ingress.ports
            else []
        ),
        ("isolation", "backend", profile.isolation.backend),
        ("isolation", "minimum", profile.isolation.minimum),
    ]
    rows += [("limits", key, _limit(name)) for key, (name, _) in LIMIT_KEYS.items()]
    rows += [
        ("runtime", "languages", _items(rt.languages)),
        ("runtime", "runtime", rt.runtime),
        ("runtime", "runtimes", "any built" if rt.runtimes is None else _items(rt.runtimes)),
        ("runtime", "allowed_imports", "safe stdlib" + (f" + {imports}" if imports else "")),
        ("runtime", "allowed_packages", _items(rt.allowed_packages)),
        ("checks", "disabled", _items(chk.disabled)),
        ("checks", "severity", severity),
        ("validation", "result_schema", schema),
        ("validation", "result_file", val.result_file or "stdout"),
        ("approval", "approval", profile.approval),
    ]
    rows += [("tools", t.name, _tool_summary(t)) for t in profile.tools]
    head = f"profile {profile.name} ({profile.source}), sha256 {profile.sha256}"
    about = f"\n{profile.description.strip()}" if profile.description.strip() else ""
    return f"{head}{about}\n\n{_table(('section', 'setting', 'value'), rows)}\n"


def _tool_summary(tool: ToolDefinition) -> str:
    where = getattr(tool, "base_url", None) or getattr(tool, "url", None) or "stdio"
    allowed = [r.show() if not isinstance(r, str) else r for r in tool.allow]
    approval = dict(tool.approval) or tool.default_approval
    return _clip(f"{tool.kind} {where}; allow {_items(allowed)}; approval {approval}")


def render_list(summaries: Sequence[ProfileSummary]) -> str:
    """The profiles as a table (``sandcell policy list``); the default is marked."""
    rows = [
        (
            s.name + (" (default)" if s.name == DEFAULT_PROFILE else ""),
            s.approval or "-",
            s.source,
            _clip(s.description.strip().splitlines()[0] if s.description.strip() else "")
            if s.problem is None
            else f"UNUSABLE: {s.problem}",
        )
        for s in summaries
    ]
    return _table(("name", "approval", "source", "description"), rows) + "\n"


def _clip(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
