"""What a change set may write into a tree, judged against the whole tree it lands in.

The same rules run twice: when the host computes the change set (they become the changes'
flags and notes, which the reviewer sees) and again when it is applied, against the target's
state at that moment (nothing recorded earlier is taken on trust). They are:

* **No repository inside.** A path with a ``.git`` component anywhere (any case) is never
  written: a planted ``sub/.git/config`` (``core.fsmonitor``, hooks) runs code on the next
  ``git status`` in that folder.
* **No special modes.** Set-user-ID, set-group-ID and sticky bits and write permission for
  others are stripped from what the program made (the change set says so), and a change set
  that still asks for them is refused at apply time.
* **Credentials stay.** A file the sandbox was not given (:mod:`sandcell.changes.credentials`)
  is never written by a change set.
* **No link leading out.** A link is resolved as the kernel would, one component at a time,
  through the other links of the tree as it will be after the change (``sub/up -> ..`` makes
  ``x -> sub/up/../file`` leave the directory, though neither looks like it alone). A link that
  leaves the directory, climbs past its top, or loops is refused if the change set made it or
  made it leave; links that already led out before the change are the target's own business.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sandcell.changes.manifest import Entry

STRIPPED_BITS = 0o7002
"""Set-user-ID, set-group-ID, sticky, and write for others: never applied."""
LEFT_OUT_FLAG = (
    "a file the sandbox was not given (credentials kept on the host): a change set never writes it"
)
MAX_LINK_HOPS = 40
"""As the kernel's limit on links followed in one lookup (``ELOOP``)."""


def git_prefix(rel: str) -> str | None:
    """The part of ``rel`` up to and including its first ``.git`` component (compared without
    case, as case-insensitive file systems would), or None when it has none."""
    parts = rel.split("/")
    for i, part in enumerate(parts):
        if part.lower() == ".git":
            return "/".join(parts[: i + 1])
    return None


def strip_mode(mode: int) -> tuple[int, str | None]:
    """``mode`` without :data:`STRIPPED_BITS`, and a note saying what was dropped (None when
    nothing was)."""
    kept = mode & ~STRIPPED_BITS & 0o7777
    dropped = mode & STRIPPED_BITS
    if not dropped:
        return kept, None
    names = [
        name
        for bit, name in (
            (0o4000, "set-user-ID"),
            (0o2000, "set-group-ID"),
            (0o1000, "sticky"),
            (0o0002, "write for others"),
        )
        if dropped & bit
    ]
    return kept, (
        f"mode {mode:04o} made {kept:04o}: {', '.join(names)} never applied "
        f"(sandcell strips {STRIPPED_BITS:04o})"
    )


def leaves(tree: Mapping[str, Entry], path: str) -> str | None:
    """Why the link at ``path`` in ``tree`` leads out of the tree's directory, or None when it
    stays inside. A component the tree does not hold is taken as a directory, so ``..`` after
    it stays inside, as it would once it exists."""
    entry = tree.get(path)
    if entry is None or entry.kind != "symlink" or entry.target is None:
        return None
    where = path.split("/")[:-1]
    pending = [entry.target]
    hops = 1
    while pending:
        text = pending.pop()
        if text.startswith("/"):
            return f"an absolute link ({entry.target!r} reaches {text!r})"
        parts = [p for p in text.split("/") if p not in ("", ".")]
        for i, part in enumerate(parts):
            if part == "..":
                if not where:
                    return f"climbs past the top of the directory ({entry.target!r})"
                where.pop()
                continue
            found = tree.get("/".join([*where, part]))
            if found is not None and found.kind == "symlink" and found.target is not None:
                hops += 1
                if hops > MAX_LINK_HOPS:
                    return f"more than {MAX_LINK_HOPS} links in a row ({entry.target!r})"
                rest = "/".join(parts[i + 1 :])
                if rest:
                    pending.append(rest)
                pending.append(found.target)
                break
            where.append(part)
    return None


def escaping_links(
    before: Mapping[str, Entry], after: Mapping[str, Entry], changed: Iterable[str]
) -> dict[str, str]:
    """The links of ``after`` that lead out of the directory and that the change made or made
    lead out (``changed``: the paths the change writes), each with why."""
    written = set(changed)
    out: dict[str, str] = {}
    for path, entry in after.items():
        if entry.kind != "symlink":
            continue
        why = leaves(after, path)
        if why is not None and (path in written or leaves(before, path) is None):
            out[path] = why
    return out


def refusals(
    before: Mapping[str, Entry],
    after: Mapping[str, Entry],
    written: Mapping[str, Entry],
    left_out: Iterable[str] = (),
) -> list[str]:
    """Every reason the change writing ``written`` (path -> new entry) into a tree in state
    ``before``, reaching ``after``, must not be applied; empty when it may. ``left_out``: the
    paths the sandbox was not given (never written)."""
    out: list[str] = []
    protected = frozenset(left_out)
    for path, entry in sorted(written.items()):
        if path in protected:
            out.append(f"{path}: {LEFT_OUT_FLAG}")
        prefix = git_prefix(path)
        if prefix is not None:
            out.append(f"{path}: under {prefix!r}, a repository's own files are never applied")
        if entry.kind != "symlink" and entry.mode & STRIPPED_BITS:
            out.append(f"{path}: mode {entry.mode:04o} (special bits are never applied)")
    for path, why in sorted(escaping_links(before, after, written).items()):
        out.append(f"{path}: symbolic link leading out of the directory: {why}")
    return out
