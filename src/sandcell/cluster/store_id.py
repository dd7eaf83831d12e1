"""Whether two processes write to the same artifact store: a token file in the store's root.

Comparing paths says nothing across machines (a shared directory may be mounted at different
places, and one path may be a different local directory on each node); a random token written
once into the root, read back by both, says they are one directory.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from sandcell.errors import InfraError

IDENTITY_FILE = ".sandcell-store-id"


def store_identity(root: Path) -> str:
    """The identity of the store at ``root``, made on first use (the first writer wins)."""
    path = root / IDENTITY_FILE
    with contextlib.suppress(FileNotFoundError):
        return _read(path)
    token = uuid.uuid4().hex
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f"{IDENTITY_FILE}.{token}"
        tmp.write_text(token)
        try:
            # link() fails when another process made the token first: then theirs holds.
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return _read(path)
    except OSError as exc:
        raise InfraError(
            f"cannot write the identity of the artifact store {str(root)!r}: {exc.strerror}"
        ) from None


def _read(path: Path) -> str:
    token = path.read_text().strip()
    if len(token) != 32:
        raise InfraError(f"the artifact store's identity file {str(path)!r} is damaged")
    return token


__all__ = ["IDENTITY_FILE", "store_identity"]
