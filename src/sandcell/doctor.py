"""``sandcell doctor``: what this host can enforce, layer by layer, and how to fix what it cannot.

The report is what a user pastes into a bug report, so every check says what it found (versions,
paths, sysctl values, the stderr of a failed probe) and, when it fails, the fix. The checks reuse
the probes the backends themselves use, so the doctor and a real run never disagree. No check
raises: a crash inside one becomes a failed check, and the rest of the report still comes out.

Required checks decide :attr:`DoctorReport.can_run` (a default, strict run can work here); the
others (Landlock, the bash runtime, one row per backend of the isolation ladder) are
informational.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import pwd
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from sandcell.backends.host import bubblewrap as bw
from sandcell.backends.host import cgroups, landlock, seccomp
from sandcell.backends.registry import LADDER, PROTECTS, BackendName, probe
from sandcell.errors import ConfigError, IsolationUnavailable
from sandcell.runtimes import _root_layout, bash_runtime, python_runtime

_PROBE_TIMEOUT_S = 10
_PR_GET_SECCOMP = 21
_RLIMITS_HINT = "or ask for the weaker mode by name (--isolation rlimits)"
_REPORT = "report this output to the sandcell maintainers"


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One line of the report."""

    name: str
    ok: bool
    detail: str
    fix: str | None
    """How to fix the host; set on every failed check."""
    required: bool
    """Whether a default (strict) run needs this check to pass."""


@dataclass(frozen=True, slots=True)
class DoctorReport:
    """Every check, in report order."""

    checks: tuple[Check, ...]

    @property
    def blockers(self) -> tuple[Check, ...]:
        """Required checks that failed."""
        return tuple(c for c in self.checks if c.required and not c.ok)

    @property
    def can_run(self) -> bool:
        """Whether a default strict run can work on this host."""
        return not self.blockers

    def to_dict(self) -> dict[str, Any]:
        return {"can_run": self.can_run, "checks": [asdict(c) for c in self.checks]}


def _uid_text(euid: int) -> str:
    try:
        name = pwd.getpwuid(euid).pw_name
    except KeyError:
        name = "no passwd entry"
    return "root (uid 0)" if euid == 0 else f"uid {euid} ({name})"


def _version_check() -> Check:
    try:
        version = metadata.version("sandcell")
    except metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    detail = f"{version}, Python {platform.python_version()} at {sys.executable}"
    return Check(name="sandcell", ok=True, detail=detail, fix=None, required=False)


def _kernel_check() -> Check:
    linux = sys.platform.startswith("linux")
    detail = (
        f"{platform.system()} {platform.release()} {platform.machine()}, "
        f"running as {_uid_text(os.geteuid())}"
    )
    fix = None if linux else "sandcell's namespace backend needs a Linux host (or a Linux VM)"
    return Check(name="kernel", ok=linux, detail=detail, fix=fix, required=True)


def _bwrap_check(found: bw.Bwrap | IsolationUnavailable) -> Check:
    if isinstance(found, IsolationUnavailable):
        return Check(name="bubblewrap", ok=False, detail=found.reason, fix=found.fix, required=True)
    detail = f"{found.version_text} at {found.path} ({found.source})"
    return Check(name="bubblewrap", ok=True, detail=detail, fix=None, required=True)


def _read_sysctl(path: Path) -> int | None:
    """The integer in a sysctl file, or None when the file does not exist on this kernel."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _probe_userns(bwrap: str) -> str | None:
    """Start the smallest sandbox a run needs; None on success, else why it failed."""
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--ro-bind", "/usr", "/usr"]
    # The same root layout the runtimes build: merged-/usr links as links, real directories bound.
    dirs, links = _root_layout()
    for link, target in links:
        argv += ["--symlink", target, link]
    for d in dirs:
        argv += ["--ro-bind", d, d]
    argv += ["--proc", "/proc", "--dev", "/dev", "--", "/usr/bin/true"]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"bwrap did not finish within {_PROBE_TIMEOUT_S} s"
    except OSError as exc:
        return f"cannot start {bwrap}: {exc}"
    if proc.returncode == 0:
        return None
    stderr = " ".join(proc.stderr.split())[:400] or "no stderr"
    return f"test sandbox exited with status {proc.returncode}: {stderr}"


def _userns_check(
    proc_sys: Path = Path("/proc/sys"), *, euid: int | None = None, bwrap: str | None = None
) -> Check:
    """Sysctls that forbid user namespaces, then (with a bwrap) a real test sandbox.

    The probe has the last word: an AppArmor profile can let bwrap through a restrictive sysctl,
    and a container's seccomp can block namespaces no sysctl mentions.
    """
    euid = os.geteuid() if euid is None else euid
    found: list[str] = []
    fixes: list[str] = []
    max_ns = _read_sysctl(proc_sys / "user" / "max_user_namespaces")
    found.append(f"max_user_namespaces={max_ns if max_ns is not None else 'absent'}")
    if max_ns == 0:
        fixes.append("sysctl -w user.max_user_namespaces=15000 (persist it in /etc/sysctl.d/)")
    clone = _read_sysctl(proc_sys / "kernel" / "unprivileged_userns_clone")
    if clone is not None:
        found.append(f"unprivileged_userns_clone={clone}")
        if clone == 0 and euid != 0:
            fixes.append("sysctl -w kernel.unprivileged_userns_clone=1")
    apparmor = _read_sysctl(proc_sys / "kernel" / "apparmor_restrict_unprivileged_userns")
    if apparmor is not None:
        found.append(f"apparmor_restrict_unprivileged_userns={apparmor}")
        if apparmor == 1 and euid != 0:
            path = bwrap or "/path/to/bwrap"
            fixes.append(
                "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile "
                f"for bwrap in /etc/apparmor.d/: `profile sandcell-bwrap {path} "
                "flags=(unconfined) { userns, }` loaded with apparmor_parser -r"
            )
    failure = _probe_userns(bwrap) if bwrap else None
    if bwrap is None:
        found.append("not probed (no bwrap)")
        ok = not fixes
    else:
        found.append(failure or "test sandbox ran")
        ok = failure is None
    if failure and not fixes:
        fixes.append(
            "allow unprivileged user namespaces for bwrap; in a container, run it with a seccomp "
            "profile that permits unshare/clone of namespaces (e.g. docker --security-opt "
            "seccomp=unconfined) or use a privileged container"
        )
    return Check(
        name="user namespaces",
        ok=ok,
        detail="; ".join(found),
        fix=None if ok else "; ".join(fixes),
        required=True,
    )


def _seccomp_check(status: Path = Path("/proc/self/status")) -> Check:
    """Kernel support (the ``Seccomp:`` status field and ``PR_GET_SECCOMP``) and the policy."""
    try:
        text = status.read_text()
    except OSError as exc:
        text = f"{status} is unreadable: {exc.strerror}"
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    mode = fields.get("Seccomp", "").strip()
    problem = None if mode else f"no Seccomp field in {status} (kernel without CONFIG_SECCOMP)"
    libc = ctypes.CDLL(None, use_errno=True)
    if problem is None and int(libc.prctl(_PR_GET_SECCOMP, 0, 0, 0, 0)) < 0:
        problem = f"prctl(PR_GET_SECCOMP) failed: {os.strerror(ctypes.get_errno())}"
    if problem:
        return Check(
            name="seccomp",
            ok=False,
            detail=problem,
            required=True,
            fix="use a kernel built with CONFIG_SECCOMP=y and CONFIG_SECCOMP_FILTER=y",
        )
    try:
        policy = seccomp.build_policy(seccomp.native_arch()).describe()
    except IsolationUnavailable as exc:
        return Check(name="seccomp", ok=False, detail=exc.reason, fix=exc.fix, required=True)
    # A supervisor already under a filter (docker's default) is fine, but worth knowing.
    outer = f"; this process is already filtered (mode {mode})" if mode != "0" else ""
    return Check(name="seccomp", ok=True, detail=policy + outer, fix=None, required=True)


def _landlock_check(found: int | IsolationUnavailable | None) -> Check:
    if not isinstance(found, int):
        reason = found.reason if found is not None else "the kernel has no Landlock"
        fix = found.fix if found is not None else None
        return Check(
            name="landlock",
            ok=False,
            detail=reason + "; runs go without it",
            fix=fix,
            required=False,
        )
    extras = ["filesystem rules"]
    if found >= 4:
        extras.append("TCP bind/connect")
    if found >= 6:
        extras.append("signal and abstract-socket scoping")
    detail = f"ABI {found} ({', '.join(extras)}); used by default"
    return Check(name="landlock", ok=True, detail=detail, fix=None, required=False)


def _probe_landlock() -> int | IsolationUnavailable | None:
    try:
        return landlock.require(True)
    except IsolationUnavailable as exc:
        return exc


def _cgroup_check(found: cgroups.CgroupHost | IsolationUnavailable) -> Check:
    """Where run cgroups go (or why none can), in the words of :func:`cgroups.detect`."""
    if isinstance(found, IsolationUnavailable):
        fix = found.fix if "--isolation rlimits" in found.fix else f"{found.fix}, {_RLIMITS_HINT}"
        return Check(name="cgroups", ok=False, detail=found.reason, fix=fix, required=True)
    detail = found.describe()
    if found.version == 1:
        swap = cgroups.swap_accounting(found)
        detail += "; swap accounting " + (
            "on (memsw limit)" if swap else "off (memory.swappiness=0 instead)"
        )
    else:
        base = found.bases["unified"]
        parent = base if base.exists() else base.parent
        try:
            controllers = (parent / "cgroup.controllers").read_text().strip()
        except OSError as exc:
            controllers = f"unreadable ({exc.strerror})"
        detail += f"; cgroup.controllers: {controllers}"
    if not _favordynmods():
        # Not a safety matter: speed. Without it the first cgroup.procs write after a quiet spell
        # waits for a kernel grace period.
        detail += (
            "; favordynmods off (each run may wait ~10 ms to enter its cgroup; "
            "remount the cgroup hierarchy with -o favordynmods to avoid it)"
        )
    return Check(name="cgroups", ok=True, detail=detail, fix=None, required=True)


def _favordynmods(mountinfo: Path = Path("/proc/self/mountinfo")) -> bool:
    """Whether any cgroup hierarchy is mounted with ``favordynmods`` (the lock is global)."""
    try:
        text = mountinfo.read_text()
    except OSError:
        return False
    return any(" - cgroup" in line and "favordynmods" in line for line in text.splitlines())


def _kvm_check(dev: Path = Path("/dev/kvm")) -> Check:
    fix = (
        "optional: the microVM backend uses TCG without it (it decides by booting a guest, see "
        "'backend microvm'); to use KVM, enable it and add the user to the kvm group"
    )
    if not dev.exists():
        return Check(name="kvm", ok=False, detail=f"{dev} does not exist", fix=fix, required=False)
    try:
        os.close(os.open(dev, os.O_RDWR | os.O_CLOEXEC))
    except OSError as exc:
        return Check(
            name="kvm",
            ok=False,
            detail=f"{dev} is not openable read-write: {exc.strerror}",
            fix=fix,
            required=False,
        )
    return Check(
        name="kvm",
        ok=True,
        detail=f"{dev} is openable read-write (whether it is fast is decided by booting)",
        fix=None,
        required=False,
    )


def _python_check() -> Check:
    rt = python_runtime()
    return Check(
        name="python runtime",
        ok=True,
        detail=f"{rt.identity}, sha256 {rt.sha256[:12]}",
        fix=None,
        required=True,
    )


def _bash_check() -> Check:
    rt = bash_runtime()  # raises ConfigError without bash, which diagnose() reports
    return Check(
        name="bash runtime",
        ok=True,
        detail=f"{rt.interpreter}, sha256 {rt.sha256[:12]}",
        fix=None,
        required=False,
    )


def _node_check() -> Check:
    """JavaScript and TypeScript: the Node runtime built and intact (optional: without it those
    languages are refused, Python and Bash run)."""
    from sandcell.runtimes.node import node_runtime

    try:
        rt = node_runtime()
    except (ConfigError, IsolationUnavailable) as exc:
        return Check(
            name="node runtime",
            ok=False,
            detail=f"JavaScript and TypeScript cannot run: {exc}",
            fix="sandcell runtime build node (needs npm, at install time only)",
            required=False,
        )
    return Check(
        name="node runtime",
        ok=True,
        detail=f"{rt.identity}, sha256 {rt.sha256[:12]}",
        fix=None,
        required=False,
    )


def _guarded(name: str, required: bool, fn: Callable[[], Check]) -> Check:
    """Run one check; an exception becomes a failed check so the report always comes out."""
    try:
        return fn()
    except Exception as exc:
        fix = getattr(exc, "fix", None) or _REPORT
        return Check(
            name=name,
            ok=False,
            detail=f"check failed: {type(exc).__name__}: {exc}",
            fix=fix,
            required=required,
        )


def diagnose() -> DoctorReport:
    """Run every check on this host (takes a second or two: it starts a test sandbox)."""
    found: bw.Bwrap | IsolationUnavailable
    try:
        found = bw.find_bwrap()
    except Exception as exc:  # the bwrap and user namespace checks report it
        found = (
            exc
            if isinstance(exc, IsolationUnavailable)
            else IsolationUnavailable("bubblewrap", f"{type(exc).__name__}: {exc}", _REPORT)
        )
    bwrap_path = found.path if isinstance(found, bw.Bwrap) else None
    steps: list[tuple[str, bool, Callable[[], Check]]] = [
        ("sandcell", False, _version_check),
        ("kernel", True, _kernel_check),
        ("bubblewrap", True, lambda: _bwrap_check(found)),
        ("user namespaces", True, lambda: _userns_check(bwrap=bwrap_path)),
        ("seccomp", True, _seccomp_check),
        ("landlock", False, lambda: _landlock_check(_probe_landlock())),
        ("cgroups", True, lambda: _cgroup_check(cgroups.detect())),
        ("python runtime", True, _python_check),
        ("bash runtime", False, _bash_check),
        ("node runtime", False, _node_check),
        ("kvm", False, _kvm_check),
    ]
    checks = [_guarded(name, req, fn) for name, req, fn in steps]
    checks.append(_namespaces_row(checks))
    for name in LADDER[1:]:
        checks.append(_guarded(f"backend {name}", False, functools.partial(_backend_row, name)))
    return DoctorReport(tuple(checks))


def _namespaces_row(checks: list[Check]) -> Check:
    """The first rung is usable exactly when the required host checks above passed."""
    blockers = [c.name for c in checks if c.required and not c.ok]
    return Check(
        name="backend namespaces",
        ok=not blockers,
        detail=f"protects {PROTECTS['namespaces']}"
        if not blockers
        else f"blocked by {', '.join(blockers)}",
        fix=None if not blockers else "fix the checks marked [!!] above",
        required=False,
    )


def _backend_row(name: BackendName) -> Check:
    """One rung above namespaces: the backend's own probe, which boots or starts what it must."""
    st = probe(name)
    detail = st.detail if not st.usable else f"{st.detail}; protects {PROTECTS[name]}"
    return Check(name=f"backend {name}", ok=st.usable, detail=detail, fix=st.fix, required=False)


def render(report: DoctorReport) -> str:
    """A plain-text, aligned table: marker, name, detail, a ``fix:`` line under each failure."""
    width = max((len(c.name) for c in report.checks), default=0)
    lines: list[str] = []
    for c in report.checks:
        marker = "[ok]" if c.ok else "[!!]" if c.required else "[--]"
        lines.append(f"{marker} {c.name:<{width}}  {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"{'':<{width + 7}}fix: {c.fix}")
    blockers = report.blockers
    if not blockers:
        lines.append("a default run can work on this host")
    else:
        names = ", ".join(c.name for c in blockers)
        line = f"a default run cannot work on this host: blocked by {names}"
        if [c.name for c in blockers] == ["cgroups"]:
            line += "; the weaker mode --isolation rlimits can run without cgroups"
        lines.append(line)
    return "\n".join(lines)
