"""The guest agent's session file paths, on this host's real filesystem: a directory reached
through a link is never opened, and files are sent from nowhere but the workspace and a cell's
display directory (whatever the host, or a cell forging its reply, names)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from sandcell.backends.microvm.guest.files import send_session_files
from sandcell.backends.microvm.guest.port import Port
from sandcell.backends.microvm.guest.system import open_dir_nofollow


def test_a_link_anywhere_on_the_path_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "real" / "cell").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "last").symlink_to(tmp_path / "real" / "cell")
    fd = open_dir_nofollow(str(tmp_path / "real" / "cell"))
    os.close(fd)
    for path in (tmp_path / "link" / "cell", tmp_path / "real" / "last"):
        with pytest.raises(OSError) as info:
            open_dir_nofollow(str(path))
        assert info.value.errno in (errno.ELOOP, errno.ENOTDIR)


@pytest.mark.parametrize(
    "root",
    ["/etc", "/tmp/.sandcell-outputs/../../etc", "/tmp/.sandcell-outputs/1/..", "/", 7],
)
def test_files_are_sent_only_from_the_workspace_or_a_display_directory(
    tmp_path: Path, root: object
) -> None:
    assert _sent(tmp_path, root) == b"", "the agent sent files from elsewhere"


def test_a_display_directory_is_sent(tmp_path: Path) -> None:
    # The control: the same request for a real display directory does send its file.
    cell = Path(f"/tmp/.sandcell-outputs/{os.getpid()}")
    made_root = not cell.parent.exists()
    cell.mkdir(parents=True)
    try:
        (cell / "manifest.json").write_text("{}")
        assert b"manifest.json" in _sent(tmp_path, str(cell))
    finally:
        (cell / "manifest.json").unlink()
        cell.rmdir()
        if made_root:
            cell.parent.rmdir()


def _sent(tmp_path: Path, root: object) -> bytes:
    """What the agent writes to its port when asked for the files under ``root``."""
    fifo = tmp_path / "port"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        port = Port(str(fifo))
        request = {"root": root, "globs": ["**"], "budget": 1 << 20}
        send_session_files(port, json.dumps(request).encode())
        os.close(port.fd)
        return os.read(reader, 1 << 16)
    finally:
        os.close(reader)
