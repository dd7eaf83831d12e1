"""The sections of a profile: frozen dataclasses that check themselves when built.

Each section is one part of the permission matrix (filesystem, network, limits, runtime, checks,
validation). Its defaults are what an absent section or key means, and they deny: they are
exactly what the built-in ``strict`` profile says. Each ``__post_init__`` refuses an invalid
value with :class:`SectionError`, naming the field (and the list item) so that the loader in
:mod:`sandcell.policy.profiles` can point at the line of the profile file.
"""

from __future__ import annotations

import importlib
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from fnmatch import translate
from functools import cache
from types import MappingProxyType
from typing import Literal, get_args

from sandcell.artifacts import validate_globs
from sandcell.backends.registry import LADDER, rank
from sandcell.errors import ConfigError
from sandcell.network.allowlist import (
    Allowlist,
    IPAddress,
    IPNetwork,
    host_problem,
    normalise_host,
    parse_network,
    parse_rule,
)
from sandcell.spec import LANGUAGES, Language, Limits, MiB

# The same literals as ``sandcell.policy.checks.findings``, spelled out here rather than imported:
# importing that package pulls in every check, and the checks may one day need a Profile.
Severity = Literal["info", "warning", "deny"]
SEVERITIES: tuple[Severity, ...] = get_args(Severity)
Approval = Literal["never", "on_findings", "always"]
APPROVAL_MODES: tuple[Approval, ...] = get_args(Approval)
NetworkMode = Literal["none", "allowlist"]

STRICT_CEILINGS = Limits(
    wall_time_s=60.0,
    cpu_time_s=120,
    memory_bytes=1024 * MiB,
    max_pids=128,
    max_open_files=1024,
    max_file_bytes=256 * MiB,
    workspace_bytes=512 * MiB,
    workspace_inodes=65536,
    tmp_bytes=256 * MiB,
    stdout_bytes=8 * MiB,
    stderr_bytes=8 * MiB,
)
"""The ceilings a profile gets when it names none (those of ``strict``)."""

LIMIT_KEYS: Mapping[str, tuple[str, int]] = MappingProxyType(
    {
        "wall_time_s": ("wall_time_s", 1),
        "cpu_time_s": ("cpu_time_s", 1),
        "memory_mb": ("memory_bytes", MiB),
        "max_pids": ("max_pids", 1),
        "max_open_files": ("max_open_files", 1),
        "max_file_mb": ("max_file_bytes", MiB),
        "workspace_mb": ("workspace_bytes", MiB),
        "workspace_inodes": ("workspace_inodes", 1),
        "tmp_mb": ("tmp_bytes", MiB),
        "stdout_bytes": ("stdout_bytes", 1),
        "stderr_bytes": ("stderr_bytes", 1),
    }
)
"""TOML key under ``[limits]`` and ``[ceilings]`` -> (:class:`Limits` field, unit in bytes)."""

_RULE_ID = re.compile(r"^(py|sh|js)\.[a-z0-9-]+$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PACKAGE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


class SectionError(ConfigError):
    """A field of a section is invalid: ``field`` (and ``item``, for a list) say which."""

    def __init__(self, reason: str, field: str, item: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.field, self.item = reason, field, item


def glob_covers(allowed: tuple[str, ...], requested: tuple[str, ...]) -> bool:
    """Whether every path the requested glob matches is matched by the allowed glob.

    Both are split into components. Conservative where unsure: a wildcard in a requested
    component is covered only by ``*``, by the same text, or by ``*<literal suffix>`` when the
    requested component ends with that suffix.
    """
    if not allowed:
        return not requested
    head, rest = allowed[0], allowed[1:]
    if head == "**":  # any number of components, a requested '**' included
        return any(glob_covers(rest, requested[i:]) for i in range(len(requested) + 1))
    if not requested or requested[0] == "**":
        return False
    part = requested[0]
    if any(ch in part for ch in "*?["):
        suffix = head[1:]
        ok = head in (part, "*") or (
            head.startswith("*")
            and not any(ch in suffix for ch in "*?[]")
            and part.endswith(suffix)
        )
    else:
        ok = _translate(head).match(part) is not None
    return ok and glob_covers(rest, requested[1:])


@cache
def _translate(component: str) -> re.Pattern[str]:
    return re.compile(translate(component))


DEFAULT_EXPORT_GLOBS: tuple[str, ...] = (
    "out/**",
    "*.json",
    "*.csv",
    "*.txt",
    "*.md",
    "*.png",
    "*.svg",
)
"""What strict (and an absent ``export_globs``) lets leave: files under out/, and results,
charts and tables at the top of the working directory."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FilesystemRules:
    """What a run may see and take out, besides its own working directory."""

    max_inputs: int = 8
    """Host files or directories a run may be given, read-only. ``0`` allows none; absent: 8.
    (The workspace size is a limit: ``workspace_mb`` under ``[limits]`` and ``[ceilings]``.)"""
    export_globs: tuple[str, ...] = DEFAULT_EXPORT_GLOBS
    """Globs a requested export must be covered by (:meth:`Profile.allows_export`). Empty or
    absent: no export is allowed."""

    def __post_init__(self) -> None:
        inputs = self.max_inputs
        if isinstance(inputs, bool) or not isinstance(inputs, int) or not 0 <= inputs <= 1000:
            raise SectionError("max_inputs must be an integer from 0 to 1000", "max_inputs")
        for glob in self.export_globs:
            try:
                validate_globs([glob])
            except ConfigError as exc:
                raise SectionError(str(exc), "export_globs", glob) from None
        object.__setattr__(self, "export_globs", validate_globs(self.export_globs))


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkRules:
    """What a run may reach: nothing, or the allowlisted hosts through its egress proxy."""

    mode: NetworkMode = "none"
    """``none`` (absent: the default): no network at all. ``allowlist``: only ``hosts``,
    through the run's egress proxy (:mod:`sandcell.network`, :mod:`sandcell.run_sockets`)."""
    hosts: tuple[str, ...] = ()
    """``host``, ``host:port[,port]``, ``*.domain`` under a registrable domain, or an IP literal
    (:mod:`sandcell.network.allowlist`). Empty or absent: none. Must be empty when ``mode`` is
    ``none``."""
    allow_addresses: tuple[str, ...] = ()
    """Non-public addresses or networks (``10.20.0.0/16``) that a listed name may resolve to.
    Empty or absent: listed names must resolve to public addresses."""
    resolve: tuple[str, ...] = ()
    """The proxy's own host entries, ``name=address[,address]``: a name listed here is not
    looked up (an internal mirror without public DNS). The addresses are checked like any
    answer: a non-public one needs ``allow_addresses``."""
    max_connections: int = 1024
    """Connections a run may open through its proxy, in all; one more is answered 429."""
    max_concurrent: int = 32
    """Connections open at once; one more is answered 503."""
    max_mb_up: int = 64
    """MiB the run may send through its proxy; reaching it closes the connection."""
    max_mb_down: int = 512
    """MiB the run may receive through its proxy; reaching it closes the connection."""
    allowlist: Allowlist = field(init=False, repr=False, compare=False)
    """``hosts`` and ``allow_addresses`` parsed: what the egress proxy checks against."""
    static_hosts: Mapping[str, tuple[IPAddress, ...]] = field(init=False, repr=False, compare=False)
    """``resolve`` parsed: normalised name -> its addresses."""

    def __post_init__(self) -> None:
        if self.mode not in get_args(NetworkMode):
            raise SectionError(
                f"unknown network mode {self.mode!r}; use 'none' or 'allowlist'", "mode"
            )
        for cap in ("max_connections", "max_concurrent", "max_mb_up", "max_mb_down"):
            value = getattr(self, cap)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20:
                raise SectionError(f"{cap} must be an integer from 1 to {1 << 20}", cap)
        if self.mode == "none" and self.hosts:
            raise SectionError(
                "hosts are listed but mode is 'none'; set mode = 'allowlist'", "hosts"
            )
        if self.mode == "none" and self.resolve:
            raise SectionError(
                "resolve entries are listed but mode is 'none'; set mode = 'allowlist'", "resolve"
            )
        static: dict[str, tuple[IPAddress, ...]] = {}
        for entry in self.resolve:
            name, sep, addresses = entry.partition("=")
            problem = host_problem(name.strip()) if sep else "give it as name=address[,address]"
            try:
                parsed = tuple(ipaddress.ip_address(a.strip()) for a in addresses.split(","))
            except ValueError:
                problem = problem or f"{addresses!r} is not a list of IP addresses"
            if problem or not sep:
                raise SectionError(f"resolve entry {entry!r}: {problem}", "resolve", entry)
            static[str(normalise_host(name.strip()))] = parsed
        object.__setattr__(self, "static_hosts", MappingProxyType(static))
        if self.mode == "none" and self.allow_addresses:
            raise SectionError(
                "allow_addresses are listed but mode is 'none'; set mode = 'allowlist'",
                "allow_addresses",
            )
        for host in self.hosts:
            problem = host_problem(host)
            if problem:
                raise SectionError(problem, "hosts", host)
        networks: list[IPNetwork] = []
        for text in self.allow_addresses:
            try:
                networks.append(parse_network(text))
            except ConfigError as exc:
                raise SectionError(str(exc), "allow_addresses", text) from None
        allowlist = Allowlist(
            rules=tuple(parse_rule(h) for h in self.hosts), allow_addresses=tuple(networks)
        )
        object.__setattr__(self, "allowlist", allowlist)


@dataclass(frozen=True, slots=True, kw_only=True)
class IsolationRules:
    """Which rungs of the isolation ladder (:mod:`sandcell.backends.registry`) a run may use."""

    backend: str = "namespaces"
    """The backend of a run that names none. Absent: ``namespaces``, or ``minimum`` when that is
    stronger."""
    minimum: str = "namespaces"
    """The weakest backend a run may ask for; a weaker one is refused, never upgraded.
    Absent: ``namespaces`` (any)."""

    def __post_init__(self) -> None:
        for key in ("backend", "minimum"):
            if getattr(self, key) not in LADDER:
                raise SectionError(
                    f"unknown {key} {getattr(self, key)!r}; use one of {', '.join(LADDER)}", key
                )
        if rank(self.backend) < rank(self.minimum):  # type: ignore[arg-type]
            raise SectionError(
                f"backend {self.backend!r} is weaker than the minimum {self.minimum!r}; "
                "raise backend or lower minimum",
                "backend",
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitRules:
    """The limits a run gets unless it asks otherwise, and the most it may ask for."""

    defaults: Limits = field(default_factory=Limits)
    """``[limits]``: a key that is absent takes the :class:`Limits` default."""
    ceilings: Limits = STRICT_CEILINGS
    """``[ceilings]``: a key that is absent takes the :data:`STRICT_CEILINGS` value. Every
    default must be at most its ceiling; a request above a ceiling is refused."""

    def __post_init__(self) -> None:
        for f in fields(Limits):
            default, ceiling = getattr(self.defaults, f.name), getattr(self.ceilings, f.name)
            if default > ceiling:
                raise SectionError(
                    f"limit {f.name} has a default of {show_limit(f.name, default)}, above "
                    f"its ceiling of {show_limit(f.name, ceiling)}; lower the limit or raise "
                    "the ceiling",
                    f.name,
                )


RUNTIME_IMPORTS = "@runtime"
"""In ``allowed_imports``: whatever the run's runtime offers."""
_RUNTIME = re.compile(r"[a-z][a-z0-9_-]{0,39}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeRules:
    """What may run, and what the program may import."""

    languages: tuple[Language, ...] = LANGUAGES
    """Languages allowed (python, bash, javascript, typescript). Empty: none. Absent: all four,
    as in strict (absent denies what strict denies)."""
    runtime: str = "analysis"
    """The runtime a run gets when it names none: a runtime built with ``sandcell runtime
    build`` (``minimal``, ``analysis``, ``datascience``, a user's lock), or ``default`` (the
    environment sandcell is installed in, with whatever that holds). Absent: ``analysis``,
    which ``scripts/install`` builds. Whether it is built is checked when a run needs it."""
    runtimes: tuple[str, ...] | None = None
    """The runtimes a run may ask for (``--runtime``); None (absent): any built one. The
    profile's own ``runtime`` is always allowed."""
    preload: tuple[str, ...] | None = None
    """Modules a warm template or pool of this profile imports ahead of the runs (trusted
    runtime code); None (absent): the warm start's own list (numpy, pandas)."""
    allowed_imports: tuple[str, ...] = ("@runtime",)
    """Top-level modules allowed beyond the safe standard library of the Python checks
    (:data:`sandcell.policy.checks.python_rules.SAFE_STDLIB`); ``"*"`` allows any;
    ``"@runtime"`` allows what the run's runtime offers (a built runtime: every module of its
    locked packages; ``default``: numpy, pandas, matplotlib). Empty: that safe set only. Absent:
    ``@runtime``, as in strict. Dotted names are refused: a submodule comes with its package."""
    allowed_packages: tuple[str, ...] = ()
    """Distributions from the local wheel cache (``sandcell packages add``) a run may import on
    top of the runtime; they are mounted read-only, never installed at run time. Empty or
    absent: none. The runtime's own packages need no entry."""

    def __post_init__(self) -> None:
        for lang in self.languages:
            if lang not in LANGUAGES:
                raise SectionError(
                    f"unknown language {lang!r}; use {', '.join(LANGUAGES)}", "languages", lang
                )
        for name in (self.runtime, *(self.runtimes or ())):
            if not _RUNTIME.fullmatch(name):
                raise SectionError(
                    f"{name!r} is not a runtime name; use 'default' or the name of a built "
                    "runtime (sandcell runtime list), for example 'datascience'",
                    "runtime",
                    name,
                )
        for module in self.preload or ():
            if not _MODULE.match(module):
                raise SectionError(f"{module!r} is not a module name", "preload", module)
        for module in self.allowed_imports:
            if module not in ("*", RUNTIME_IMPORTS) and not _MODULE.match(module):
                raise SectionError(
                    f"{module!r} is not a top-level module name (write 'os', not 'os.path': a "
                    "submodule gives access to its package), or '*' for any",
                    "allowed_imports",
                    module,
                )
        for package in self.allowed_packages:
            if not _PACKAGE.match(package):
                raise SectionError(
                    f"{package!r} is not a package name", "allowed_packages", package
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckRules:
    """Which static-check rules apply, and at what severity."""

    disabled: tuple[str, ...] = ()
    """Rule ids (``py.process``) that do not run. Empty or absent: every rule runs."""
    severity: Mapping[str, Severity] = field(default_factory=lambda: MappingProxyType({}))
    """Rule id -> severity replacing the rule's own. Empty or absent: each rule's own."""

    def __post_init__(self) -> None:
        for rule in (*self.disabled, *self.severity):
            if not _RULE_ID.match(rule):
                where = "disabled" if rule in self.disabled else "severity"
                raise SectionError(
                    f"{rule!r} is not a rule id (like 'py.process', 'sh.network' or 'js.process')",
                    where,
                    rule,
                )
        for rule, level in self.severity.items():
            if level not in SEVERITIES:
                raise SectionError(
                    f"unknown severity {level!r}; use {', '.join(SEVERITIES)}", "severity", rule
                )
            if rule in self.disabled:
                raise SectionError(
                    f"rule {rule!r} is both disabled and given a severity", "severity", rule
                )
        object.__setattr__(self, "severity", MappingProxyType(dict(self.severity)))


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationRules:
    """What the output of a run must look like."""

    result_schema: Mapping[str, object] | None = None
    """JSON Schema the declared result must satisfy. Absent: the result is not validated."""
    result_file: str | None = None
    """File, relative to the working directory, holding the result as JSON. Absent: stdout."""

    def __post_init__(self) -> None:
        if self.result_schema is not None:
            _check_schema(self.result_schema)
            object.__setattr__(self, "result_schema", MappingProxyType(dict(self.result_schema)))
        if self.result_file is not None:
            if any(ch in self.result_file for ch in "*?["):
                raise SectionError("result_file must be a path, not a glob", "result_file")
            try:
                validate_globs([self.result_file])
            except ConfigError as exc:
                raise SectionError(
                    str(exc).replace("export glob", "result_file"), "result_file"
                ) from None


def _check_schema(schema: object) -> None:
    def json_like(value: object) -> bool:
        if isinstance(value, dict):
            return all(isinstance(k, str) and json_like(v) for k, v in value.items())
        if isinstance(value, list):
            return all(json_like(v) for v in value)
        return value is None or isinstance(value, str | int | float | bool)

    if not isinstance(schema, Mapping) or not json_like(dict(schema)):
        raise SectionError(
            "result_schema must be a table of JSON values (no dates)", "result_schema"
        )
    # jsonschema has no type information: imported by name so its values are plainly Any.
    validators = importlib.import_module("jsonschema.validators")
    exceptions = importlib.import_module("jsonschema.exceptions")
    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as exc:
        raise SectionError(
            f"result_schema is not a valid JSON Schema: {exc.message}", "result_schema"
        ) from None


BinaryChanges = Literal["refuse", "allow"]
BINARY_CHANGES: tuple[BinaryChanges, ...] = get_args(BinaryChanges)
DEFAULT_LEAVE_OUT = (".env", ".env.*", ".netrc", "_netrc", ".git-credentials")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkdirRules:
    """The patch workflow (``--workdir-from``, ``sandcell changes``; docs/changes.md)."""

    binary_changes: BinaryChanges = "refuse"
    """Whether ``sandcell changes apply`` writes a file whose content is binary (a NUL byte,
    not UTF-8, over 1 MiB): a person cannot review it as a diff. Absent: ``refuse``."""
    leave_out: tuple[str, ...] = DEFAULT_LEAVE_OUT
    """Names (``fnmatch`` patterns, no ``/``) of files never copied into the sandbox, at any
    depth: credentials such as ``.env`` and ``.netrc``. Git config files are always copied
    without their credentials. Absent: :data:`DEFAULT_LEAVE_OUT`; empty: no file by name."""

    def __post_init__(self) -> None:
        if self.binary_changes not in BINARY_CHANGES:
            raise SectionError(
                f"unknown binary_changes {self.binary_changes!r}; use "
                f"{' or '.join(BINARY_CHANGES)}",
                "binary_changes",
            )
        for pattern in self.leave_out:
            if not pattern or "/" in pattern or pattern in (".", ".."):
                raise SectionError(
                    f"leave_out {pattern!r} must be a file name or a pattern of one (no '/'), "
                    "matched at any depth",
                    "leave_out",
                    pattern,
                )


MAX_INGRESS_PORTS = 16
RESERVED_PORTS = (3128,)
"""The egress bridge's loopback port (``run_sockets.PROXY_PORT``): never a program's server."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IngressRules:
    """Ports of a session's sandbox reachable from outside, only through sandcell (a server the
    program starts on 127.0.0.1:PORT; docs/sessions.md, "Ports"). The sandbox still has no
    network: the host reaches these ports through an agent inside it. Absent: none."""

    ports: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.ports) > MAX_INGRESS_PORTS:
            raise SectionError(
                f"at most {MAX_INGRESS_PORTS} ingress ports, got {len(self.ports)}", "ports"
            )
        for port in self.ports:
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
                raise SectionError(f"ingress port {port!r} is not 1-65535", "ports", str(port))
            if port in RESERVED_PORTS:
                raise SectionError(
                    f"ingress port {port} is the egress bridge's inside the sandbox",
                    "ports",
                    str(port),
                )
        if len(set(self.ports)) != len(self.ports):
            raise SectionError("ingress ports are listed more than once", "ports")


def show_limit(limit: str, value: float) -> str:
    """A value of the :class:`Limits` field ``limit`` for people: ``512 MiB``, ``30 s``."""
    if limit.endswith("_bytes"):
        for unit, size in (("GiB", 1024 * MiB), ("MiB", MiB), ("KiB", 1024)):
            if value >= size and value % size == 0:
                return f"{plain(value // size)} {unit}"
        return f"{plain(value)} bytes"
    return f"{plain(value)} s" if limit.endswith("_s") else plain(value)


def plain(value: float) -> str:
    """A number as written in a profile: ``2147483648``, ``2.5``, never ``2.14748e+09``."""
    return str(int(value)) if value == int(value) else repr(float(value))
