"""The service's profiles by name, kept between runs and loaded again when their file changes."""

from __future__ import annotations

import threading
from pathlib import Path

from sandcell.policy.profiles import Profile, default_profile_dir, load_profile

__all__ = ["ProfileCache"]


class ProfileCache:
    """Profiles by name, loaded once: parsing one costs milliseconds on every run's path. A
    user profile is loaded again when its file changes (size or mtime), or when a file named
    like a built-in appears, so the service never runs an edited profile under its old
    content (the record names the content's hash either way)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found: dict[str, tuple[Profile, tuple[int, int] | None]] = {}

    @staticmethod
    def _signature(profile: Profile) -> tuple[int, int] | None:
        source = profile.source
        path = (
            default_profile_dir() / f"{profile.name}.toml"
            if source.startswith("builtin:")
            else Path(source)
        )
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns)

    def load(self, name: str) -> Profile:
        with self._lock:
            found = self._found.get(name)
        if found is not None and self._signature(found[0]) == found[1]:
            return found[0]
        profile = load_profile(name)
        with self._lock:
            self._found[name] = (profile, self._signature(profile))
        return profile
