"""The copy of artifacts out of the store into a directory the caller chooses
(:meth:`sandcell.artifacts.ArtifactStore.copy_out`).

The threat: an artifact path is a string from a run's result. One that is absolute or has ``..``
would write outside the destination, and a symbolic or hard link there would redirect the write.
So the path is checked, nothing below the destination is followed, and an existing file is
replaced by rename, never written into.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from sandcell.artifacts.export_names import _is_control, _type_reason
from sandcell.artifacts.fd_io import CHUNK, OPEN_DIR_FLAGS, write_all
from sandcell.errors import ConfigError
from sandcell.spec import Artifact

__all__ = ["copy_out"]


def copy_out(
    artifacts: Sequence[Artifact],
    dest: Path,
    *,
    path_for: Callable[[str], Path],
    store_root: Path,
) -> list[Path]:
    """Copy ``artifacts`` to ``dest/<artifact.path>``, reading each from ``path_for(sha256)``
    (the store at ``store_root``); the contract is :meth:`ArtifactStore.copy_out`'s."""
    dest = Path(dest)
    plans = [(art, _split_artifact_path(art.path)) for art in artifacts]
    try:
        dest.mkdir(parents=True, exist_ok=True)
        root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(
            f"cannot copy artifacts to {str(dest)!r}: {exc.strerror}; pass a writable directory"
        ) from exc
    written: list[Path] = []
    try:
        for art, parts in plans:
            source = path_for(art.sha256)
            try:
                src_fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError as exc:
                raise ConfigError(
                    f"artifact {art.path!r} ({art.sha256}) is not in the store at "
                    f"{str(store_root)!r}"
                ) from exc
            try:
                _copy_into(src_fd, root_fd, parts, art.path, dest)
            finally:
                os.close(src_fd)
            written.append(dest.joinpath(*parts))
    finally:
        os.close(root_fd)
    return written


def _split_artifact_path(path: str) -> list[str]:
    """The components of an artifact path, refusing anything that could leave the destination."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"artifact path {path!r} is empty or not a string")
    if path.startswith("/"):
        raise ConfigError(f"artifact path {path!r} is absolute; refusing to copy it")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise ConfigError(
                f"artifact path {path!r} has an empty, '.' or '..' component; refusing to copy it"
            )
        if "\x00" in part or any(_is_control(ch) for ch in part):
            raise ConfigError(f"artifact path {path!r} has a control character; refusing it")
    return parts


def _copy_into(src_fd: int, root_fd: int, parts: list[str], shown: str, dest: Path) -> None:
    """Write the content of ``src_fd`` to ``parts`` below the directory ``root_fd``."""
    dir_fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts[:-1]):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=dir_fd)
            try:
                child = os.open(part, OPEN_DIR_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                where = "/".join(parts[: i + 1])
                raise ConfigError(
                    f"cannot copy artifact {shown!r}: {str(dest / where)!r} is a symbolic link "
                    f"or not a directory ({exc.strerror}); refusing to write through it"
                ) from exc
            os.close(dir_fd)
            dir_fd = child
        name = parts[-1]
        try:
            existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISREG(existing.st_mode):
                raise ConfigError(
                    f"cannot copy artifact {shown!r}: {str(dest / shown)!r} exists and is not a "
                    f"regular file ({_type_reason(existing.st_mode).split(':')[0]}); remove it"
                )
        # Write a new file and rename it over the name: never write into an existing inode.
        tmp = f".sandcell-{secrets.token_hex(8)}.tmp"
        out_fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=dir_fd,
        )
        try:
            try:
                os.fchmod(out_fd, 0o644)  # the umask may have taken bits away
                while chunk := os.read(src_fd, CHUNK):
                    write_all(out_fd, chunk)
            finally:
                os.close(out_fd)
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)
