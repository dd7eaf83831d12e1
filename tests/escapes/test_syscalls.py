"""Escapes through dangerous system calls, made raw through ctypes so no library wrapper hides the
errno. Each call is given valid arguments where that is possible, so that only the sandbox (the
seccomp filter, dropped capabilities, the disabled user namespaces) stands between it and success:
a failure with an unrelated errno (EINVAL, EFAULT) is reported as unexpected, not as blocked.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

import pytest

from sandcell.backends.namespaces import seccomp

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
            for ns in ("net", "mnt", "user", "pid"):
                fd = os.open(f"/proc/self/ns/{{ns}}", os.O_RDONLY)
                raw_syscall(f"setns(/proc/self/ns/{{ns}})", {_nr("setns")}, fd, 0)
                os.close(fd)
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


@pytest.mark.parametrize("vector", VECTORS, ids=VECTORS)
def test_blocks_syscall(attack: Attack, vector: str) -> None:
    res = attack.run(_vectors()[vector])
    attack.expect_blocked(res, attempts=ATTEMPTS.get(vector, 1))


def test_blocks_privileges_in_status(attack: Attack) -> None:
    """No capabilities in any set, no_new_privs on, a seccomp filter installed (mode 2)."""
    body = """
    with open("/proc/self/status") as f:
        fields = dict(line.rstrip("\\n").split(":\\t", 1) for line in f if ":\\t" in line)
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        v = fields.get(key)
        if v is not None and int(v, 16) == 0:
            blocked(f"{key} empty", v)
        else:
            breach(f"{key} = {v!r}")
    for key, want in (("NoNewPrivs", "1"), ("Seccomp", "2")):
        v = fields.get(key, "").strip()
        if v == want:
            blocked(f"{key} = {want}", v)
        else:
            breach(f"{key} = {v!r}, wanted {want}")
    attempt("setuid(0)", lambda: os.setuid(0) or "uid 0", ok=(errno.EPERM, errno.EINVAL))
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=8)


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
