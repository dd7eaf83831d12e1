"""Escapes through the filesystem: host files that must not be visible inside the sandbox."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandcell import Executor, RunRequest
from sandcell.backends.host import workspace
from sandcell.runtimes import python_runtime

if TYPE_CHECKING:
    from .conftest import Attack

REPO = Path(__file__).resolve().parents[2]
SYNTHETIC_ETC = {"passwd", "group", "hosts", "nsswitch.conf"}


def _unreadable(paths: list[str]) -> str:
    """Attack body: try to stat, open and list each path; any success is a breach."""
    return f"""
    for path in {paths!r}:
        def probe(path=path):
            st = os.stat(path)
            if stat.S_ISDIR(st.st_mode):
                return sorted(os.listdir(path))[:20]
            with open(path, "rb") as f:
                return f.read(200)
        attempt(f"read {{path}}", probe)
    """


def test_blocks_etc_shadow(attack: Attack) -> None:
    paths = ["/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/sudoers"]
    res = attack.run(_unreadable(paths))
    attack.expect_blocked(res, attempts=len(paths))


def test_blocks_root_home(attack: Attack) -> None:
    paths = ["/root", "/root/.bash_history", "/root/.profile", "/root/.config"]
    res = attack.run(_unreadable(paths))
    attack.expect_blocked(res, attempts=len(paths))


def test_blocks_host_home_dirs(attack: Attack) -> None:
    """/home holds nothing of the host: only ``user``, which is the sandbox's own workspace
    mounted again (layout.SANDBOX_HOME), never a host user's home of that name."""
    homes = sorted(
        ({p.pw_dir for p in pwd.getpwall() if p.pw_dir.startswith("/home/")} - {"/home/user"})
        | {"/home/sandcell-test"}
    )
    # Pyodide's in-memory filesystem has Emscripten's own home, /home/web_user, there from its
    # start (nothing of the host's); it must be empty.
    own = ["user", "web_user"] if attack.sandbox.backend == "wasm" else ["user"]
    body = f"""
    def _is_the_workspace(path):
        # Not samefile: gVisor gives each mount of the one directory its own device number.
        marker = "/sandbox/.home-probe"
        with open(marker, "w") as f:
            f.write("probe")
        try:
            with open(os.path.join(path, ".home-probe")) as f:
                return f.read() == "probe"
        except OSError:
            return False
        finally:
            os.remove(marker)

    try:
        names = os.listdir("/home")
    except OSError as exc:
        blocked("list /home", errname(exc))
    else:
        if sorted(names) != {own!r}:
            breach(f"/home lists {{names!r}}")
        elif "web_user" in names and os.listdir("/home/web_user"):
            breach(f"/home/web_user holds {{os.listdir('/home/web_user')!r}}")
        elif not _is_the_workspace("/home/user"):
            breach("/home/user is not the sandbox's workspace")
        else:
            blocked("list /home", "only the workspace, at /home/user")
    for path in {homes!r}:
        attempt(f"stat {{path}}", lambda path=path: os.stat(path))
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=1 + len(homes))


def test_blocks_ssh_keys(attack: Attack) -> None:
    users = [p for p in pwd.getpwall() if p.pw_uid == 0 or p.pw_uid >= 1000]
    paths = sorted(
        {f"{p.pw_dir}/.ssh" for p in users if p.pw_dir not in ("/", "/nonexistent")}
        | {f"{p.pw_dir}/.ssh/id_rsa" for p in users if p.pw_dir not in ("/", "/nonexistent")}
        | {"/root/.ssh", "/root/.ssh/authorized_keys", "/etc/ssh/ssh_host_ed25519_key"}
    )
    res = attack.run(_unreadable(paths))
    attack.expect_blocked(res, attempts=len(paths))


def test_blocks_repo_checkout(attack: Attack) -> None:
    """The checkout is not visible; only the venv under it is, read-only, as the runtime."""
    files = [
        REPO / "pyproject.toml",
        REPO / "src" / "sandcell" / "__init__.py",
        REPO / "tests" / "conftest.py",
        REPO / ".git" / "config",
        REPO / ".git" / "HEAD",
    ]
    paths = [str(p) for p in files if p.exists()]
    assert paths, "the checkout has none of the probed files; the test would test nothing"
    body = (
        _unreadable([*paths, str(REPO / "src"), str(REPO / ".git")])
        + f"""
    try:
        listing = os.listdir({str(REPO)!r})
    except OSError as exc:
        blocked("list the repository root", errname(exc))
    else:
        extra = sorted(set(listing) - {{".venv"}})
        if extra:
            breach(f"the repository root lists {{extra!r}}")
        else:
            blocked("list the repository root", f"only {{listing!r}}")
    """
    )
    res = attack.run(body)
    attack.expect_blocked(res, attempts=len(paths) + 3)


def test_blocks_sys(attack: Attack) -> None:
    if attack.sandbox.backend == "microvm":
        _guest_sys(attack)
        return
    paths = ["/sys", "/sys/kernel", "/sys/fs/cgroup", "/sys/class/net", "/sys/firmware"]
    if attack.sandbox.backend == "gvisor":
        # gVisor always mounts its own synthetic sysfs at /sys; the backend covers it with an
        # empty read-only tmpfs. So /sys exists, but nothing of any sysfs is in it.
        paths.remove("/sys")
    body = "\n".join(
        f"attempt({('stat ' + p)!r}, lambda: os.stat({p!r}), ok=(errno.ENOENT,))" for p in paths
    )
    attempts = len(paths)
    if attack.sandbox.backend == "gvisor":
        body += """
names = os.listdir("/sys")
(breach if names else blocked)("list /sys", f"entries {names!r}")
attempt("mkdir /sys/class", lambda: os.mkdir("/sys/class") or "created", ok=(errno.EROFS,))
"""
        attempts += 2
    res = attack.run(body)
    attack.expect_blocked(res, attempts=attempts)


def _guest_sys(attack: Attack) -> None:
    """A microVM's /sys is its guest kernel's own sysfs: it describes the VM, never the host.
    None of the host's network interfaces is in it, and the program cannot write to it."""
    host_nets = sorted(set(os.listdir("/sys/class/net")) - {"lo"})
    assert host_nets, "the host has no network interface but lo; the test would test nothing"
    body = f"""
    names = os.listdir("/sys/class/net")
    seen = sorted(set(names) & set({host_nets!r}))
    (breach if seen or names != ["lo"] else blocked)("see the host's interfaces", f"{{names!r}}")
    def write():
        fd = os.open("/sys/class/net/lo/mtu", os.O_WRONLY)
        os.close(fd)
        return "opened for writing"
    attempt("open /sys/class/net/lo/mtu for writing", write, ok=(errno.EACCES,))
    attempt("mkdir /sys/class/sandcell", lambda: os.mkdir("/sys/class/sandcell") or "made",
            ok=(errno.EACCES, errno.EPERM))
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=3)


def test_blocks_host_etc_files(attack: Attack) -> None:
    """Only the synthetic passwd, group, hosts and nsswitch.conf (and runtime dirs) are in /etc."""
    allowed = SYNTHETIC_ETC | {
        Path(d).relative_to("/etc").parts[0]
        for d in python_runtime().ro_dirs
        if d.startswith("/etc/")
    }
    candidates = [
        "hostname", "os-release", "machine-id", "resolv.conf", "fstab", "crontab", "environment",
        "ld.so.preload", "sudoers.d", "ssh", "ssl/private", "subuid", "subgid", "mtab",
    ]  # fmt: skip
    # A microVM's image has its own /etc/hostname and (empty) machine-id: what is checked there is
    # that their content is not the host's.
    guest_own = {"hostname", "machine-id"} if attack.sandbox.backend == "microvm" else set()
    allowed |= guest_own
    host_ids = {n: (Path("/etc") / n).read_bytes() for n in sorted(guest_own)}
    assert all(host_ids.values()), f"the host's {host_ids} are empty; nothing to compare with"
    candidates = [n for n in candidates if n not in guest_own]
    probes = [f"/etc/{n}" for n in candidates if (Path("/etc") / n).exists() or n == "hostname"]
    host_users = sorted(p.pw_name for p in pwd.getpwall() if p.pw_uid >= 1000 and p.pw_uid < 65534)
    wasm = attack.sandbox.backend == "wasm"
    body = (
        _unreadable(probes)
        + f"""
    try:
        names = set(os.listdir("/etc"))
    except OSError as exc:
        blocked("list /etc", errname(exc))
    else:
        extra = sorted(names - set({sorted(allowed)!r}))
        (breach if extra else blocked)("list /etc", f"extra entries {{extra!r}}")
    try:
        with open("/etc/passwd") as f:
            passwd = f.read()
    except FileNotFoundError:
        if not {wasm!r}:
            raise
        passwd = ""  # Pyodide's filesystem has no /etc at all: no users to name
    leaked = [u for u in {host_users!r} if u + ":" in passwd]
    if leaked:
        breach(f"/etc/passwd names host users {{leaked!r}}")
    else:
        blocked("host users in /etc/passwd", "synthetic file")
    for name, host_text in {host_ids!r}.items():
        with open("/etc/" + name, "rb") as f:
            inner = f.read()
        (breach if inner == host_text else blocked)(f"the host's /etc/{{name}}", repr(inner[:60]))
    """
    )
    res = attack.run(body)
    attack.expect_blocked(res, attempts=len(probes) + 2 + len(host_ids))


def test_blocks_var_run_and_host_sockets(attack: Attack) -> None:
    paths = [
        "/var", "/run", "/var/run", "/run/docker.sock", "/var/run/docker.sock",
        "/run/containerd/containerd.sock", "/run/dbus/system_bus_socket",
        "/var/run/dbus/system_bus_socket", "/run/systemd/private", "/run/user",
        "/var/lib/docker", "/var/log",
    ]  # fmt: skip
    guest_run = attack.sandbox.backend == "microvm"
    wasm = attack.sandbox.backend == "wasm"
    if guest_run:
        # The guest agent mounts its own small tmpfs at /run: it must be there empty (nothing of
        # the host's /run, nothing the agent keeps) and read-only to the program.
        paths.remove("/run")
    body = f"""
    for path in {paths!r}:
        attempt(f"stat {{path}}", lambda path=path: os.stat(path), ok=(errno.ENOENT,))
    if {guest_run!r}:
        names = os.listdir("/run")
        (breach if names else blocked)("list /run", f"entries {{names!r}}")
        attempt("create a file in /run", lambda: open("/run/x", "w") and "created",
                ok=(errno.EACCES, errno.EROFS))
    for path in ("/run/docker.sock", "/var/run/docker.sock", "/run/dbus/system_bus_socket"):
        if {wasm!r}:
            # Pyodide (the wasm rung) has no AF_UNIX: no Unix socket can be connected to.
            blocked(f"connect {{path}}", "no AF_UNIX")
            continue
        def connect(path=path):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect(path)
            return "connected"
        attempt(f"connect {{path}}", connect)
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=len(paths) + 3 + (2 if guest_run else 0))


def test_blocks_runs_dir_and_other_workspaces(attack: Attack) -> None:
    """Neither the host runs root (where every run's workspace lives) nor this run's own host path
    (which the sandbox can learn from its init's command line) leads anywhere."""
    runs = (
        str(workspace.runs_root())
        if attack.identity == "root"
        else str(attack.home.parent / "runs")
    )
    # No pid 1 to read on the wasm rung either: Pyodide's /proc has no processes.
    no_pid1 = attack.sandbox.backend in ("microvm", "wasm")
    body = f"""
    attempt("stat the runs root", lambda: os.stat({runs!r}), ok=(errno.ENOENT, errno.EACCES))
    attempt("list the runs root", lambda: os.listdir({runs!r}), ok=(errno.ENOENT, errno.EACCES))
    try:
        with open("/proc/1/cmdline", "rb") as f:
            argv = f.read().split(b"\\0")
    except FileNotFoundError:
        if not {no_pid1!r}:
            raise
        # The guest's pid 1 is its agent, hidden from the program; no host path is in the guest.
        argv = []
    host_ws = None
    for i, a in enumerate(argv):
        if a == b"--bind" and argv[i + 2] == b"/sandbox":
            host_ws = argv[i + 1].decode()
    if host_ws is None:
        blocked("find this run's host workspace path", "not in /proc/1/cmdline")
        blocked("list other runs", "no path")
    else:
        attempt("stat this run's host workspace", lambda: os.stat(host_ws),
                ok=(errno.ENOENT, errno.EACCES))
        owner_dir = os.path.dirname(os.path.dirname(host_ws))
        attempt("list sibling runs", lambda: os.listdir(owner_dir), ok=(errno.ENOENT, errno.EACCES))
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=4)


def test_blocks_data_dir(attack: Attack) -> None:
    """The audit log and the artifact store of the host are out of reach."""
    home = attack.home
    paths = [str(home), str(home / "audit.sqlite3"), str(home / "artifacts")]
    body = f"""
    for path in {paths!r}:
        attempt(f"stat {{path}}", lambda path=path: os.stat(path), ok=(errno.ENOENT, errno.EACCES))
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=len(paths))


def test_blocks_host_devices(attack: Attack) -> None:
    """/dev is the minimal one bwrap builds: no disks, memory, kernel log or KVM."""
    names = ["mem", "kmem", "port", "kmsg", "kvm", "sda", "vda", "nvme0n1", "loop0", "fuse",
             "autofs", "btrfs-control", "loop-control", "cpu_dma_latency", "hwrng"]  # fmt: skip
    gvisor = attack.sandbox.backend == "gvisor"
    if gvisor:
        # gVisor's /dev/fuse is the sentry's own emulated device, not the host's, and opening it
        # succeeds. What a FUSE device would be good for, mounting, is still refused below.
        names.remove("fuse")
    body = f"""
    for name in {names!r}:
        def probe(name=name):
            os.close(os.open("/dev/" + name, os.O_RDONLY))
            return "opened"
        attempt(f"open /dev/{{name}}", probe)
    """
    if gvisor:
        body += """
    fd = os.open("/dev/fuse", os.O_RDWR)
    os.mkdir("mnt")
    for what, src, fstype, data in (
        ("mount fuse", b"fuse", b"fuse", f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()),
        ("mount tmpfs", b"none", b"tmpfs", None),
    ):
        def mount(src=src, fstype=fstype, data=data):
            if _libc.mount(src, b"mnt", fstype, ctypes.c_ulong(0), data) != 0:
                raise OSError(ctypes.get_errno(), "mount")
            return "mounted"
        attempt(what, mount, ok=(errno.EPERM, errno.ENOSYS))
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=len(names) + (2 if gvisor else 0))


def test_blocks_host_tmp(attack: Attack, tmp_path: Path) -> None:
    """The sandbox's /tmp is its own: a file the host puts in /tmp is not there."""
    probe = Path("/tmp") / f"sandcell-escape-{os.getpid()}-{os.urandom(4).hex()}"
    probe.write_text("host secret\n")
    probe.chmod(0o644)
    try:
        body = f"""
        attempt("read the host's /tmp file", lambda: open({str(probe)!r}).read(),
                ok=(errno.ENOENT,))
        # The runtime may live under /tmp on the host (a staged venv): its mount point may show.
        runtime_top = sys.prefix.split("/")[2] if sys.prefix.startswith("/tmp/") else None
        names = [n for n in os.listdir("/tmp") if n != runtime_top]
        if names:
            breach(f"/tmp is not empty: {{names!r}}")
        else:
            blocked("list /tmp", "private and empty")
        """
        res = attack.run(body)
        attack.expect_blocked(res, attempts=2)
    finally:
        probe.unlink()


# -- the runtime's paths ------------------------------------------------------------------------

# What a program can learn about where things are: every text below is searched for host paths.
# mountinfo's root fields are checked with the inputs' in test_mountinfo_names_no_host_path.
_WHERE_PROBE = """
import json, os, sys
def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read().replace(b"\\0", b" ").decode(errors="replace")
    except OSError as exc:
        return f"<{exc.errno}>"
def _ls(path):
    try:
        return " ".join(sorted(os.listdir(path)))
    except OSError as exc:
        return f"<{exc.errno}>"
def _link(path):
    try:
        return os.readlink(path)
    except OSError as exc:
        return f"<{exc.errno}>"
where = {}
where["mountinfo"] = _read("/proc/self/mountinfo")
where["maps"] = _read("/proc/self/maps")
where["environ"] = _read("/proc/self/environ")
where["os.environ"] = repr(dict(os.environ))
where["sys paths"] = repr([sys.path, sys.prefix, sys.base_prefix, sys.exec_prefix,
                           sys.executable, getattr(sys, "_base_executable", "")])
pids = [p for p in os.listdir("/proc") if p.isdigit()]
where["cmdlines"] = "\\n".join(_read(f"/proc/{p}/cmdline") for p in pids)
where["links"] = " ".join(_link(f"/proc/{p}/{n}") for p in pids for n in ("exe", "cwd", "root"))
# File contents: what the runtime's bytecode says it was compiled from (the code objects of up
# to 60 .pyc files of site-packages), and the install records of every distribution.
import glob, marshal
pycs = sorted(glob.glob(sys.prefix + "/lib/python3*/site-packages/*/__pycache__/*.pyc"))[:60]
pycs += sorted(glob.glob(sys.base_prefix + "/lib/python3*/__pycache__/*.pyc"))[:20]
def _co_filename(path):
    try:
        with open(path, "rb") as f:
            return marshal.loads(f.read()[16:]).co_filename
    except Exception as exc:
        return f"<{type(exc).__name__}>"
where["bytecode"] = f"{len(pycs)} files: " + " ".join(_co_filename(p) for p in pycs)
meta = sys.prefix + "/lib/python3*/site-packages/*.dist-info/"
records = [_read(p) for p in sorted(glob.glob(meta + "direct_url.json"))]
records += [ln for p in sorted(glob.glob(meta + "RECORD")) for ln in _read(p).splitlines()
            if ln.startswith("/") or ln.startswith("<")]
where["install records"] = "\\n".join(records)
where["listings"] = "\\n".join(
    f"{d}: {_ls(d)}" for d in ("/", "/opt", "/opt/sandcell", "/opt/sandcell/venv",
                               "/opt/sandcell/venv/bin", "/tmp", "/sandcell"))
print("WHERE " + json.dumps(where))
"""


def _host_paths(*extra: str) -> list[str]:
    """Host paths that must not appear inside: the checkout, the venv (as started and resolved),
    a base interpreter outside /usr, homes, and the unprivileged user's staging area."""
    # Each host home, not /home itself: the sandbox has a /home, holding only its own workspace
    # at /home/user (layout.SANDBOX_HOME; test_blocks_host_home_dirs), whatever the host has.
    homes = {p.pw_dir for p in pwd.getpwall() if p.pw_dir.startswith("/home/")}
    homes |= {f"/home/{name}" for name in (os.listdir("/home") if os.path.isdir("/home") else ())}
    homes = (homes | {"/home/sandcell-test"}) - {"/home/user"}
    paths = {str(REPO), sys.prefix, os.path.realpath(sys.prefix), "/root", *homes, *extra}
    base = os.path.realpath(sys.base_prefix)
    if not base.startswith("/usr"):
        paths.add(base)
    home = os.environ.get("HOME")
    if home and home not in ("/", "/tmp"):
        paths.add(home)
    return sorted(paths)


def _named(text: str, paths: list[str]) -> list[str]:
    """Which of ``paths`` appear in ``text`` as whole path components (``/root`` in
    ``/root/x`` or ``"/root"``, not in ``/newroot``)."""
    found = []
    for p in paths:
        if re.search(r"(?<![\w.-])" + re.escape(p.rstrip("/")) + r"(?![\w.-])", text):
            found.append(p)
    return found


def _where(stdout: str) -> dict[str, str]:
    line = next((ln for ln in stdout.splitlines() if ln.startswith("WHERE ")), None)
    assert line is not None, f"the probe did not report: {stdout[-2000:]}"
    where: dict[str, str] = json.loads(line[len("WHERE ") :])
    return where


def test_runtime_shows_no_host_paths(attack: Attack) -> None:
    """Mounts, maps, environment, sys paths, every visible command line and the listings of /,
    /opt and the runtime name no host home, checkout or venv path: the runtime is at
    /opt/sandcell (a venv) and /usr, whatever the host's layout. The microVM guest's image holds
    the runtime at the same neutral paths, its bytecode rewritten to name them: no host path of
    the install exists there or is named."""
    paths = _host_paths("/tmp/sandcell-unpriv-")
    runtime, exe_dir = "/opt/sandcell/venv", "/opt/sandcell/"
    if attack.sandbox.backend == "microvm":
        from sandcell.backends.microvm import image

        built = image.load_manifest().python
        assert built.startswith(exe_dir), f"the guest image names {built}: rebuild it"
    # The wasm rung's runtime is Pyodide's, in its in-memory filesystem (/lib/python3.13, no
    # venv, no bytecode files): the host paths are checked there as everywhere, the namespaces
    # runtime's layout is not.
    layout = attack.sandbox.backend != "wasm"
    body = (
        textwrap.indent(_WHERE_PROBE, "    ")
        + f"""
    paths = {paths!r}
    runtime = {runtime!r}
    import re
    where["existing"] = " ".join(p for p in paths if os.path.lexists(p))
    if {layout!r} and where["bytecode"].startswith("0 files"):
        unexpected("find bytecode in site-packages", where["bytecode"])
    for source, text in where.items():
        hits = [p for p in paths
                if re.search(r"(?<![\\w.-])" + re.escape(p.rstrip("/")) + r"(?![\\w.-])", text)]
        if hits:
            breach(f"{{source}} names {{hits}}: {{text[:3000]}}")
        else:
            blocked(f"host paths in {{source}}", "none")
    if {layout!r} and (sys.prefix != runtime or not sys.executable.startswith({exe_dir!r})):
        unexpected("the runtime's place", f"{{sys.prefix}} {{sys.executable}}")
    """
    )
    res = attack.run(body)
    out = attack.expect_blocked(res, attempts=11)
    assert not layout or runtime + "/lib/" in _where(out)["sys paths"], out[-2000:]


@pytest.fixture
def home_like() -> Iterator[Path]:
    """A directory under /tmp that every user can traverse (pytest's own temporary root is
    private to root again whenever another pytest session starts)."""
    d = Path(tempfile.mkdtemp(prefix="sandcell-home-like-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_mountinfo_names_no_host_path(attack: Attack, home_like: Path) -> None:
    """Every line of /proc/self/mountinfo (a bind mount's root field, the mount source, the
    super options) is free of host paths: the checkout and venv, homes, the runs directory
    (control files, synthetic /etc, the runtime's support files), the data directory and the
    inputs, here a file and a directory under a home-like path. The inputs are read first, so
    the lines checked are those of mounts that serve them."""
    data = home_like / "home" / "alice" / "proj" / "data"
    (data / "tables").mkdir(parents=True)
    (data / "notes.txt").write_text("note\n")
    (data / "tables" / "t.csv").write_text("a,b\n")
    for p in (data, data / "tables", data / "notes.txt", data / "tables" / "t.csv"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    for p in (data.parent, data.parent.parent, data.parent.parent.parent):
        p.chmod(0o755)
    runs = (
        str(workspace.runs_root())
        if attack.identity == "root"
        else str(attack.home.parent / "runs")
    )
    forbidden = [*_host_paths(str(home_like), runs, str(attack.home)), "/tmp/sandcell-"]
    wasm = attack.sandbox.backend == "wasm"
    body = f"""
    import re
    with open("/inputs/notes.txt") as f:
        note = f.read()
    with open("/inputs/tables/t.csv") as f:
        table = f.read()
    if (note, table) != ("note\\n", "a,b\\n"):
        unexpected("read the inputs", repr((note, table)))
    else:
        blocked("inputs mounted", "read both")
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        if not {wasm!r}:
            raise
        # Pyodide's /proc has no mountinfo: its mounts are Emscripten's, named nowhere.
        lines = None
    if lines is None:
        blocked("host paths in mountinfo", "no /proc/self/mountinfo")
    else:
        bad = []
        for line in lines:
            hits = [p for p in {forbidden!r}
                    if re.search(r"(?<![\\w.-])" + re.escape(p.rstrip("/")) + r"(?![\\w.-])", line)
                    or (p.endswith("-") and p in line)]
            if hits:
                bad.append(f"{{hits}}: {{line}}")
        if bad or not lines:
            breach("mountinfo names host paths", "\\n".join(bad) or "no lines")
        else:
            blocked("host paths in mountinfo", f"none in {{len(lines)}} lines")
    """
    res = attack.run(body, inputs=[data / "notes.txt", data / "tables"])
    attack.expect_blocked(res, attempts=2)


def _venv_under_home(tmp_path: Path, base_python: str) -> Path:
    """A venv at <tmp>/home/alice/proj/.venv on ``base_python`` that can run this checkout's
    sandcell (its dependencies come from the test venv through a .pth file)."""
    venv = tmp_path / "home" / "alice" / "proj" / ".venv"
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    deps = [p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)]
    (site / "hostdeps.pth").write_text("\n".join([*deps, str(REPO / "src")]) + "\n")
    # A package installed from the project's directory, compiled on the host: its bytecode, its
    # direct_url.json and its RECORD name the host paths.
    pkg = site / "probepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def where():\n    return __file__\n")
    # Into the package's own __pycache__, as an install compiles it: not into the suite's
    # shared bytecode cache (PYTHONPYCACHEPREFIX, tests/conftest.py).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    subprocess.run(
        [base_python, "-m", "py_compile", str(pkg / "__init__.py")],
        check=True,
        timeout=60,
        env=env,
    )
    meta = site / "probepkg-1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: probepkg\nVersion: 1.0\n")
    project = venv.parent.as_uri()
    (meta / "direct_url.json").write_text(json.dumps({"url": project, "dir_info": {}}))
    record = ["probepkg/__init__.py,,", f"{venv}/share/probepkg/data.txt,,", ""]
    (meta / "RECORD").write_text("\n".join(record))
    return venv


def _pyenv_python() -> str | None:
    """A pyenv interpreter of this Python's minor version (the test venv's packages must fit)."""
    want = f"{sys.version_info.major}.{sys.version_info.minor}."
    root = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"
    for d in sorted(root.glob(f"{want}*")) if root.is_dir() else []:
        if (d / "bin" / "python3").is_file():
            return str(d / "bin" / "python3")
    return None


@pytest.mark.parametrize(
    ("base", "start"), [("system", "cold"), ("pyenv", "cold"), ("system", "pool")]
)
def test_venv_under_a_home_directory(base: str, start: str, tmp_path: Path) -> None:
    """sandcell installed in a venv under a home directory, on the system interpreter or on a
    pyenv one under /root: started from its CLI, its sandbox names neither, in its mounts or
    in the files it can read (bytecode compiled on the host, the install records of a package
    installed from the project directory)."""
    if base == "pyenv":
        python = _pyenv_python()
        if python is None:
            pytest.skip(f"no pyenv Python {sys.version_info.major}.{sys.version_info.minor}")
    else:
        python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    venv = _venv_under_home(tmp_path, python)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home" / "alice"),
           "SANDCELL_HOME": str(tmp_path / "data")}  # fmt: skip
    cmd = [str(venv / "bin" / "python"), "-m", "sandcell", "run", "--json"]
    cmd += ["--profile", "unchecked", f"--start={start}", "-c", _WHERE_PROBE]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=venv.parent, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    where = _where(result["stdout"])
    base_prefix = os.path.dirname(os.path.dirname(python))
    forbidden = _host_paths(str(tmp_path), str(venv), *([base_prefix] if base == "pyenv" else []))
    for source, text in where.items():
        named = _named(text, forbidden)
        assert not named, f"{source} names {named}: {text[:3000]}"
        assert "alice" not in text and "proj" not in text, f"{source}: {text[:3000]}"
    assert "/opt/sandcell/venv/bin/python" in where["sys paths"]
    # The probe read the package's bytecode (rewritten) and its records (covered).
    assert "site-packages/probepkg/__init__.py" in where["bytecode"], where["bytecode"]
    if base == "pyenv":
        assert "/opt/sandcell/python" in where["sys paths"], where["sys paths"]


def test_session_shows_no_host_paths(executor: Executor) -> None:
    """A session's sandbox (its kernel started by the same boot) names no host path either."""
    with executor.session() as session:
        res = session.run(_WHERE_PROBE)
    assert res.outcome.value == "ok", res.stderr
    where = _where(res.stdout)
    assert "/opt/sandcell/venv/bin/python" in where["sys paths"], where["sys paths"]
    for source, text in where.items():
        named = _named(text, _host_paths())
        assert not named, f"{source} names {named}: {text[:3000]}"


def test_display_run_shows_no_host_paths(executor: Executor) -> None:
    """A run that captures rich outputs (its display module in the control directory, its
    outputs in the workspace) names no host path in its mounts or files either."""
    res = executor.run(RunRequest(code=_WHERE_PROBE, display=True))
    assert res.outcome.value == "ok", res.stderr
    where = _where(res.stdout)
    assert "overlay sandcell" in where["mountinfo"], where["mountinfo"]
    for source, text in where.items():
        named = _named(text, _host_paths(str(workspace.runs_root())))
        assert not named, f"{source} names {named}: {text[:3000]}"
