"""Export globs: their checks before any run (:func:`validate_globs`) and their matching
against workspace paths during the export walk (:class:`_Matcher`).

The threat: a glob names what leaves the sandbox, and it comes from a caller (often a model) or a
profile. One that is absolute or climbs out with ``..`` asks for files outside the working
directory; control characters and backslashes make it read differently from what it matches; and
every glob is matched against every name in the workspace, so their number and length are
bounded. Matching goes one path component at a time: a ``*`` never crosses a ``/``, and the walk
prunes a directory as soon as no glob can match below it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from sandcell.artifacts.export_names import _is_control
from sandcell.errors import ConfigError

_MAX_GLOBS = 256
_MAX_GLOB_CHARS = 4096
"""Bounds on the globs themselves: they are matched against every name in the workspace."""


def validate_globs(globs: Sequence[str]) -> tuple[str, ...]:
    """Check export globs before any run and return them normalised.

    A glob is a ``/``-separated path relative to the working directory. Within a component,
    ``*`` matches any run of characters (a leading dot included), ``?`` one character and
    ``[...]`` a set; a component that is exactly ``**`` matches any number of directories,
    none included. ``./`` components are dropped; duplicates are removed, order kept.

    Raises:
        ConfigError: for a glob that is empty, absolute, contains a ``..`` component, an empty
            component (``a//b``, a trailing ``/``), a NUL or control character, or a backslash.
    """
    if isinstance(globs, str):
        # A bare string is a sequence of one-character globs: surely a mistake.
        raise ConfigError(f"export globs must be a list of strings, got the string {globs!r}")
    if len(globs) > _MAX_GLOBS:
        raise ConfigError(f"{len(globs)} export globs given; at most {_MAX_GLOBS} are allowed")
    out: list[str] = []
    for glob in globs:
        if not isinstance(glob, str):
            raise ConfigError(f"export glob {glob!r} is not a string")
        if not glob:
            raise ConfigError("an export glob is empty; use a pattern such as 'out/*.png'")
        if len(glob) > _MAX_GLOB_CHARS:
            raise ConfigError(
                f"export glob of {len(glob)} characters is too long (at most {_MAX_GLOB_CHARS})"
            )
        if "\x00" in glob or any(_is_control(ch) for ch in glob):
            raise ConfigError(
                f"export glob {glob!r} contains a NUL or control character; remove it"
            )
        if "\\" in glob:
            raise ConfigError(
                f"export glob {glob!r} contains a backslash; separate directories with '/' "
                "(escaping wildcards is not supported, use '[*]' to match a literal '*')"
            )
        if glob.startswith("/"):
            raise ConfigError(
                f"export glob {glob!r} is absolute; globs are relative to the working "
                f"directory, e.g. {glob.lstrip('/') or 'out/*.png'!r}"
            )
        parts = glob.split("/")
        if ".." in parts:
            raise ConfigError(
                f"export glob {glob!r} has a '..' component; only files inside the working "
                "directory can be exported"
            )
        if parts[-1] == "":
            raise ConfigError(
                f"export glob {glob!r} ends with '/'; directories are not exported, use "
                f"{glob + '**'!r} to export every file under it"
            )
        if "" in parts:
            raise ConfigError(f"export glob {glob!r} has an empty component ('//'); remove it")
        kept = [p for p in parts if p != "."]
        if not kept:
            raise ConfigError(
                f"export glob {glob!r} names the working directory itself; use '**' to "
                "export every file in it"
            )
        normalised = "/".join(kept)
        if normalised not in out:
            out.append(normalised)
    return tuple(out)


_State = tuple[int, int]
"""(glob index, number of components of that glob matched so far)."""


class _Matcher:
    """Matches relative paths, one component at a time, against several globs at once.

    A small NFA: the state after a path prefix is the set of (glob, position) pairs still
    alive. This lets the walk prune a directory as soon as no glob can match below it, and a
    ``**`` never makes ``*`` cross a ``/`` (which ``fnmatch`` on whole paths would).
    """

    def __init__(self, globs: Sequence[str]) -> None:
        self._globs: tuple[tuple[re.Pattern[str] | None, ...], ...] = tuple(
            tuple(
                None if part == "**" else re.compile(fnmatch.translate(part))
                for part in glob.split("/")
            )
            for glob in globs
        )

    def _closure(self, states: set[_State]) -> frozenset[_State]:
        # A '**' may match zero directories: a state before one is also a state after it.
        closed: set[_State] = set()
        for g, start in states:
            segs = self._globs[g]
            i = start
            closed.add((g, i))
            while i < len(segs) and segs[i] is None:
                i += 1
                closed.add((g, i))
        return frozenset(closed)

    def start(self) -> frozenset[_State]:
        """The states before any component."""
        return self._closure({(g, 0) for g in range(len(self._globs))})

    def step(self, states: frozenset[_State], name: str) -> tuple[frozenset[_State], bool]:
        """States after one more component ``name``, and whether a non-``**`` component matched.

        The second value tells an entry some glob names specifically (``out`` in ``out/*.png``)
        from one only a ``**`` passes over.
        """
        nxt: set[_State] = set()
        progress = False
        for g, i in states:
            segs = self._globs[g]
            if i >= len(segs):
                continue
            pattern = segs[i]
            if pattern is None:
                nxt.add((g, i))
            elif pattern.match(name):
                nxt.add((g, i + 1))
                progress = True
        return self._closure(nxt), progress

    def full(self, states: frozenset[_State]) -> bool:
        """Whether the path so far is matched by some glob."""
        return any(i == len(self._globs[g]) for g, i in states)

    def names_directory(self, states: frozenset[_State]) -> bool:
        """Whether some glob matches this path other than through a trailing ``**``.

        ``out/**`` matches the directory ``out`` itself (``**`` matches zero directories), but
        it asks for the files under it; a directory is only worth a rejection when a glob
        really names it (``out``, ``*.d``).
        """
        return any(i == len(self._globs[g]) and self._globs[g][-1] is not None for g, i in states)

    def can_descend(self, states: frozenset[_State]) -> bool:
        """Whether some glob could match a path below this one."""
        return any(i < len(self._globs[g]) for g, i in states)
