"""What of a working directory stays on the host: credentials are never copied into a sandbox.

A repository often holds a way into somewhere else: a token in a remote's URL
(``https://x-access-token:TOKEN@host/...``), a ``[credential]`` helper, an ``http.extraheader``
with a bearer token (what CI checkouts leave in ``.git/config``), a ``.netrc`` or a ``.env``
file. The sandbox gets none of them: files whose names the profile's ``[workdir] leave_out``
lists are not copied at all, and every git ``config`` file (of the repository and of any
repository inside it) is copied without its credentials. What was left out is said in the run's
record and on the CLI, so a failing test that needed one of them is explained.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from sandcell.changes.safety import git_prefix

# userinfo in a URL: "scheme://user[:password]@". Over http(s) any user name may be a token
# (``https://TOKEN@github.com``); elsewhere only one with a password is taken out, so that
# ``ssh://git@host`` keeps its (non-secret) user.
_HTTP_USERINFO = re.compile(r"(?i)\b(https?://)[^/@\s\"'\]]+@")
_OTHER_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s\"':\]]*:[^/@\s\"'\]]*@")
_SECTION = re.compile(r"^\s*\[\s*([A-Za-z0-9.-]+)")
_KEY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*(=|$)")


@dataclass(frozen=True, slots=True)
class LeftOut:
    """One path of the directory the sandbox did not get as it is on the host."""

    path: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "why": self.why}


def is_left_out(name: str, patterns: Sequence[str]) -> bool:
    """Whether a file called ``name`` (any depth) is one the profile keeps on the host."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def is_git_config(rel: str) -> bool:
    """Whether ``rel`` is a git ``config`` file: of the repository or of one inside it
    (``sub/.git/config``, ``.git/modules/NAME/config``, ``.git/worktrees/NAME/config``)."""
    return rel.rsplit("/", 1)[-1] == "config" and git_prefix(rel) is not None


def scrub_git_config(data: bytes) -> tuple[bytes, list[str]]:
    """``data`` (a git config file) without its credentials, and what was taken out: the
    userinfo of URLs (also in ``[url "..."]`` headers), ``[credential]`` sections and
    ``extraheader`` keys. Everything else is kept byte for byte."""
    text = data.decode("utf-8", errors="surrogateescape")
    out: list[str] = []
    removed: list[str] = []
    in_credential = False
    for line in text.splitlines(keepends=True):
        section = _SECTION.match(line)
        if section is not None:
            # [credential], [credential "URL"] and the old [credential.URL] spelling.
            in_credential = section.group(1).split(".")[0].lower() == "credential"
            if in_credential:
                removed.append("a [credential] section")
                continue
        elif in_credential:
            continue
        else:
            key = _KEY.match(line)
            if key is not None and key.group(1).lower() == "extraheader":
                removed.append("an extraheader")
                continue
        cleaned, n_http = _HTTP_USERINFO.subn(r"\1", line)
        cleaned, n_other = _OTHER_USERINFO.subn(r"\1", cleaned)
        removed += ["the user and password of a URL"] * (n_http + n_other)
        out.append(cleaned)
    if not removed:
        return data, []
    return "".join(out).encode("utf-8", errors="surrogateescape"), removed


def describe(removed: Sequence[str]) -> str:
    """``removed`` (from :func:`scrub_git_config`) as one phrase: ``2 x the user and ...``."""
    counts: dict[str, int] = {}
    for what in removed:
        counts[what] = counts.get(what, 0) + 1
    return "copied without " + ", ".join(
        what if n == 1 else f"{n} x {what}" for what, n in counts.items()
    )
