"""Escapes through dangerous system calls, made raw through ctypes so no library wrapper hides the
errno. Each call is given valid arguments where that is possible, so that only the sandbox (the
seccomp filter, dropped capabilities, the disabled user namespaces) stands between it and success:
a failure with an unrelated errno (EINVAL, EFAULT) is reported as unexpected, not as blocked.
"""

from __future__ import annotations

import errno
import os
import platform
import pwd
import textwrap
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.conftest import wasm_cannot

from sandcell.backends.host import seccomp
from sandcell.backends.host.layout import SANDBOX_WORKDIR

if TYPE_CHECKING:
    from .conftest import Attack

ARCH = seccomp.native_arch()
NR = seccomp.SYSCALL_NUMBERS[ARCH]
EPERM_ONLY = (errno.EPERM,)
# unshare/clone of a user namespace: EPERM from seccomp; ENOSPC from bwrap's --disable-userns
# (max_user_namespaces = 0), the layer behind it.
USERNS = (errno.EPERM, errno.ENOSPC)

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIGCHLD = 17


def _nr(name: str) -> int:
    return NR[name]


def _vectors() -> dict[str, str]:
    """Vector id -> attack body. Bodies are built lazily (numbers may be missing on an arch)."""
    return {
        "mount": f"""
            raw_syscall("mount tmpfs on /tmp", {_nr("mount")}, b"none", b"/tmp", b"tmpfs", 0, None)
            raw_syscall("mount --bind / /tmp", {_nr("mount")}, b"/", b"/tmp", None, 0x1000, None)
        """,
        "umount2": f"""
            raw_syscall("umount2 /tmp", {_nr("umount2")}, b"/tmp", 0)
            raw_syscall("umount2 /sandcell (lazy)", {_nr("umount2")}, b"/sandcell", 2)
        """,
        "pivot_root": f"""
            raw_syscall("pivot_root", {_nr("pivot_root")}, b"/tmp", b"/tmp")
        """,
        "chroot": f"""
            raw_syscall("chroot /tmp", {_nr("chroot")}, b"/tmp")
        """,
        "ptrace_traceme": f"""
            raw_syscall("ptrace(PTRACE_TRACEME)", {_nr("ptrace")}, 0, 0, None, None)
        """,
        "ptrace_attach_init": f"""
            raw_syscall("ptrace(PTRACE_ATTACH, 1)", {_nr("ptrace")}, 16, 1, None, None)
            raw_syscall("ptrace(PTRACE_SEIZE, 1)", {_nr("ptrace")}, 0x4206, 1, None, None)
        """,
        "process_vm_readv": f"""
            buf = ctypes.create_string_buffer(16)
            local = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 16)
            remote = (ctypes.c_void_p * 2)(0x400000, 16)
            nr = {_nr("process_vm_readv")}
            raw_syscall("process_vm_readv(pid 1)", nr, 1, local, 1, remote, 1, 0)
        """,
        "bpf": f"""
            # BPF_MAP_CREATE of a one-entry array map: valid, and allowed unprivileged when
            # kernel.unprivileged_bpf_disabled is 0.
            import struct
            attr = ctypes.create_string_buffer(struct.pack("=IIII", 2, 4, 4, 1) + bytes(112))
            raw_syscall("bpf(BPF_MAP_CREATE)", {_nr("bpf")}, 0, attr, 128)
        """,
        "userfaultfd": f"""
            # UFFD_USER_MODE_ONLY: valid for unprivileged callers since Linux 5.11.
            raw_syscall("userfaultfd(UFFD_USER_MODE_ONLY)", {_nr("userfaultfd")}, 1 | os.O_CLOEXEC)
        """,
        "perf_event_open": f"""
            # A software task-clock counter on this thread, user space only: what
            # perf_event_paranoid <= 2 allows anyone.
            import struct
            attr = bytearray(128)
            struct.pack_into("=IIQ", attr, 0, 1, 128, 1)
            struct.pack_into("=Q", attr, 40, (1 << 5) | (1 << 6))  # exclude_kernel, exclude_hv
            buf = ctypes.create_string_buffer(bytes(attr))
            raw_syscall("perf_event_open(task-clock)", {_nr("perf_event_open")}, buf, 0, -1, -1, 0)
        """,
        "keyctl": f"""
            # KEYCTL_GET_KEYRING_ID of the session keyring, creating it: open to anyone.
            raw_syscall("keyctl(GET_KEYRING_ID)", {_nr("keyctl")}, 0, -3, 1)
        """,
        "add_key": f"""
            desc = b"sandcell-escape"
            raw_syscall("add_key(user)", {_nr("add_key")}, b"user", desc, b"x", 1, -2)
            raw_syscall("request_key(user)", {_nr("request_key")}, b"user", desc, None, -2)
        """,
        "io_uring_setup": f"""
            params = ctypes.create_string_buffer(120)
            raw_syscall("io_uring_setup(1)", {_nr("io_uring_setup")}, 1, params)
        """,
        "kexec_load": f"""
            raw_syscall("kexec_load", {_nr("kexec_load")}, 0, 0, None, 0)
            raw_syscall("kexec_file_load", {_nr("kexec_file_load")}, -1, -1, 0, b"", 4)
        """,
        "init_module": f"""
            raw_syscall("init_module", {_nr("init_module")}, b"\\0" * 64, 64, b"")
            fd = os.open("/dev/null", os.O_RDONLY)
            raw_syscall("finit_module(/dev/null)", {_nr("finit_module")}, fd, b"", 0)
            # A module that does not exist: harmless even if the call got through (ENOENT).
            raw_syscall("delete_module", {_nr("delete_module")}, b"sandcell_escape_none", 0x800)
        """,
        "unshare_user": f"""
            raw_syscall("unshare(CLONE_NEWUSER)", {_nr("unshare")}, {CLONE_NEWUSER}, ok={USERNS!r})
        """,
        "unshare_mount_and_net": f"""
            raw_syscall("unshare(CLONE_NEWNS)", {_nr("unshare")}, {CLONE_NEWNS})
            raw_syscall("unshare(CLONE_NEWNET)", {_nr("unshare")}, {CLONE_NEWNET})
        """,
        "setns": f"""
            wanted = ("net", "mnt", "user", "pid")
            present = sorted(os.listdir("/proc/self/ns"))
            others = [n for n in present if n not in wanted]
            for ns in wanted:
                if ns not in present and GVISOR:
                    # gVisor's sentry has no file for every namespace kind (no mnt here): join
                    # another kind instead, or there is nothing of this kind to join at all.
                    if not others:
                        blocked(f"setns into a {{ns}} namespace", "ENOENT: no namespace to join")
                        continue
                    ns = others.pop()
                fd = os.open(f"/proc/self/ns/{{ns}}", os.O_RDONLY)
                raw_syscall(f"setns(/proc/self/ns/{{ns}})", {_nr("setns")}, fd, 0)
                os.close(fd)
            if GVISOR:
                # pid 1 is the sandcell agent, in the program's own namespaces (no bwrap): its
                # files open, joining them must still fail.
                fd = os.open("/proc/1/ns/user", os.O_RDONLY)
                raw_syscall("setns(/proc/1/ns/user)", {_nr("setns")}, fd, 0)
            else:
                # The init's namespaces (bwrap's) are not even open to the code.
                attempt("open /proc/1/ns/user", lambda: os.open("/proc/1/ns/user", os.O_RDONLY),
                        ok=(errno.EACCES, errno.EPERM))
        """,
        "open_by_handle_at": f"""
            # A handle for / (bytes 0-3 handle_bytes, 4-7 handle_type, then the handle): the
            # "shocker" escape brute-forces these to open host inodes outside the mounts.
            import struct
            handle = ctypes.create_string_buffer(8 + 128)
            ctypes.memmove(handle, (128).to_bytes(4, "little"), 4)
            mount_id = ctypes.c_int(0)
            nr = {_nr("name_to_handle_at")}
            raw_syscall("name_to_handle_at(/)", nr, -100, b"/", handle, ctypes.byref(mount_id), 0)
            root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
            # handle_bytes 8, handle_type 1 (FILEID_INO32_GEN), inode 2: a filesystem's root.
            ctypes.memmove(handle, struct.pack("=IiQ", 8, 1, 2), 16)
            raw_syscall("open_by_handle_at(inode 2)", {_nr("open_by_handle_at")}, root, handle, 0)
        """,
        "personality": f"""
            raw_syscall("personality(ADDR_NO_RANDOMIZE)", {_nr("personality")}, 0x0040000)
            raw_syscall("personality(READ_IMPLIES_EXEC)", {_nr("personality")}, 0x0400000)
        """,
        "socket_af_packet": """
            for kind, name in ((socket.SOCK_RAW, "SOCK_RAW"), (socket.SOCK_DGRAM, "SOCK_DGRAM")):
                attempt(f"socket(AF_PACKET, {name})", lambda: socket.socket(17, kind, 0x0300),
                        ok=(errno.EPERM,))
        """,
        "socket_af_netlink": """
            for proto, name in ((0, "NETLINK_ROUTE"), (9, "NETLINK_AUDIT")):
                attempt(f"socket(AF_NETLINK, {name})",
                        lambda: socket.socket(16, socket.SOCK_RAW, proto), ok=(errno.EPERM,))
        """,
        "socket_raw_inet": """
            for fam, name in ((socket.AF_INET, "AF_INET"), (socket.AF_INET6, "AF_INET6")):
                for typ in (socket.SOCK_RAW, socket.SOCK_RAW | socket.SOCK_NONBLOCK):
                    attempt(f"socket({name}, SOCK_RAW, flags {typ:#x})",
                            lambda: socket.socket(fam, typ, socket.IPPROTO_ICMP), ok=(errno.EPERM,))
        """,
        "clone_newuser": f"""
            # Raw clone(2) into a new user namespace; a child that gets through exits at once.
            nr, flags = {_nr("clone")}, {CLONE_NEWUSER | SIGCHLD}
            r = raw_syscall("clone(CLONE_NEWUSER)", nr, flags, None, None, None, None,
                            ok={USERNS!r})
            if r == 0:
                os._exit(0)
            elif r > 0:
                os.waitpid(r, 0)
            flags = {CLONE_NEWNET | SIGCHLD}
            r = raw_syscall("clone(CLONE_NEWNET)", nr, flags, None, None, None, None)
            if r == 0:
                os._exit(0)
            elif r > 0:
                os.waitpid(r, 0)
        """,
        "clone3": f"""
            # clone3's flags live in memory seccomp cannot read: it is refused whole (ENOSYS).
            import struct
            # struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal, stack, ...
            packed = struct.pack("=8Q", {CLONE_NEWUSER}, 0, 0, 0, {SIGCHLD}, 0, 0, 0)
            args = ctypes.create_string_buffer(packed)
            nr = {_nr("clone3")}
            r = raw_syscall("clone3(CLONE_NEWUSER)", nr, args, 64, ok=(errno.ENOSYS, errno.EPERM))
            if r == 0:
                os._exit(0)
        """,
        "new_mount_api": f"""
            raw_syscall("fsopen(tmpfs)", {_nr("fsopen")}, b"tmpfs", 0)
            raw_syscall("open_tree(/, OPEN_TREE_CLONE)", {_nr("open_tree")}, -100, b"/", 1)
            raw_syscall("fspick(/)", {_nr("fspick")}, -100, b"/", 0)
        """,
        "tiocsti": """
            # Push a keystroke into the terminal input queue of whatever shares the tty.
            import fcntl, termios
            for fd in (0, 1, 2):
                attempt(f"ioctl(TIOCSTI) on fd {fd}",
                        lambda: fcntl.ioctl(fd, termios.TIOCSTI, b"x"), ok=(errno.EPERM,))
        """,
        "host_clock_and_name": f"""
            # Harmless values even if a call got through: the sandbox's own host name, no new time
            # (NULL, NULL still needs CAP_SYS_TIME), and Ctrl-Alt-Del handling off.
            raw_syscall("sethostname", {_nr("sethostname")}, b"sandcell", 8)
            raw_syscall("settimeofday", {_nr("settimeofday")}, None, None)
            raw_syscall("reboot(CAD_OFF)", {_nr("reboot")}, 0xfee1dead, 672274793, 0, None)
        """,
    }


ATTEMPTS = {
    "mount": 2, "umount2": 2, "ptrace_attach_init": 2, "add_key": 2, "init_module": 3,
    "unshare_mount_and_net": 2, "setns": 5, "open_by_handle_at": 2, "personality": 2,
    "socket_af_packet": 2, "socket_af_netlink": 2, "socket_raw_inet": 4, "clone_newuser": 2,
    "new_mount_api": 3, "tiocsti": 3, "host_clock_and_name": 3,
    "kexec_load": 2,
}  # fmt: skip
VECTORS = list(_vectors())

# What the guest kernel of a microVM lets an unprivileged process do (there is no seccomp filter
# in the guest: the guest kernel itself is the boundary). Every other vector needs a privilege
# the program lacks there too, and is still expected blocked.
GUEST_KERNEL_ALLOWS = {
    "ptrace_traceme", "userfaultfd", "perf_event_open", "keyctl", "add_key", "io_uring_setup",
    "unshare_user", "setns", "open_by_handle_at", "personality", "socket_af_netlink",
    "clone_newuser", "clone3", "tiocsti",
}  # fmt: skip

# Attack body: the promise of a microVM instead, three verdicts. The program is an unprivileged
# uid with no capabilities, and the kernel answering its calls is the guest's, not the host's.
_GUEST_PROMISE = """
uid = os.getuid()
(blocked if uid != 0 and os.geteuid() != 0 else breach)("run as uid 0", f"uid {uid}")
with open("/proc/self/status") as f:
    caps = {k: v.strip() for k, _, v in (ln.partition(":") for ln in f) if k.startswith("Cap")}
held = {k: v for k, v in caps.items() if k != "CapBnd" and int(v, 16) != 0}
(breach if held or len(caps) < 4 else blocked)("hold a capability", f"{caps!r}")
with open("/proc/sys/kernel/random/boot_id") as f:
    boot_id = f.read().strip()
guest_kernel = (os.uname().release, boot_id)
(breach if HOST_KERNEL[0] in guest_kernel or HOST_KERNEL[1] in guest_kernel else blocked)(
    "reach the host's kernel", f"the guest's kernel {guest_kernel!r}")
# A call the guest kernel allows is reported, not judged: it changes only the guest.
def breach(what, why=None):
    print("GUEST-ALLOWED", what, flush=True)
unexpected = breach
"""


def _host_kernel() -> tuple[str, str]:
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return platform.release(), boot_id


# On the wasm rung these calls are Emscripten's emulation (a socket of any family is handed back
# without a system call) or absent (fcntl, termios): what a test needs there, by vector.
WASM_EMULATED = {
    "socket_af_packet": "sockets",
    "socket_af_netlink": "sockets",
    "socket_raw_inet": "sockets",
    "tiocsti": "ioctl",
}


@pytest.mark.parametrize("vector", VECTORS, ids=VECTORS)
def test_blocks_syscall(attack: Attack, vector: str) -> None:
    # GVISOR: the few bodies whose setting differs under gVisor's sentry branch on it.
    gvisor = attack.sandbox.backend == "gvisor"
    if vector in WASM_EMULATED:
        wasm_cannot(attack.sandbox, WASM_EMULATED[vector])
    body = f"GVISOR = {gvisor!r}\n" + textwrap.dedent(_vectors()[vector])
    if attack.sandbox.backend == "microvm" and vector in GUEST_KERNEL_ALLOWS:
        prelude = f"HOST_KERNEL = {_host_kernel()!r}\n" + _GUEST_PROMISE
        res = attack.run(prelude + body)
        out = attack.expect_blocked(res)
        assert out.count("blocked:") >= 3, out
        # Each attempt ran and was answered by the guest kernel (a child of a clone may add one).
        answered = out.count("blocked:") - 3 + out.count("GUEST-ALLOWED")
        assert answered >= ATTEMPTS.get(vector, 1), out
        return
    res = attack.run(body)
    attack.expect_blocked(res, attempts=ATTEMPTS.get(vector, 1))


def test_blocks_privileges_in_status(
    attack: Attack, request: pytest.FixtureRequest, token: str
) -> None:
    """No capabilities in any set, no_new_privs on, a seccomp filter installed (mode 2), and no
    way to become uid 0 (or, in rootless gVisor, nothing that being uid 0 there grants)."""
    gvisor = attack.sandbox.backend == "gvisor"
    # Rootless runsc's gofer can create files only as the invoking user, which the sentry shows
    # as uid 0: there the program runs as uid 0 *inside gVisor's own user namespace* (a design
    # the lead accepted), so setuid(0) trivially succeeds. What protects the host instead: no
    # capabilities, no_new_privs, a read-only runtime, chown refused, and the files it makes are
    # the invoking user's on the host (checked from the host below).
    rootless_gvisor = gvisor and attack.identity == "user"
    # A microVM guest has no seccomp filter and no no_new_privs (its kernel is the boundary) and
    # keeps the full bounding set, which only a setuid or file-capability program could turn into
    # privileges: what is asserted there instead is that the guest's image has no such program,
    # and that the kernel is the guest's own.
    microvm = attack.sandbox.backend == "microvm"
    # The scan walks the whole guest image (about 15 s under TCG); the image is the same whoever
    # starts the VM, so it is scanned once, in root's case.
    scan = microvm and attack.identity == "root"
    marker = f"{token}.txt"
    body = f"""
    import time
    GVISOR, ROOTLESS_GVISOR, MARKER = {gvisor!r}, {rootless_gvisor!r}, {marker!r}
    MICROVM, HOST_KERNEL, SCAN = {microvm!r}, {_host_kernel()!r}, {scan!r}
    with open("/proc/self/status") as f:
        fields = dict(line.rstrip("\\n").split(":\\t", 1) for line in f if ":\\t" in line)
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        v = fields.get(key)
        if key == "CapBnd" and MICROVM:
            continue  # judged below, through the programs that could use it
        if v is None and key == "CapAmb" and GVISOR:
            # gVisor's status has no CapAmb line: ask for each capability instead. Its prctl
            # knows no ambient set at all (EINVAL); a kernel that has one answers 0 or 1.
            states = set()
            for cap in range(64):
                ctypes.set_errno(0)
                r = _libc.prctl(47, 1, cap, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET
                states.add(r if r != -1 else errno.errorcode.get(ctypes.get_errno()))
            if 1 in states:
                breach(f"an ambient capability is set: {{states!r}}")
            elif states <= {{0, "EINVAL"}}:
                blocked("CapAmb empty", f"PR_CAP_AMBIENT_IS_SET gives {{sorted(map(str, states))}}")
            else:
                unexpected("PR_CAP_AMBIENT_IS_SET", repr(states))
        elif v is not None and int(v, 16) == 0:
            blocked(f"{{key}} empty", v)
        else:
            breach(f"{{key}} = {{v!r}}")
    if SCAN:
        privileged, scanned = [], 0
        for top, dirs, files in os.walk("/"):
            dirs[:] = [d for d in dirs if os.path.join(top, d) not in ("/proc", "/sys", "/dev")]
            for name in files:
                path = os.path.join(top, name)
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
                    continue
                scanned += 1
                if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    privileged.append(path)
                    continue
                try:
                    os.getxattr(path, "security.capability", follow_symlinks=False)
                except OSError:
                    continue
                privileged.append(path + " (file capabilities)")
        (breach if privileged or scanned < 50 else blocked)(
            "gain privileges through a setuid or file-capability program",
            f"{{scanned}} programs, privileged: {{privileged[:20]!r}}")
    if MICROVM:
        with open("/proc/sys/kernel/random/boot_id") as f:
            guest_kernel = (os.uname().release, f.read().strip())
        (breach if set(HOST_KERNEL) & set(guest_kernel) else blocked)(
            "reach the host's kernel", f"the guest's kernel {{guest_kernel!r}}")
    else:
        # prctl rather than status: gVisor's status has no NoNewPrivs line.
        nnp = _libc.prctl(39, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS
        (blocked if nnp == 1 else breach)("no_new_privs = 1", f"PR_GET_NO_NEW_PRIVS gives {{nnp}}")
        v = fields.get("Seccomp", "").strip()
        (blocked if v == "2" else breach)("Seccomp = 2", repr(v))
    if ROOTLESS_GVISOR:
        print("uid", os.getuid(), "euid", os.geteuid(), flush=True)
        attempt("write the runtime as uid 0", lambda: open(sys.executable, "ab") and "opened",
                ok=(errno.EACCES, errno.EROFS))
        attempt("write /etc/passwd as uid 0", lambda: open("/etc/passwd", "a") and "opened",
                ok=(errno.EACCES, errno.EROFS))
        with open(MARKER, "w") as f:
            f.write("made by uid 0 in the sentry")
        attempt("chown a workspace file to uid 1234",
                lambda: os.chown(MARKER, 1234, 1234) or "chowned", ok=(errno.EPERM,))
        # The host stats the file through runsc's gofer, then removes it: wait for that.
        deadline = time.monotonic() + 20
        while os.path.exists(MARKER) and time.monotonic() < deadline:
            time.sleep(0.05)
        print("the host looked:", not os.path.exists(MARKER), flush=True)
    else:
        attempt("setuid(0)", lambda: os.setuid(0) or "uid 0", ok=(errno.EPERM, errno.EINVAL))
    """
    if not rootless_gvisor:
        res = attack.run(body)
        attack.expect_blocked(res, attempts=(7 if scan else 6) if microvm else 8)
        return
    seen: list[os.stat_result] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_stat_through_gofer, args=(marker, seen, stop))
    watcher.start()
    try:
        res = attack.run(body)
    finally:
        stop.set()
        watcher.join(timeout=10)
    out = attack.expect_blocked(res, attempts=10)
    assert "uid 0 euid 0" in out, out
    assert "the host looked: True" in out and seen, f"the host never saw {marker}: {out}"
    owner = pwd.getpwnam(request.getfixturevalue("unpriv").user)
    assert (seen[0].st_uid, seen[0].st_gid) == (owner.pw_uid, owner.pw_gid), (
        f"ESCAPE: a file uid 0 made in rootless gVisor is owned by {seen[0].st_uid} on the host"
    )


def _stat_through_gofer(name: str, seen: list[os.stat_result], stop: threading.Event) -> None:
    """Wait for the workspace file ``name`` in a runsc gofer's view (the gofer serves the
    workspace from the host, so its root shows host owners), stat it, then remove it."""
    rel = Path(SANDBOX_WORKDIR.lstrip("/")) / name
    while not stop.wait(0.05):
        for entry in Path("/proc").iterdir():
            try:
                if not (entry / "cmdline").read_bytes().startswith(b"runsc-gofer"):
                    continue
                path = entry / "root" / rel
                st = path.stat()
                path.unlink()
            except OSError:
                continue
            seen.append(st)
            return


def test_blocks_mount_calls_with_the_full_filter(attack: Attack) -> None:
    """The mount calls a warm template's setup filter allows are refused by the run's own filter.

    Arguments the kernel rejects before it checks privileges make the filter visible: without it
    both calls fail with EINVAL, with it with EPERM. A warm run that kept only the template's
    setup filter (which allows them) would show EINVAL here, so this also proves that warm runs
    install the cold path's full filter.
    """
    if attack.sandbox.backend != "namespaces":
        pytest.skip("this checks the namespaces backend's seccomp filter; other rungs differ")
    body = f"""
        raw_syscall("umount2(/tmp, invalid flags)", {_nr("umount2")}, b"/tmp", 0x100)
        nr = {_nr("mount_setattr")}
        raw_syscall("mount_setattr(/, size 0)", nr, -100, b"/", 0, None, 0)
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=2)
