"""Host paths a sandbox binds, served from overlays so that ``/proc/self/mountinfo`` names none.

For every bind mount the kernel shows, in mountinfo's fourth field, the source directory's path
within its filesystem: a venv bound from ``/home/alice/proj/.venv/lib/.../site-packages`` shows
that path whatever its mount point inside. Only a source that is itself the root of a filesystem
(or a path inside one that holds nothing of the host's layout) shows a neutral root. A read-only
overlayfs gives that at the cost of one mount: its root is ``/``, its source is the name we give
(``sandcell``), and its options print the ``lowerdir=`` string as it was given, which names the
layers as ``/proc/self/fd/N`` of the mounting process: the kernel resolves those magic links at
mount time and keeps only the text.

So each read-only host source that is not bound at its own path (the runtime's moved
directories, the control directory, the synthetic ``/etc`` files, inputs, cache packages) is
planned as an overlay of its directory (of its parent for a file, which is then bound from inside
the overlay: the root field becomes ``/<file name>``), mounted at ``<view>/<n>/<name>`` before the
sandbox starts: by the supervisor on the host as root (the workspace tmpfs is mounted there the
same way), or by the workspace helper in its own namespace for an ordinary user. A read-only
overlay needs two layers: the second is the neutral bytecode tree of a runtime directory
(``neutral_bytecode.py``) or else the (empty) mount point itself.

:func:`plan` is pure; :func:`mount_all` applies a plan on the host. Sources bound at their own
path (``/usr``, ``/etc/fonts``) name nothing new and stay plain binds; so does the writable
workspace, a tmpfs whose root is already ``/``.

Limitations: an overlay shows no mounts below its lower directory (an input directory with mounts
inside shows their mount points empty). It remembers the names it looked up: a name the host
creates in an input directory during the run may stay absent inside once the program looked for
it (file contents stay live, as through a bind mount; a gate between host and program is a
file's content, not a name created later).

Security limitations: where the kernel refuses the overlay (a lower directory on a filesystem
overlayfs cannot stack on, a kernel older than 5.11 for an ordinary user, no overlayfs at all),
the source is bound plainly at the same place and its host path shows in mountinfo again. An
input file's mount shows its host file name (``/<name>``), not its directory. The mount
options still show the ordinary user's host uid on bubblewrap's own tmpfs mounts (``uid=``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandcell.backends.host import neutral_bytecode

__all__ = [
    "NeutralSources",
    "Overlay",
    "gather",
    "helper_args",
    "mount_all",
    "plan",
    "runtime_sources",
    "unmount_all",
]

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
MNT_DETACH = 2
FSTYPE = b"overlay"
SOURCE = b"sandcell"
OPTIONS = "userxattr"
"""The layers' overlay attributes (the bytecode tree's opaque ``__pycache__`` marks) are read
from ``user.overlay.*``: an ordinary user can write those, and the same tree serves root."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Overlay:
    """One read-only overlay mount on the host."""

    layers: tuple[str, ...]
    """Lower directories, uppermost first (two: a read-only overlay needs at least two)."""
    target: str
    """The mount point (an empty directory made for it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NeutralSources:
    """The overlays to mount and, for each planned host path, the path to bind it from."""

    overlays: tuple[Overlay, ...] = ()
    moved: tuple[tuple[str, str], ...] = ()

    def of(self, path: str | os.PathLike[str]) -> str:
        """Where to bind ``path`` from (``path`` itself when it was not planned)."""
        text = os.fspath(path)
        return dict(self.moved).get(text, text)

    @property
    def directories(self) -> tuple[str, ...]:
        """The directories to create (and remove) for :attr:`overlays`: the view, then each
        mount point's parent and the mount point."""
        out: list[str] = []
        for o in self.overlays:
            parent = os.path.dirname(o.target)
            out += [p for p in (os.path.dirname(parent), parent, o.target) if p not in out]
        return tuple(out)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def plan(
    paths: Sequence[tuple[str, str, bool]],
    view: str,
    *,
    layers: Mapping[str, str] | None = None,
) -> NeutralSources:
    """Overlays for ``paths`` ((path as the caller binds it, the same with symlinks resolved, is
    a directory)), mounted under ``view``. A path below another planned directory is bound from
    inside that one's overlay. ``layers``: host directory -> a directory to stack above it (its
    neutral bytecode tree)."""
    extra = dict(layers or {})
    wanted = sorted({r if is_dir else os.path.dirname(r) for _, r, is_dir in paths}, key=len)
    roots: list[tuple[str, str]] = []
    overlays: list[Overlay] = []
    for d in wanted:
        if any(_under(d, r) for r, _ in roots):
            continue
        target = f"{view}/{len(overlays)}/{os.path.basename(d.rstrip('/')) or 'root'}"
        top = extra.get(d)
        overlays.append(Overlay(layers=(top, d) if top else (d, target), target=target))
        roots.append((d, target))
    moved: list[tuple[str, str]] = []
    for key, real, _ in paths:
        for r, target in roots:
            if _under(real, r):
                moved.append((key, target + real[len(r.rstrip("/")) :] if real != r else target))
                break
    return NeutralSources(overlays=tuple(overlays), moved=tuple(moved))


def gather(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[str, str, bool]]:
    """(path, resolved path, is a directory) for each of ``paths`` that exists, as :func:`plan`
    wants them: the overlay must hold what a symlink names, since a symlink bound from inside
    it would lead back to the host path."""
    out: list[tuple[str, str, bool]] = []
    for p in paths:
        text = os.fspath(p)
        real = os.path.realpath(text)
        if os.path.exists(real):
            out.append((text, real, os.path.isdir(real)))
    return out


def runtime_sources(
    mounts: Sequence[tuple[str, str]], cache_root: Path, prebuilt: Sequence[str] = ()
) -> tuple[list[str], dict[str, str]]:
    """The runtime's host paths to plan (those not bound at their own path, nor below one that
    is: ``/usr`` names nothing), and the neutral bytecode layer of each such directory, kept
    in the user's cache (``cache_root``, the runs root's shared ``etc``, without one). The
    ``prebuilt`` directories were compiled for their sandbox paths (a built runtime): no layer."""
    own = [host for host, dest in mounts if host == dest]
    moved = [(h, d) for h, d in mounts if not any(_under(h, o) for o in own)]
    cache = neutral_bytecode.cache_dir(cache_root)
    layers: dict[str, str] = {}
    for host, dest in moved:
        if os.path.isdir(host) and os.path.realpath(host) not in prebuilt:
            tree = neutral_bytecode.tree_for(os.path.realpath(host), dest, cache)
            if tree is not None:
                layers[os.path.realpath(host)] = tree
    return [h for h, _ in moved], layers


def helper_args(sources: NeutralSources) -> list[str]:
    """The overlays as the workspace helper's ``--overlay TARGET LAYER LAYER`` arguments."""
    a: list[str] = []
    for o in sources.overlays:
        a += ["--overlay", o.target, *o.layers]
    return a


_libc = ctypes.CDLL(None, use_errno=True)


def _mount_overlay(o: Overlay) -> None:
    fds = [os.open(layer, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for layer in o.layers]
    try:
        lower = ":".join(f"/proc/self/fd/{fd}" for fd in fds)
        opts = f"lowerdir={lower},{OPTIONS}".encode()
        flags = MS_RDONLY | MS_NOSUID | MS_NODEV
        if _libc.mount(SOURCE, os.fsencode(o.target), FSTYPE, flags, opts) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"overlay on {o.target}: {os.strerror(err)}")
    finally:
        for fd in fds:
            os.close(fd)


def mount_all(sources: NeutralSources) -> list[str]:
    """Mount ``sources``' overlays (making their mount points); return the mount points made, to
    pass to :func:`unmount_all`. An overlay the kernel refuses becomes a plain bind of its host
    directory (read-only inside, as bubblewrap binds it; see the module's limitations); a bind
    that fails raises OSError."""
    for d in sources.directories:
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o755)
    done: list[str] = []
    try:
        for o in sources.overlays:
            try:
                _mount_overlay(o)
            except OSError:
                host = o.layers[-1] if o.layers[-1] != o.target else o.layers[0]
                flags = MS_BIND | MS_REC
                if _libc.mount(os.fsencode(host), os.fsencode(o.target), None, flags, None):
                    err = ctypes.get_errno()
                    raise OSError(err, f"bind {host} on {o.target}: {os.strerror(err)}") from None
            done.append(o.target)
    except BaseException:
        unmount_all(done)
        raise
    return done


def unmount_all(targets: Sequence[str]) -> None:
    """Detach the mounts :func:`mount_all` made (lazily: a reader still inside keeps its own)."""
    for t in reversed(targets):
        _libc.umount2(os.fsencode(t), MNT_DETACH)
