"""What an E2B sandbox keeps with its session's saved states, so that a paused sandbox comes
back as itself (same id, token, template, metadata) even after the service restarts.

The session's :attr:`~sandcell.sessions.Session.labels` carry it: strings under ``e2b.``,
written into every state saved of the session and signed with its manifest
(:mod:`sandcell.sessions.states`). A state without them was not saved by an E2B sandbox (a
session of sandcell's own API): the E2B API neither lists nor resumes it as a sandbox.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sandcell.backends.cell.state import PauseMode

__all__ = ["AutoPause", "ContextLabel", "SandboxLabels"]

AutoPause = Literal["off", "best", "memory", "files"]
"""What the sandbox's timeout does: ``off`` ends it; otherwise it pauses, keeping memory where
the rung can (``best``), or the mode the client chose."""

ContextLabel = tuple[str, str, str, str]
"""A code context: (id, language, cwd as E2B names it, the same directory in the sandbox)."""

_PREFIX = "e2b."
_KEYS = (
    "template",
    "metadata",
    "env",
    "token",
    "key_sha256",
    "started_at",
    "workspace",
    "auto_pause",
    "contexts",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxLabels:
    """One E2B sandbox as its saved states remember it."""

    template: str
    metadata: Mapping[str, str]
    env: Mapping[str, str]
    token: str
    """The sandbox's access token: a resumed sandbox keeps it (an SDK object that paused it
    goes on sending it), unless its tenant's key changed since."""
    key_sha256: str
    """The hash of the tenant key the token came with."""
    started_at: dt.datetime
    workspace: str
    """The workspace's path inside the sandbox."""
    auto_pause: AutoPause
    contexts: tuple[ContextLabel, ...]
    """Its code contexts: scopes of the kernel, so they come back only with its memory."""

    def auto_pause_mode(self, offered: frozenset[PauseMode]) -> PauseMode:
        """The mode its timeout pauses in, on a rung offering ``offered``."""
        if self.auto_pause == "memory" or (
            self.auto_pause == "best" and PauseMode.MEMORY in offered
        ):
            return PauseMode.MEMORY
        return PauseMode.FILES

    def to_labels(self) -> dict[str, str]:
        values = {
            "template": self.template,
            "metadata": json.dumps(dict(self.metadata), sort_keys=True),
            "env": json.dumps(dict(self.env), sort_keys=True),
            "token": self.token,
            "key_sha256": self.key_sha256,
            "started_at": self.started_at.isoformat(),
            "workspace": self.workspace,
            "auto_pause": self.auto_pause,
            "contexts": json.dumps([list(c) for c in self.contexts]),
        }
        return {_PREFIX + k: v for k, v in values.items()}

    @classmethod
    def of(cls, labels: Mapping[str, str]) -> SandboxLabels | None:
        """The sandbox ``labels`` describe, or None when they are not an E2B sandbox's (or
        are damaged: such a state is left to sandcell's own API, never half-read here)."""
        if not all(_PREFIX + k in labels for k in _KEYS):
            return None
        get = {k: labels[_PREFIX + k] for k in _KEYS}
        try:
            metadata = json.loads(get["metadata"])
            env = json.loads(get["env"])
            contexts = json.loads(get["contexts"])
            started = dt.datetime.fromisoformat(get["started_at"])
            auto: AutoPause
            auto = get["auto_pause"]  # type: ignore[assignment]
            if auto not in ("off", "best", "memory", "files"):
                return None
            return cls(
                template=get["template"],
                metadata={str(k): str(v) for k, v in metadata.items()},
                env={str(k): str(v) for k, v in env.items()},
                token=get["token"],
                key_sha256=get["key_sha256"],
                started_at=started,
                workspace=get["workspace"],
                auto_pause=auto,
                contexts=tuple(
                    (str(i), str(lang), str(cwd), str(path)) for i, lang, cwd, path in contexts
                ),
            )
        except (ValueError, TypeError, AttributeError):
            return None
