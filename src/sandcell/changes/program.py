"""The program a ``--workdir-from`` run really runs: unpack, run the caller's code, record.

It is built around the caller's code after the policy checks judged that code (the checks see
what the caller wrote, not this frame). Inside the sandbox it unpacks the snapshot archive (a
read-only input) into the workspace, notes the state it unpacked, runs the caller's program as a
child in the run's language, and after the child ended writes every entry that differs from the
unpacked state into one archive in the workspace (plus the list of what was deleted), which
leaves the sandbox as an ordinary export and goes through the export checks like any file. The
run's exit status is the child's. A run that ends by its limits (timeout, memory) never writes
the archive, and the run then has no change set: changes come only from a program that finished.

Why copy, not an overlay: the copy works the same on every rung (the microVM guest has no
host directory to overlay), needs no mount privilege, and the host directory is never reachable
from the sandbox at all. What is in the archive is compared on the host against the host's own
manifest, so this frame is trusted with nothing.
"""

from __future__ import annotations

from dataclasses import replace

from sandcell.runtimes import runtime_for
from sandcell.spec import InputFile, RunRequest

ARCHIVE_INPUT = "sandcell-workdir.tar"
CHANGES_FILE = ".sandcell-changes.tar"

_FRAME = r"""
import hashlib, json, os, stat, subprocess, sys, tarfile
SRC = "/inputs/" + ARCHIVE
SKIP = {".git", OUT}
# Caches test tools leave behind: new ones are not part of a change set.
CACHES = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"}

def _skip_top(name, path):
    if name in SKIP:
        return True
    # The backends' convenience links to the inputs are not part of the tree.
    return os.path.islink(path) and os.readlink(path).startswith("/inputs/")

def _state(root=".", before=None):
    out = {}
    def rec(d, rel):
        for e in sorted(os.scandir(d), key=lambda e: e.name):
            r = rel + e.name
            if not rel and _skip_top(e.name, e.path):
                continue
            if before is not None and e.name in CACHES and r not in before:
                continue
            st = e.stat(follow_symlinks=False)
            m = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[r] = ("symlink", 0, os.readlink(e.path))
            elif stat.S_ISDIR(st.st_mode):
                out[r] = ("dir", m, None)
                rec(e.path, r + "/")
            elif stat.S_ISREG(st.st_mode):
                h = hashlib.sha256()
                with open(e.path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
                out[r] = ("file", m, h.hexdigest())
            else:
                out[r] = ("other", m, None)
    rec(root, "")
    return out

def _unpack():
    if os.path.islink(ARCHIVE):
        os.unlink(ARCHIVE)
    with tarfile.open(SRC) as tar:
        if hasattr(tarfile, "fully_trusted_filter"):
            tar.extractall(".", filter="fully_trusted")
        else:
            tar.extractall(".")

def _plain(info):
    # Times and owners are not part of the state: without them the same change is the same
    # archive, so a replay's change set compares equal by hash.
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info

def _record(before):
    after = _state(before=before)
    changed = [p for p, v in after.items() if before.get(p) != v]
    deleted = [p for p in before if p not in after]
    other = [p for p in changed if after[p][0] == "other"]
    meta = {"version": 1, "deleted": deleted, "other": other}
    with tarfile.open(OUT + ".part", "w", format=tarfile.PAX_FORMAT) as tar:
        data = json.dumps(meta).encode()
        info = tarfile.TarInfo("meta.json")
        info.size = len(data)
        import io
        tar.addfile(info, io.BytesIO(data))
        for p in changed:
            if after[p][0] != "other":
                tar.add(p, arcname="files/" + p, recursive=False, filter=_plain)
    os.rename(OUT + ".part", OUT)

def _main():
    _unpack()
    before = _state()
    prog = "/tmp/.sandcell-program"
    with open(prog, "w") as f:
        f.write(CODE)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    rc = subprocess.call([INTERPRETER, prog], env=env)
    if rc < 0:
        rc = 128 - rc
    try:
        _record(before)
    except OSError as exc:
        print(f"sandcell: the changes could not be recorded: {exc}", file=sys.stderr)
    sys.stdout.flush()
    os._exit(rc)

_main()
"""


def frame(code: str, language: str) -> str:
    """The Python program that unpacks, runs ``code`` in ``language`` and records changes."""
    runtime = runtime_for("python" if language == "python" else "bash")
    interpreter = runtime.sandbox_interpreter or runtime.interpreter
    head = (
        f"ARCHIVE = {ARCHIVE_INPUT!r}\nOUT = {CHANGES_FILE!r}\n"
        f"INTERPRETER = {interpreter!r}\nCODE = {code!r}\n"
    )
    return head + _FRAME


def wrap(request: RunRequest, archive: InputFile) -> RunRequest:
    """The request the sandbox runs: the frame in the request's language, the archive as one
    more input, the changes archive as one more export."""
    body = frame(request.code, request.language)
    if request.language == "python":
        code = body
    else:
        python = runtime_for("bash").sandbox_python
        delim = "SANDCELL_WORKDIR_FRAME"
        code = (
            f"cat > /tmp/.sandcell-frame.py <<'{delim}'\n{body}\n{delim}\n"
            f"exec {python} -I /tmp/.sandcell-frame.py\n"
        )
    return replace(
        request,
        code=code,
        inputs=(*request.inputs, archive),
        exports=(*request.exports, CHANGES_FILE),
    )
