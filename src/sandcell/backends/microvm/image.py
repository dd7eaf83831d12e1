"""The guest's root filesystem and its manifest: built from one runtime, content-hashed.

``sandcell vm build [--runtime NAME]`` (:func:`build`) stages what a run needs and nothing else
of the host: the runtime's base interpreter and standard library, the runtime's environment (the
default runtime's site-packages with numpy, pandas, matplotlib; a named runtime's stored tree,
``sandcell runtime build``), bash and the usual tools, the shared libraries all of them load
(resolved with ``ldd``), a synthetic ``/etc``, and the guest agent. The runtime sits at the
neutral paths the namespaces backend shows (``_runtime_view.py``): ``/usr`` stays ``/usr``, a
base interpreter installed elsewhere is at ``/opt/sandcell/python`` and a virtual environment at
``/opt/sandcell/venv`` (its site-packages, the interpreter as ``bin/python`` and a ``pyvenv.cfg``
naming the neutral base), so no path of the host's install is a name in the guest. The tree becomes
a read-only ext4 image (``mkfs.ext4 -d``, no root needed); the initramfs carries busybox and the
virtio modules. ``manifest.json`` records the sha256 of the kernel, the initramfs and the image,
and the runtime the image was built from (its name, hash and, for a named runtime, tree hash).

Each runtime has its own image (``layout.image_dir``): ``image/`` for the default runtime,
``image-<name>/`` for a named one. A named runtime's bytecode already names the guest's paths
(compiled for them when the runtime was built) and is copied as it is.

Before use, :func:`verify` checks every hash (the image's through a stat-keyed cache, so the 500
MB image is re-read only when its inode changed): a mismatch is refused as tampering, never run.
An image built from another runtime than the one asked for (another name, or a named runtime
rebuilt since) is refused with the command that rebuilds it.

Security limitations: the manifest sits next to the image; whoever can write the directory can
rewrite both, so the directory must be writable by its owner (root for the system-wide one) only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import importlib.util
import json
import os
import py_compile
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from sandcell.backends import inside
from sandcell.backends.host import neutral_bytecode
from sandcell.backends.host.layout import ETC_FILES
from sandcell.backends.microvm import initramfs, layout
from sandcell.errors import ConfigError, InfraError, IsolationUnavailable
from sandcell.runtimes import bash_runtime, python_runtime
from sandcell.spec import DEFAULT_RUNTIME

FORMAT = 1
IMAGE_NAME = "root.ext4"
INITRD_NAME = "initrd.cpio"
MANIFEST_NAME = "manifest.json"
_VERIFIED_NAME = ".verified.json"
TOOL_PACKAGES = ("bash", "coreutils", "grep", "sed", "mawk", "findutils", "diffutils", "gzip")
"""Debian packages whose programs the guest gets, for bash runs."""
_STDLIB_SKIP = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3")
_GUEST_PACKAGE = Path(__file__).with_name("guest")
_AGENT_FILES = {
    "agent.py": Path(__file__).with_name("_agent.py"),
    **{f"guest/{p.name}": p for p in sorted(_GUEST_PACKAGE.glob("*.py"))},
    "runner.py": Path(__file__).with_name("_runner.py"),
    "display.py": inside.DISPLAY_SCRIPT,
}
"""The guest-side files under /opt/sandcell: the agent's entry script and its package
(``guest/``, which the entry imports), the runner and the display module."""
_FIX_BUILD = "run scripts/install-vm (once, as root), then: sandcell vm build"


def _runtime_name(runtime: str | None) -> str:
    return runtime or DEFAULT_RUNTIME


def build_command(runtime: str | None = None) -> str:
    """The command that builds the image of ``runtime``."""
    name = _runtime_name(runtime)
    return "sandcell vm build" + ("" if name == DEFAULT_RUNTIME else f" --runtime {name}")


def _fix_build(runtime: str | None) -> str:
    if _runtime_name(runtime) == DEFAULT_RUNTIME:
        return _FIX_BUILD
    return f"run scripts/install-vm (once, as root), then: {build_command(runtime)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """What ``sandcell vm build`` made, with the hash of each piece."""

    format: int
    kernel_release: str
    kernel_sha256: str
    initrd_sha256: str
    image_sha256: str
    image_bytes: int
    runtime_sha256: str
    runtime_identity: str
    python: str
    """The runtime's interpreter inside the guest (a neutral path, see module)."""
    bash: str
    built_at: str
    agent_sha256: str = ""
    """The hash of the guest agent (entry script and package), runner and display module baked
    in (:func:`agent_sha256`); empty in manifests written before it was recorded."""
    runtime: str = DEFAULT_RUNTIME
    """The runtime the image was built from (manifests written before runtimes had names hold
    the default one)."""
    runtime_tree_sha256: str = ""
    """A named runtime's content hash (``Runtime.tree_sha256``); empty for ``default``."""
    node_tree_sha256: str = ""
    """The Node runtime the image holds for JavaScript and TypeScript programs (its tree hash,
    ``sandcell runtime build node``); empty when none was built when the image was."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GuestFiles:
    """The verified files of one guest: what QEMU is started with."""

    kernel: Path
    initrd: Path
    image: Path
    manifest: Manifest
    image_key: tuple[int, ...] = ()
    """The image file's identity (device, inode, size, times) when it was verified: a VM is
    never started on a file put there since (:func:`replaced`)."""


def agent_sha256() -> str:
    """The hash of the guest-side files this sandcell ships: an image built from others speaks
    another version of the agent's protocol, so it is refused rather than half understood."""
    h = hashlib.sha256()
    # An image from before the package's bytecode was built in lacks it: rebuilt, not reused.
    h.update(b"guest package compiled ahead\0")
    for name in sorted(_AGENT_FILES):
        data = _AGENT_FILES[name].read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# -- loading and verifying ---------------------------------------------------------------------


def load_manifest(base: Path | None = None, runtime: str | None = None) -> Manifest:
    """The manifest of the image built from ``runtime`` (None: ``default``); IsolationUnavailable
    when there is none, it is bad, or it was built from another runtime."""
    name = _runtime_name(runtime)
    path = layout.image_dir(base, name) / MANIFEST_NAME
    fix = _fix_build(name)
    try:
        doc = json.loads(path.read_text())
        manifest = Manifest(**doc)
    except FileNotFoundError:
        what = "no guest image is built" + (
            "" if name == DEFAULT_RUNTIME else f" for runtime {name}"
        )
        raise IsolationUnavailable("microvm image", f"{what} ({path} is missing)", fix) from None
    except (OSError, ValueError, TypeError) as exc:
        raise IsolationUnavailable(
            "microvm image", f"the manifest {path} is unreadable ({exc})", fix
        ) from None
    if manifest.format != FORMAT:
        raise IsolationUnavailable(
            "microvm image", f"the image has format {manifest.format}, not {FORMAT}", fix
        )
    if manifest.agent_sha256 != agent_sha256():
        raise IsolationUnavailable(
            "microvm image",
            f"the image (built {manifest.built_at}) holds another version of sandcell's guest "
            "agent than this sandcell ships",
            f"rebuild it for this version: {build_command(name)}",
        )
    _check_runtime(manifest, name, path)
    return manifest


def _check_runtime(manifest: Manifest, name: str, path: Path) -> None:
    """Refuse an image of another runtime, or of an older build of this named runtime (the
    default runtime is the environment sandcell runs in: its image is not tied to its hash)."""
    if manifest.runtime != name:
        raise IsolationUnavailable(
            "microvm image",
            f"the image {path.parent} was built from runtime {manifest.runtime}, not {name}",
            f"rebuild it: {build_command(name)}",
        )
    if name == DEFAULT_RUNTIME:
        return
    current = python_runtime(name).tree_sha256
    if manifest.runtime_tree_sha256 != current:
        raise IsolationUnavailable(
            "microvm image",
            f"the image {path.parent} holds runtime {name} {manifest.runtime_tree_sha256[:12]}, "
            f"but this host's runtime {name} is {current[:12]} (rebuilt since)",
            f"rebuild the image: {build_command(name)}",
        )


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    # ctime cannot be set by a writer: any change to the file's bytes moves it.
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def verify(base: Path | None = None, runtime: str | None = None) -> GuestFiles:
    """The guest files of ``runtime``'s image (None: ``default``), after checking every hash
    against the manifest (fail closed)."""
    kdir, idir = layout.kernel_dir(base), layout.image_dir(base, runtime)
    manifest = load_manifest(base, runtime)
    fix = _fix_build(runtime)
    files = GuestFiles(
        kernel=kdir / "vmlinuz",
        initrd=idir / INITRD_NAME,
        image=idir / IMAGE_NAME,
        manifest=manifest,
    )
    expected = {
        files.kernel: manifest.kernel_sha256,
        files.initrd: manifest.initrd_sha256,
        files.image: manifest.image_sha256,
    }
    cache_path = idir / _VERIFIED_NAME
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    fresh: dict[str, object] = {}
    for path, digest in expected.items():
        try:
            key = _stat_key(path)
        except OSError as exc:
            raise IsolationUnavailable(
                "microvm image", f"{path} is missing ({exc.strerror})", fix
            ) from None
        entry = cache.get(str(path)) if isinstance(cache, dict) else None
        if entry == {"key": key, "sha256": digest}:
            fresh[str(path)] = entry
            continue
        actual = sha256_file(path)
        if actual != digest:
            raise IsolationUnavailable(
                "microvm image",
                f"{path} does not match its manifest (sha256 {actual[:16]}..., expected "
                f"{digest[:16]}...): the file was changed or tampered with",
                "rebuild it: " + fix,
            )
        fresh[str(path)] = {"key": key, "sha256": digest}
    if fresh != cache:
        # Only an optimisation: a directory this user cannot write is verified every time.
        with contextlib.suppress(OSError):
            _write_atomic(cache_path, json.dumps(fresh).encode(), 0o644)
    image_entry = fresh[str(files.image)]
    assert isinstance(image_entry, dict)
    return replace(files, image_key=tuple(image_entry["key"]))


def replaced(files: GuestFiles) -> bool:
    """Whether the image file is no longer the one :func:`verify` checked (``sandcell vm build``
    replaced it since): a snapshot's RAM holds the old file system's pages, and a verified
    manifest's hash would no longer describe the disk."""
    if not files.image_key:
        return False
    try:
        return tuple(_stat_key(files.image)) != files.image_key
    except OSError:
        return True


# -- building ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RootPlan:
    """The root tree as data: host files and trees to copy, links and files to create."""

    trees: tuple[str, ...]
    """Host directories copied whole, at the same path."""
    moved: tuple[tuple[str, str], ...] = ()
    """(host path, guest path): host files and directories copied to a neutral place."""
    files: tuple[str, ...]
    """Host files copied at the same path (links among them are kept as links)."""
    links: tuple[tuple[str, str], ...]
    """(path, target) symlinks."""
    generated: tuple[tuple[str, bytes, int], ...]
    """(path, content, mode) files written by sandcell."""
    dirs: tuple[str, ...]
    """Empty directories (mount points)."""
    prebuilt: tuple[str, ...] = ()
    """Host directories among ``moved`` whose bytecode already names the guest's paths (a named
    runtime's site-packages): copied without the bytecode rewrite."""


INTERPRETER_FILE = "/opt/sandcell/interpreter"
"""Names the runtime's interpreter in the guest, for the agent that starts the runner."""


def plan_root(runtime: str | None = None) -> RootPlan:
    """What the guest's root holds, from the runtime ``runtime`` (None: ``default``, this
    environment's own)."""
    py = python_runtime(runtime)
    stdlib = sysconfig.get_paths()["stdlib"]
    base_python = os.path.realpath(sys.executable)
    trees: list[str] = []
    files: list[str] = []
    # The runtime's neutral view: what stays at its host path (under /usr) is copied there, the
    # rest (a venv, a base prefix under a home) moves to /opt/sandcell.
    moved = [(host, guest) for host, guest in py.mounts if host != guest]
    if not any(_under(stdlib, host) for host, _ in moved):
        trees.append(stdlib)
    if not any(_under(base_python, host) for host, _ in moved):
        files.append(base_python)
    files += _package_programs(TOOL_PACKAGES)
    links = [(link, target) for link, target in py.symlinks]
    etc = {**ETC_FILES, "hostname": "sandcell\n", "machine-id": ""}
    generated = [(f"/etc/{name}", text.encode(), 0o644) for name, text in etc.items()]
    generated += [
        (f"/opt/sandcell/{name}", src.read_bytes(), 0o644) for name, src in _AGENT_FILES.items()
    ]
    generated += _guest_bytecode()
    # The neutral venv's pyvenv.cfg, and empty files over hooks that name the host's sources.
    generated += [(path, text.encode(), 0o644) for path, text in py.files]
    generated.append((INTERPRETER_FILE, py.sandbox_python.encode(), 0o644))
    # Node and its packages at the sandbox's paths, when built: ldd of the staged binary brings
    # the C++ runtime it links (libstdc++, libgcc_s), as it does the Python extensions'.
    node = _node_mounts()
    moved += node
    # /etc/fonts: matplotlib finds fonts quietly; C.utf8: the locale every program gets.
    trees += [d for d in ("/etc/fonts", "/usr/lib/locale/C.utf8") if os.path.isdir(d)]
    dirs: tuple[str, ...] = ("/proc", "/sys", "/dev", "/tmp", "/sandbox", "/home/user", "/inputs")
    dirs += ("/packages",)
    dirs += ("/sandcell", "/run")
    return RootPlan(
        trees=tuple(trees),
        moved=tuple(moved),
        files=tuple(dict.fromkeys(files)),
        links=tuple(links),
        generated=tuple(generated),
        dirs=dirs,
        prebuilt=(*py.prebuilt_bytecode, *(host for host, _ in node)),
    )


def _node_mounts() -> list[tuple[str, str]]:
    """(host, guest) of the Node runtime's trees, or none where it is not built (the image then
    runs no JavaScript: :func:`node_missing` says so before such a run)."""
    built = node_tree_sha256()
    if not built:
        return []
    from sandcell.runtimes.node import SANDBOX_NODE, SANDBOX_NODE_MODULES, node_runtime

    # The sandbox paths of every rung.
    wanted = (SANDBOX_NODE, SANDBOX_NODE_MODULES)
    return [(host, guest) for host, guest in node_runtime().mounts if guest in wanted]


def node_tree_sha256() -> str:
    """The tree hash of this host's Node runtime (empty where none is built)."""
    from sandcell.runtimes.node import stored_node

    try:
        return stored_node().manifest.tree_sha256
    except ConfigError:
        return ""


def node_missing(manifest: Manifest) -> IsolationUnavailable | None:
    """Why an image cannot run a JavaScript or TypeScript program (None when it can): it holds
    no Node runtime, or another build than this host's."""
    fix = f"sandcell runtime build node, then: {build_command(manifest.runtime)}"
    current = node_tree_sha256()
    if not manifest.node_tree_sha256:
        return IsolationUnavailable(
            "microvm image",
            f"the guest image (built {manifest.built_at}) holds no Node.js runtime",
            f"build it into the image: {fix}",
        )
    if manifest.node_tree_sha256 != current:
        return IsolationUnavailable(
            "microvm image",
            f"the guest image holds Node runtime {manifest.node_tree_sha256[:12]}, but this "
            f"host's is {current[:12] or 'not built'}",
            f"rebuild the image: {fix}",
        )
    return None


def _guest_bytecode() -> list[tuple[str, bytes, int]]:
    """The agent package's modules compiled ahead, where the guest's interpreter (this one's,
    linked into the image) looks for them: without them pid 1 compiles every module at each cold
    boot, under TCG (the image is read-only, nothing is cached there). Unchecked hash-based
    bytecode: the image is rebuilt whenever a source changes (:func:`agent_sha256`)."""
    out: list[tuple[str, bytes, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in _AGENT_FILES.items():
            if not name.startswith("guest/"):
                continue
            guest_path = f"/opt/sandcell/{name}"
            cfile = os.path.join(tmp, "out.pyc")
            py_compile.compile(
                str(src),
                cfile=cfile,
                dfile=guest_path,
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
            )
            pyc = importlib.util.cache_from_source(guest_path)
            out.append((pyc, Path(cfile).read_bytes(), 0o644))
    return out


def _package_programs(packages: Iterable[str]) -> list[str]:
    """The programs (under bin directories) the Debian ``packages`` installed."""
    try:
        out = subprocess.run(
            ["dpkg", "-L", *packages], capture_output=True, text=True, check=False, timeout=60
        ).stdout
    except OSError:
        return [p for p in ("/usr/bin/bash", "/bin/bash") if os.path.exists(p)][:1]
    progs = []
    for line in out.splitlines():
        if line.startswith(("/bin/", "/usr/bin/", "/sbin/", "/usr/sbin/")) and os.path.isfile(line):
            progs.append(line)
    return progs


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def guest_path(host: str, moved: Iterable[tuple[str, str]]) -> str:
    """Where the host path ``host`` is in the guest (its moved place, else the same path)."""
    for src, dest in sorted(moved, key=lambda m: -len(m[0])):
        if _under(host, src):
            return dest + host[len(src.rstrip("/")) :] if host != src else dest
    return host


def _copy_moved(src: str, dest: str, root: Path, *, prebuilt: bool = False) -> None:
    """The host file or directory ``src`` at ``dest`` in the guest: its content, never its
    host path (links inside are kept as they are: a venv's are relative or point into /usr).
    Its bytecode is rewritten to name the sources at ``dest`` (``co_filename`` would name the
    host's place), unless it is ``prebuilt`` for them already; bytecode of another interpreter
    is left out."""
    target = root / dest.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if not os.path.isdir(src):
        shutil.copy2(os.path.realpath(src), target)
        return
    shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True)
    if prebuilt:
        return
    for dirpath, _dirs, names in os.walk(target):
        if os.path.basename(dirpath) != "__pycache__":
            continue
        package = os.path.dirname(os.path.relpath(dirpath, target))
        for name in names:
            path = Path(dirpath) / name
            if not name.endswith(".pyc") or path.is_symlink():
                continue
            source = os.path.normpath(os.path.join(dest, package, name.split(".", 1)[0] + ".py"))
            new = neutral_bytecode.rewrite(path.read_bytes(), source)
            if new is None:
                path.unlink()
            else:
                path.write_bytes(new)


def _copy_file(src: str, root: Path) -> None:
    src = _host_path(src)
    dest = root / src.lstrip("/")
    if os.path.lexists(dest):
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if os.path.islink(src):
        target = os.readlink(src)
        os.symlink(target, dest)
        resolved = os.path.join(os.path.dirname(src), target)
        _copy_file(os.path.normpath(resolved), root)
        return
    shutil.copy2(src, dest, follow_symlinks=False)


def _copy_tree(src: str, root: Path) -> None:
    dest = root / src.lstrip("/")
    skip = set(_STDLIB_SKIP) if src == sysconfig.get_paths()["stdlib"] else set()

    def ignore(d: str, names: list[str]) -> set[str]:
        return skip & set(names) if d == src else set()

    shutil.copytree(src, dest, symlinks=True, ignore=ignore, dirs_exist_ok=True)


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _host_path(p: str) -> str:
    """``p`` with the host's root links (``/lib`` → ``usr/lib``) resolved, as staged."""
    return os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))


def _shared_libraries(root: Path, moved: Iterable[tuple[str, str]] = ()) -> set[str]:
    """Host paths of the shared libraries the staged ELF files load (ldd of each), but those
    of a moved tree (staged there already)."""
    moved_from = [src for src, _ in moved]
    needed: set[str] = set()
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.is_symlink() or not (".so" in name or "/bin" in dirpath):
                continue
            if not _is_elf(path):
                continue
            proc = subprocess.run(
                ["ldd", str(path)], capture_output=True, text=True, check=False, timeout=60
            )
            for line in proc.stdout.splitlines():
                parts = line.split()
                lib = parts[2] if len(parts) >= 3 and parts[1] == "=>" else parts[0]
                if lib.startswith(f"{root}/"):
                    continue  # bundled next to a staged file ($ORIGIN): staged with it already
                if any(_under(os.path.realpath(lib), src) for src in moved_from):
                    continue
                if lib.startswith("/") and os.path.exists(lib):
                    staged = root / _host_path(lib).lstrip("/")
                    if not staged.exists():
                        needed.add(lib)
    return needed


def stage(plan: RootPlan, root: Path) -> None:
    """Lay out ``plan`` under ``root``."""
    for link, target in plan.links:
        (root / link.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, root / link.lstrip("/"))
    for tree in plan.trees:
        _copy_tree(tree, root)
    for src, place in plan.moved:
        prebuilt = any(_under(os.path.realpath(src), p) for p in plan.prebuilt)
        _copy_moved(src, place, root, prebuilt=prebuilt)
    for f in plan.files:
        _copy_file(f, root)
    for lib in sorted(_shared_libraries(root, plan.moved)):
        _copy_file(lib, root)
    _libraries_of_moved_prefix(plan, root)
    for d in plan.dirs:
        (root / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    for path, data, mode in plan.generated:
        dest = root / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        dest.chmod(mode)
    # The agent starts as /usr/bin/python3 -I -S: the base interpreter, not the environment's.
    guest_python = root / initramfs.GUEST_PYTHON.lstrip("/")
    if not os.path.lexists(guest_python):
        guest_python.parent.mkdir(parents=True, exist_ok=True)
        base = guest_path(os.path.realpath(sys.executable), plan.moved)
        same_dir = os.path.dirname(base) == os.path.dirname(initramfs.GUEST_PYTHON)
        os.symlink(os.path.basename(base) if same_dir else base, guest_python)


def _libraries_of_moved_prefix(plan: RootPlan, root: Path) -> None:
    """A shared ``libpython`` of a base prefix that moved: its interpreter's RUNPATH names the
    host prefix, which the guest does not have, so the loader finds it in ``/usr/lib``."""
    for _, dest in plan.moved:
        lib_dir = root / dest.lstrip("/") / "lib"
        if not lib_dir.is_dir() or dest.endswith("/venv"):
            continue
        for lib in lib_dir.glob("libpython*.so*"):
            staged = root / "usr" / "lib" / lib.name
            if not os.path.lexists(staged):
                staged.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(lib, staged, follow_symlinks=True)


def _tree_bytes(root: Path) -> tuple[int, int]:
    total, count = 0, 0
    for dirpath, dirs, names in os.walk(root):
        for name in names + dirs:
            count += 1
            st = os.lstat(os.path.join(dirpath, name))
            total += (st.st_size + 4095) // 4096 * 4096
    return total, count


def make_ext4(tree: Path, image: Path) -> None:
    """An ext4 image of ``tree`` (no journal: it is only ever mounted read-only)."""
    size, count = _tree_bytes(tree)
    size_mib = int(size * 1.15) // (1 << 20) + 64
    inodes = count + 4096
    cmd = [
        shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4",
        "-q",
        "-F",
        "-O",
        "^has_journal",
        "-N",
        str(inodes),
        "-L",
        "sandcell-root",
        "-E",
        "root_owner=0:0",
        "-d",
        str(tree),
        str(image),
        f"{size_mib}M",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    if proc.returncode != 0:
        raise InfraError(f"mkfs.ext4 failed: {proc.stderr.strip()[-500:]}")


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


def build(
    base: Path | None = None,
    *,
    runtime: str | None = None,
    busybox: Path = Path("/bin/busybox"),
) -> Manifest:
    """Build the guest image and initramfs of ``runtime`` (None: ``default``, this environment's
    own) into its image directory; returns the manifest.

    Needs the kernel of ``scripts/install-vm``, a static busybox and, for a named runtime, that
    runtime built (``sandcell runtime build NAME``).
    """
    name = _runtime_name(runtime)
    kdir, idir = layout.kernel_dir(base), layout.image_dir(base, name)
    kernel = kdir / "vmlinuz"
    if not kernel.is_file():
        raise ConfigError(f"no guest kernel at {kernel}; run scripts/install-vm first")
    if not busybox.is_file():
        raise ConfigError(f"no static busybox at {busybox}; apt-get install busybox-static")
    modules = {p.stem: p.read_bytes() for p in (kdir / "modules").glob("*.ko")}
    try:
        initrd = initramfs.cpio_newc(initramfs.entries(busybox.read_bytes(), modules))
    except ValueError as exc:
        raise ConfigError(f"{exc}; run scripts/install-vm again") from None
    # Resolved (and a named runtime verified) before anything is written.
    py, bash = python_runtime(name), bash_runtime(name)
    node_sha = node_tree_sha256()
    idir.mkdir(parents=True, exist_ok=True)
    agent = agent_sha256()
    with tempfile.TemporaryDirectory(prefix=".build-", dir=idir) as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        stage(plan_root(name), root)
        image_tmp = Path(tmp) / IMAGE_NAME
        make_ext4(root, image_tmp)
        image_tmp.chmod(0o444)
        image_sha = sha256_file(image_tmp)
        image_size = image_tmp.stat().st_size
        os.replace(image_tmp, idir / IMAGE_NAME)
    _write_atomic(idir / INITRD_NAME, initrd, 0o444)
    manifest = Manifest(
        format=FORMAT,
        kernel_release=(kdir / "release").read_text().strip(),
        kernel_sha256=sha256_file(kernel),
        initrd_sha256=hashlib.sha256(initrd).hexdigest(),
        image_sha256=image_sha,
        image_bytes=image_size,
        runtime_sha256=py.sha256,
        runtime_identity=py.identity,
        python=py.sandbox_python,
        bash=bash.interpreter,
        built_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        agent_sha256=agent,
        runtime=name,
        runtime_tree_sha256=py.tree_sha256,
        node_tree_sha256=node_sha,
    )
    _write_atomic(idir / MANIFEST_NAME, json.dumps(asdict(manifest), indent=2).encode(), 0o644)
    with_cache = idir / _VERIFIED_NAME
    with_cache.unlink(missing_ok=True)
    idir.chmod(0o755)
    return manifest


__all__ = [
    "INTERPRETER_FILE",
    "GuestFiles",
    "Manifest",
    "RootPlan",
    "agent_sha256",
    "build",
    "build_command",
    "guest_path",
    "load_manifest",
    "node_missing",
    "node_tree_sha256",
    "plan_root",
    "replaced",
    "sha256_file",
    "stage",
    "verify",
]
