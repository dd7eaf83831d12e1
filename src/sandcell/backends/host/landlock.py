"""Landlock, host side: probe the kernel, and build the plan the in-sandbox boot step applies.

Landlock cannot be applied by the host before bubblewrap starts (a landlocked process may not
mount anything, and bwrap has to build the sandbox's mounts), so it is applied from inside the
sandbox by :mod:`sandcell.backends.inside._boot`, a standalone script that runs right before
the untrusted program. This module only decides *what* it applies, as pure data:

* :func:`probe_abi` asks the kernel which Landlock ABI it offers (cached);
* :func:`require` turns the request's ``landlock`` setting into an ABI or a refusal;
* :func:`build_plan` lists the sandbox paths and their rights; :class:`LandlockPlan` compiles them
  into the ruleset masks for its ABI and serialises everything into ``plan.json``
  (:meth:`LandlockPlan.to_json`, or :func:`boot_plan_json` with the boot's other duties);
* :func:`boot_command` is the command line bwrap must run.

Rights by category (each masked by what the ABI handles; on a path that is not a directory the
boot keeps only the rights that apply to files):

* ``read_exec``: read files, list directories, execute;
* ``read_only``: read files, list directories;
* ``read_write``: everything Landlock handles except creating device nodes.

Security limitations: Landlock is applied after the interpreter started, so the interpreter's own
startup (and ``site``) is not landlocked; it runs no user code, and seccomp, the namespaces and the
read-only mounts are the outer walls that hold during it. Landlock rules only ever add rights to a
path and everything below it, so a read-only path under a writable one stays writable. TCP is the
only network protocol Landlock restricts (UDP and raw sockets are left to the empty network
namespace and seccomp). Under ABI 1 a file can never be renamed or hard-linked into another
directory (no ``REFER`` right), under ABI < 3 truncation is not controlled, under ABI < 4 TCP is
not restricted and under ABI < 6 signals and abstract unix sockets are not scoped; the plan and
:func:`describe` say which applies.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sandcell.backends import inside
from sandcell.errors import ConfigError, IsolationUnavailable

# -- kernel constants (include/uapi/linux/landlock.h) ----------------------------------------

CREATE_RULESET_VERSION = 1 << 0

ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_WRITE_FILE = 1 << 1
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
ACCESS_FS_REMOVE_DIR = 1 << 4
ACCESS_FS_REMOVE_FILE = 1 << 5
ACCESS_FS_MAKE_CHAR = 1 << 6
ACCESS_FS_MAKE_DIR = 1 << 7
ACCESS_FS_MAKE_REG = 1 << 8
ACCESS_FS_MAKE_SOCK = 1 << 9
ACCESS_FS_MAKE_FIFO = 1 << 10
ACCESS_FS_MAKE_BLOCK = 1 << 11
ACCESS_FS_MAKE_SYM = 1 << 12
ACCESS_FS_REFER = 1 << 13  # ABI 2
ACCESS_FS_TRUNCATE = 1 << 14  # ABI 3
ACCESS_FS_IOCTL_DEV = 1 << 15  # ABI 5

ACCESS_NET_BIND_TCP = 1 << 0  # ABI 4
ACCESS_NET_CONNECT_TCP = 1 << 1  # ABI 4

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

# The rights a path-beneath rule may carry on a file (anything else is for directories only, and
# the kernel rejects a rule on a file that names one).
ACCESS_FILE = ACCESS_FS_EXECUTE | ACCESS_FS_WRITE_FILE | ACCESS_FS_READ_FILE
ACCESS_FILE |= ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV

_FS_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM

RIGHTS_READ_ONLY = ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR
RIGHTS_READ_EXEC = RIGHTS_READ_ONLY | ACCESS_FS_EXECUTE
# Execute stays allowed in writable places: agents build and run binaries in /work, and with an
# interpreter at hand forbidding execve there would not stop any code from running. Device nodes
# are never created on purpose (no CAP_MKNOD and nodev mounts already refuse it; this says it too).
RIGHTS_READ_WRITE = (_FS_ABI1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV) & ~(
    ACCESS_FS_MAKE_CHAR | ACCESS_FS_MAKE_BLOCK
)

# -- the sandbox layout this module plans for ----------------------------------------------

SANDBOX_DIR = "/sandcell"
"""Read-only control directory: the boot script, the plan and the program."""
SANDBOX_BOOT = f"{SANDBOX_DIR}/boot.py"
SANDBOX_PLAN = f"{SANDBOX_DIR}/plan.json"
BOOT_SCRIPT = inside.BOOT_SCRIPT
"""The boot script on the host, to be copied to :data:`SANDBOX_BOOT`."""
DISPLAY_SCRIPT = inside.DISPLAY_SCRIPT
"""The rich-output module on the host, shipped compiled for runs that ask for display."""
BOOT_FAILED_STATUS = 125
"""Exit status of the boot when it could not apply a layer it was asked for."""
PLAN_FORMAT = 1

DEV_READ_WRITE = ("/dev/null", "/dev/zero", "/dev/full", "/dev/shm", "/dev/pts")
"""``/dev/shm`` is a directory on the sandbox's private ``/dev``; POSIX semaphores (hence
``multiprocessing`` locks, queues and pools) are created there. ``/dev/pts`` is the sandbox's
own devpts instance (bubblewrap mounts a new one; ``/dev/ptmx`` links into it): pseudo-terminals
for a session's terminals (:mod:`sandcell.sessions.processes`), none of the host's."""
DEV_READ_ONLY = ("/dev/urandom", "/dev/random")
ETC_FILES = ("/etc/passwd", "/etc/group", "/etc/hosts", "/etc/nsswitch.conf")
"""The synthetic ``/etc`` files of the sandbox, read by ``id``, ``getpass`` and name resolution."""

_FIX = (
    "use a kernel >= 5.13 with CONFIG_SECURITY_LANDLOCK=y and 'landlock' in the lsm= boot "
    "parameter, or run with landlock disabled"
)

# landlock_create_ruleset, landlock_add_rule, landlock_restrict_self. These come from the generic
# syscall table (asm-generic/unistd.h), which every architecture listed here shares.
_SYSCALL_NR: Mapping[str, tuple[int, int, int]] = {
    machine: (444, 445, 446)
    for machine in (
        "x86_64",
        "aarch64",
        "arm64",
        "i386",
        "i686",
        "armv7l",
        "armv8l",
        "riscv64",
        "ppc64le",
        "s390x",
        "loongarch64",
    )
}


# -- probing ----------------------------------------------------------------------------------


@functools.cache
def _probe() -> tuple[int | None, str]:
    """(ABI, "") when the kernel offers Landlock, else (None, why not)."""
    if not sys.platform.startswith("linux"):
        return None, f"Landlock is a Linux feature and this is {sys.platform}"
    machine = os.uname().machine
    numbers = _SYSCALL_NR.get(machine)
    if numbers is None:
        return None, f"sandcell does not know the Landlock syscall numbers of {machine}"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as exc:  # pragma: no cover - a Linux without a C library
        return None, f"cannot load the C library to call Landlock: {exc}"
    abi = int(
        libc.syscall(
            ctypes.c_long(numbers[0]),
            None,
            ctypes.c_size_t(0),
            ctypes.c_uint32(CREATE_RULESET_VERSION),
        )
    )
    if abi >= 1:
        return abi, ""
    err = ctypes.get_errno()
    if err == errno.ENOSYS:
        return None, "the kernel has no Landlock support (landlock_create_ruleset: ENOSYS)"
    if err == errno.EOPNOTSUPP:
        return None, (
            "Landlock is built into the kernel but not enabled at boot "
            "(landlock_create_ruleset: EOPNOTSUPP)"
        )
    name = errno.errorcode.get(err, str(err))
    return None, f"landlock_create_ruleset failed with {name} ({os.strerror(err)})"


def probe_abi() -> int | None:
    """The Landlock ABI version the kernel offers, or None without Landlock. Cached."""
    return _probe()[0]


def require(mode: bool | None) -> int | None:
    """The ABI to use for a request's ``landlock`` setting.

    ``True`` requires Landlock (raises :class:`IsolationUnavailable` without it), ``None`` uses it
    where the kernel has it, ``False`` turns it off (always None).
    """
    if mode is False:
        return None
    abi, reason = _probe()
    if abi is None and mode is True:
        raise IsolationUnavailable("landlock", reason, fix=_FIX)
    return abi


# -- the plan ---------------------------------------------------------------------------------


def handled_fs(abi: int) -> int:
    """The filesystem rights a ruleset of this ABI handles (denies unless a rule allows)."""
    rights = _FS_ABI1
    if abi >= 2:
        rights |= ACCESS_FS_REFER
    if abi >= 3:
        rights |= ACCESS_FS_TRUNCATE
    if abi >= 5:
        rights |= ACCESS_FS_IOCTL_DEV
    return rights


def handled_net(abi: int, *, deny_tcp: bool) -> int:
    """Network rights handled: with no net rule added, handled means denied outright."""
    if abi >= 4 and deny_tcp:
        return ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP
    return 0


def scopes(abi: int, *, signals: bool, abstract_unix: bool) -> int:
    """IPC scopes: the code may not signal, nor reach abstract unix sockets of, processes outside
    its Landlock domain."""
    if abi < 6:
        return 0
    return (SCOPE_SIGNAL if signals else 0) | (SCOPE_ABSTRACT_UNIX_SOCKET if abstract_unix else 0)


def _check_paths(name: str, paths: object) -> None:
    if not isinstance(paths, tuple):
        raise ConfigError(f"landlock plan: {name} must be a tuple of paths, got {paths!r}")
    for p in paths:
        if not isinstance(p, str) or not p.startswith("/") or "\x00" in p:
            raise ConfigError(f"landlock plan: {name} holds {p!r}, which is not an absolute path")


@dataclass(frozen=True, slots=True, kw_only=True)
class LandlockPlan:
    """What the boot step applies inside the sandbox, for one ABI. Pure data."""

    read_exec: tuple[str, ...]
    read_only: tuple[str, ...]
    read_write: tuple[str, ...]
    abi: int
    list_dirs: tuple[str, ...] = ()
    """Directories whose listing (only) is allowed, beneath them too: ``/`` so that ``ls /`` works;
    reading a file still needs one of the other rules."""
    deny_tcp: bool = True
    scope_signals: bool = True
    scope_abstract_unix: bool = True
    connect_tcp_ports: tuple[int, ...] = ()
    """TCP ports the program may still connect to where TCP is denied (ABI >= 4): the egress
    bridge's, which only the bridge can listen on (binding stays denied)."""
    serve_tcp_ports: tuple[int, ...] = ()
    """TCP ports the program may bind (and connect to) where TCP is denied: a session's
    ``[ingress] ports``, which only the ingress agent reaches from outside the sandbox."""
    required: bool = True
    """When True the boot refuses to start the program if any step fails (exit status 125);
    when False it warns on stderr and runs the program without Landlock."""

    def __post_init__(self) -> None:
        if isinstance(self.abi, bool) or not isinstance(self.abi, int) or self.abi < 1:
            raise ConfigError(f"landlock plan: abi must be a positive integer, got {self.abi!r}")
        _check_paths("read_exec", self.read_exec)
        _check_paths("read_only", self.read_only)
        _check_paths("read_write", self.read_write)
        _check_paths("list_dirs", self.list_dirs)
        for name in ("connect_tcp_ports", "serve_tcp_ports"):
            ports = getattr(self, name)
            if not isinstance(ports, tuple) or not all(
                type(p) is int and 0 < p < 65536 for p in ports
            ):
                raise ConfigError(f"landlock plan: {name} must be a tuple of ports, got {ports!r}")

    @property
    def handled_fs(self) -> int:
        return handled_fs(self.abi)

    @property
    def handled_net(self) -> int:
        return handled_net(self.abi, deny_tcp=self.deny_tcp)

    @property
    def scoped(self) -> int:
        return scopes(self.abi, signals=self.scope_signals, abstract_unix=self.scope_abstract_unix)

    @property
    def rules(self) -> tuple[tuple[str, int], ...]:
        """(path, allowed rights) per distinct path, rights of repeated paths merged, in order."""
        handled = self.handled_fs
        merged: dict[str, int] = {}
        for paths, rights in (
            (self.list_dirs, ACCESS_FS_READ_DIR),
            (self.read_exec, RIGHTS_READ_EXEC),
            (self.read_only, RIGHTS_READ_ONLY),
            (self.read_write, RIGHTS_READ_WRITE),
        ):
            for p in paths:
                merged[p] = merged.get(p, 0) | (rights & handled)
        return tuple(merged.items())

    @property
    def net_rules(self) -> tuple[tuple[int, int], ...]:
        """(port, allowed rights) of the TCP ports still reachable where TCP is handled."""
        if not self.handled_net & ACCESS_NET_CONNECT_TCP:
            return ()
        rights = dict.fromkeys(self.connect_tcp_ports, ACCESS_NET_CONNECT_TCP)
        for port in self.serve_tcp_ports:
            rights[port] = rights.get(port, 0) | ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP
        return tuple(rights.items())

    def ruleset(self) -> dict[str, Any]:
        """The compiled form the boot consumes: masks, (path, rights) rules and, when some TCP
        port stays reachable, (port, rights) rules."""
        compiled: dict[str, Any] = {
            "handled_fs": self.handled_fs,
            "handled_net": self.handled_net,
            "scoped": self.scoped,
            "file_rights": ACCESS_FILE & self.handled_fs,
            "rules": [[p, r] for p, r in self.rules],
        }
        if self.net_rules:
            compiled["net_rules"] = [[p, r] for p, r in self.net_rules]
        return compiled

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "abi": self.abi,
            "required": self.required,
            "read_exec": list(self.read_exec),
            "read_only": list(self.read_only),
            "read_write": list(self.read_write),
            "list_dirs": list(self.list_dirs),
            "deny_tcp": self.deny_tcp,
            "scope_signals": self.scope_signals,
            "scope_abstract_unix": self.scope_abstract_unix,
        }
        if self.connect_tcp_ports:
            doc["connect_tcp_ports"] = list(self.connect_tcp_ports)
        if self.serve_tcp_ports:
            doc["serve_tcp_ports"] = list(self.serve_tcp_ports)
        doc["ruleset"] = self.ruleset()
        return doc

    def to_json(self) -> str:
        """A complete ``plan.json`` for the boot that applies only this plan."""
        return boot_plan_json(plan=self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LandlockPlan:
        try:
            plan = cls(
                read_exec=tuple(data["read_exec"]),
                read_only=tuple(data["read_only"]),
                read_write=tuple(data["read_write"]),
                list_dirs=tuple(data.get("list_dirs", ())),
                abi=data["abi"],
                deny_tcp=bool(data["deny_tcp"]),
                scope_signals=bool(data["scope_signals"]),
                scope_abstract_unix=bool(data["scope_abstract_unix"]),
                connect_tcp_ports=tuple(data.get("connect_tcp_ports", ())),
                serve_tcp_ports=tuple(data.get("serve_tcp_ports", ())),
                required=bool(data["required"]),
            )
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"landlock plan: malformed ({exc!r})") from exc
        # The compiled part is derived; a mismatch means a hand-edited or foreign plan.
        compiled = data.get("ruleset")
        if compiled is not None and compiled != plan.ruleset():
            raise ConfigError("landlock plan: the compiled ruleset does not match the paths")
        return plan

    @classmethod
    def from_json(cls, text: str) -> LandlockPlan:
        """The Landlock part of a ``plan.json``; raises ConfigError when it has none."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"landlock plan: not JSON ({exc})") from exc
        if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
            raise ConfigError(f"landlock plan: not a sandcell plan of format {PLAN_FORMAT}")
        section = doc.get("landlock")
        if not isinstance(section, dict):
            raise ConfigError("landlock plan: this plan.json applies no Landlock")
        return cls.from_dict(section)


def _unique(paths: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(paths))


def build_plan(
    *,
    runtime_paths: Sequence[str],
    input_dir: str | None,
    work_dir: str = "/work",
    tmp_dir: str = "/tmp",
    abi: int,
    control_dir: str = SANDBOX_DIR,
    etc_files: Sequence[str] = ETC_FILES,
    required: bool = True,
    extra_read_only: Sequence[str] = (),
    connect_tcp_ports: Sequence[int] = (),
    serve_tcp_ports: Sequence[int] = (),
) -> LandlockPlan:
    """The plan for one sandbox: runtime read+execute, inputs and control read-only, work and tmp
    writable, plus the few device files and ``/etc`` files programs expect. Paths missing inside
    the sandbox are skipped by the boot. ``extra_read_only`` (the run's socket directory) is
    readable too; ``connect_tcp_ports`` stay reachable where TCP is denied, and
    ``serve_tcp_ports`` (a session's ingress ports) may be bound and reached."""
    read_only = [*([input_dir] if input_dir else []), control_dir, "/proc", *DEV_READ_ONLY]
    read_only += [*etc_files, *extra_read_only]
    return LandlockPlan(
        read_exec=_unique(runtime_paths),
        read_only=_unique(read_only),
        read_write=_unique([work_dir, tmp_dir, *DEV_READ_WRITE]),
        list_dirs=("/",),
        abi=abi,
        connect_tcp_ports=tuple(dict.fromkeys(connect_tcp_ports)),
        serve_tcp_ports=tuple(dict.fromkeys(serve_tcp_ports)),
        required=required,
    )


def describe(plan: LandlockPlan) -> str:
    """One line for the enforcement report."""
    parts = [f"landlock ABI {plan.abi}: fs restricted to {len(plan.rules)} paths"]
    if plan.handled_net and plan.net_rules:
        connect = [str(p) for p, r in plan.net_rules if not r & ACCESS_NET_BIND_TCP]
        serve = [str(p) for p, r in plan.net_rules if r & ACCESS_NET_BIND_TCP]
        parts.append(
            "tcp denied but "
            + " and ".join(
                [
                    *([f"connect to port {', '.join(connect)}"] if connect else []),
                    *([f"bind and connect to port {', '.join(serve)}"] if serve else []),
                ]
            )
        )
    elif plan.handled_net:
        parts.append("tcp denied")
    elif plan.deny_tcp:
        parts.append(f"tcp not restricted (needs ABI 4, kernel has {plan.abi})")
    else:
        parts.append("tcp allowed")
    scoped = plan.scoped
    if scoped == SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET:
        parts.append("signals and abstract unix sockets scoped")
    elif scoped == SCOPE_SIGNAL:
        parts.append("signals scoped")
    elif scoped == SCOPE_ABSTRACT_UNIX_SOCKET:
        parts.append("abstract unix sockets scoped")
    elif plan.abi < 6 and (plan.scope_signals or plan.scope_abstract_unix):
        parts.append(f"no IPC scoping (needs ABI 6, kernel has {plan.abi})")
    return ", ".join(parts)


# -- what the host writes and runs ----------------------------------------------------------


def boot_plan_json(
    *,
    plan: LandlockPlan | None,
    status_fd: int | None = None,
    input_links: Sequence[tuple[str, str]] = (),
    python_paths: Sequence[str] = (),
    display: tuple[str, str] | None = None,
    bridge: Sequence[str] | None = None,
    ingress: Sequence[str] | None = None,
    supervised: bool = False,
) -> str:
    """The ``plan.json`` the boot reads.

    ``plan`` None runs the program without Landlock. ``status_fd``: a descriptor the boot writes
    one byte to, then closes, right before the program starts (every other inherited descriptor
    above 2 is closed). ``input_links``: (link, target) symlinks the boot creates, a relative link
    being relative to the working directory. ``display``: (output directory, compiled display
    module) inside the sandbox, to run a python program as a notebook cell. ``bridge``: a
    standalone script and its arguments (the egress bridge, ``run_sockets``) that the boot runs
    in a child of its own before the program, waiting for the line it prints once it listens.
    ``ingress``: the same for a session's ingress agent (``run_sockets``), started after it.
    ``supervised``: the sandbox's pid 1 above the boot waits for the program and reports its
    wait status (the native init, ``inside/_init.c``), so the boot runs the program in its own
    process instead of forking a supervisor; only with ``status_fd``, without a bridge or an
    ingress agent (those are children of the supervising pid 1).
    """
    if status_fd is not None and (isinstance(status_fd, bool) or status_fd < 3):
        raise ConfigError(f"boot plan: status_fd must be a descriptor above 2, got {status_fd!r}")
    if supervised and (status_fd is None or bridge is not None or ingress is not None):
        raise ConfigError("boot plan: supervised needs a status_fd and no bridge nor ingress")
    doc = {
        "format": PLAN_FORMAT,
        "landlock": plan.to_dict() if plan is not None else None,
        "status_fd": status_fd,
        "input_links": [[link, target] for link, target in input_links],
        "python_paths": list(python_paths),
        "display": None if display is None else {"dir": display[0], "module": display[1]},
    }
    if bridge is not None:
        if not bridge or not all(isinstance(a, str) for a in bridge):
            raise ConfigError(f"boot plan: bridge must be a script and its arguments: {bridge!r}")
        doc["bridge"] = list(bridge)
    if ingress is not None:
        if not ingress or not all(isinstance(a, str) for a in ingress):
            raise ConfigError(f"boot plan: ingress must be a script and its arguments: {ingress!r}")
        doc["ingress"] = list(ingress)
    if supervised:
        doc["supervised"] = True
    return json.dumps(doc, indent=1) + "\n"


def boot_bytecode(boot_path: str = SANDBOX_BOOT, *, script: Path = BOOT_SCRIPT) -> bytes:
    """The boot script compiled to a ``.pyc`` file's bytes, to run as ``python -I boot.pyc ...``.

    Saves compiling the boot on every run (about 2 ms). Only valid for an interpreter of the
    exact version running this function (the file starts with its magic number, and a different
    version refuses it): use it when the runtime's interpreter is sandcell's own, else run the
    ``.py``. Tracebacks name ``boot_path``. ``script``: another standalone module to compile
    the same way (:data:`DISPLAY_SCRIPT`).
    """
    # Imported here: only the hosts that precompile pay for them.
    import importlib.util
    import marshal

    source = script.read_bytes()
    code = compile(source, boot_path, "exec", dont_inherit=True)
    # The .pyc header: magic, flags (0: timestamp-based), mtime, source size. Run directly, only
    # the magic is checked; a zero mtime keeps the bytes reproducible.
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") * 2
    return header + (len(source) & 0xFFFFFFFF).to_bytes(4, "little") + marshal.dumps(code)


def boot_command(
    python: str,
    target: Sequence[str],
    *,
    mode: Literal["python", "exec"],
    boot_path: str = SANDBOX_BOOT,
    plan_path: str = SANDBOX_PLAN,
) -> list[str]:
    """The command bwrap runs. ``mode="python"``: ``target`` is the script and its arguments, run
    in-process as ``__main__``; ``mode="exec"``: ``target`` is an argv executed with ``execv``
    (absolute program path). ``-I`` but not ``-S``: site must run so the runtime's site-packages
    are importable."""
    if not target:
        raise ConfigError("boot command: nothing to run")
    return [python, "-I", boot_path, plan_path, mode, *target]
