"""Escapes through the filesystem: host files that must not be visible inside the sandbox."""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.backends.namespaces import workspace
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
    """/home must be absent or empty: no host user's home directory is in the sandbox."""
    homes = sorted(
        {p.pw_dir for p in pwd.getpwall() if p.pw_dir.startswith("/home/")}
        | {"/home/sandcell-test"}
    )
    body = f"""
    try:
        names = os.listdir("/home")
    except OSError as exc:
        blocked("list /home", errname(exc))
    else:
        if names:
            breach(f"/home lists {{names!r}}")
        else:
            blocked("list /home", "empty")
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
    paths = ["/sys", "/sys/kernel", "/sys/fs/cgroup", "/sys/class/net", "/sys/firmware"]
    body = "\n".join(
        f"attempt({('stat ' + p)!r}, lambda: os.stat({p!r}), ok=(errno.ENOENT,))" for p in paths
    )
    res = attack.run(body)
    attack.expect_blocked(res, attempts=len(paths))


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
    probes = [f"/etc/{n}" for n in candidates if (Path("/etc") / n).exists() or n == "hostname"]
    host_users = sorted(p.pw_name for p in pwd.getpwall() if p.pw_uid >= 1000 and p.pw_uid < 65534)
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
    with open("/etc/passwd") as f:
        passwd = f.read()
    leaked = [u for u in {host_users!r} if u + ":" in passwd]
    if leaked:
        breach(f"/etc/passwd names host users {{leaked!r}}")
    else:
        blocked("host users in /etc/passwd", "synthetic file")
    """
    )
    res = attack.run(body)
    attack.expect_blocked(res, attempts=len(probes) + 2)


def test_blocks_var_run_and_host_sockets(attack: Attack) -> None:
    paths = [
        "/var", "/run", "/var/run", "/run/docker.sock", "/var/run/docker.sock",
        "/run/containerd/containerd.sock", "/run/dbus/system_bus_socket",
        "/var/run/dbus/system_bus_socket", "/run/systemd/private", "/run/user",
        "/var/lib/docker", "/var/log",
    ]  # fmt: skip
    body = f"""
    for path in {paths!r}:
        attempt(f"stat {{path}}", lambda path=path: os.stat(path), ok=(errno.ENOENT,))
    for path in ("/run/docker.sock", "/var/run/docker.sock", "/run/dbus/system_bus_socket"):
        def connect(path=path):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect(path)
            return "connected"
        attempt(f"connect {{path}}", connect)
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=len(paths) + 3)


def test_blocks_runs_dir_and_other_workspaces(attack: Attack) -> None:
    """Neither the host runs root (where every run's workspace lives) nor this run's own host path
    (which the sandbox can learn from its init's command line) leads anywhere."""
    runs = (
        str(workspace.runs_root())
        if attack.identity == "root"
        else str(attack.home.parent / "runs")
    )
    body = f"""
    attempt("stat the runs root", lambda: os.stat({runs!r}), ok=(errno.ENOENT, errno.EACCES))
    attempt("list the runs root", lambda: os.listdir({runs!r}), ok=(errno.ENOENT, errno.EACCES))
    with open("/proc/1/cmdline", "rb") as f:
        argv = f.read().split(b"\\0")
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
    body = f"""
    for name in {names!r}:
        def probe(name=name):
            os.close(os.open("/dev/" + name, os.O_RDONLY))
            return "opened"
        attempt(f"open /dev/{{name}}", probe)
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=len(names))


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
