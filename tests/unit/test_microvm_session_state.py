"""The microVM session state's host-side file handling, without a VM: a files-mode save keeps
regular files and directories only and follows no link; a restore's frames recreate exactly those
under the workspace and refuse more than the workspace holds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sandcell.backends.microvm import channel
from sandcell.backends.microvm.session_state import copy_workspace, limits_doc, workspace_frames
from sandcell.errors import ConfigError
from sandcell.spec import Limits


def _tree(root: Path, outside: Path) -> None:
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "e" / "f.txt").write_text("deep")
    (root / "top.bin").write_bytes(b"x" * 3000)
    (outside / "secret").write_text("host secret")
    os.symlink(outside / "secret", root / "link")
    os.symlink(outside, root / "dirlink")
    os.mkfifo(root / "fifo")
    (root / "standin").write_text("")


def test_copy_keeps_files_and_dirs_only(tmp_path: Path) -> None:
    src, outside = tmp_path / "src", tmp_path / "outside"
    src.mkdir()
    outside.mkdir()
    _tree(src, outside)
    dest = tmp_path / "dest"
    copied = copy_workspace(src, dest, skip={"standin"})
    assert copied == 4 + 3000
    found = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    assert found == ["d", "d/e", "d/e/f.txt", "top.bin"]


def test_frames_recreate_the_tree_under_the_workspace(tmp_path: Path) -> None:
    src, outside = tmp_path / "src", tmp_path / "outside"
    src.mkdir()
    outside.mkdir()
    _tree(src, outside)
    reader = channel.FrameReader(allowed=frozenset({channel.INPUT, channel.DATA}))
    frames = reader.feed(b"".join(workspace_frames(src, max_bytes=1 << 20, max_entries=100)))
    heads = [json.loads(p) for k, p in frames if k == channel.INPUT]
    assert {h["area"] for h in heads} == {"workspace"}
    assert [(h["path"], h["type"]) for h in heads] == [
        ("d", "dir"),
        ("standin", "file"),
        ("top.bin", "file"),
        ("d/e", "dir"),
        ("d/e/f.txt", "file"),
    ]
    assert sum(len(p) for k, p in frames if k == channel.DATA) == 3004
    with pytest.raises(ConfigError):
        list(workspace_frames(src, max_bytes=100, max_entries=100))


def test_limits_doc_ignores_the_wall_time() -> None:
    assert limits_doc(Limits(wall_time_s=5)) == limits_doc(Limits(wall_time_s=50))
    assert limits_doc(Limits(memory_bytes=1 << 28)) != limits_doc(Limits())
