"""Which backend a run goes to: the backends of one executor, built on first use and kept.

The rung is the one the executor was asked for (a name, a backend object, else
``$SANDCELL_BACKEND``), or, when none was, the one each run's profile chooses; a profile refuses
a rung below its minimum. With warm starts there is one backend per rung and runtime (a template
or pool is made of one runtime). With a placement (a cluster, :mod:`sandcell.cluster`), the
backend of a rung and runtime is the placement's: its runs go to other nodes, and warm starts are
those nodes' own.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from sandcell.backends.base import Backend
from sandcell.backends.registry import BackendName, check_name, create_backend, requested_backend
from sandcell.errors import ConfigError
from sandcell.policy.approvals import Ticket
from sandcell.policy.profiles import Profile
from sandcell.runtimes import runtime_for
from sandcell.spec import DEFAULT_RUNTIME, RunRequest

if TYPE_CHECKING:
    from sandcell.backends.warm import WarmConfig


class Placement(Protocol):
    """Where the runs of an executor go when not to this host's backends (a Ray cluster)."""

    def backend(self, rung: BackendName, runtime: str) -> Backend:
        """The backend of runs on ``rung`` in ``runtime``."""
        ...


class Backends:
    """The backends of one executor; thread-safe."""

    def __init__(
        self,
        backend: Backend | str | None,
        warm: WarmConfig | None,
        *,
        placement: Placement | None = None,
    ) -> None:
        """``backend``: the rung asked for, by name or as a backend object (kept as is); None:
        ``$SANDCELL_BACKEND``, else each profile's. ``warm``: the warm starts of the backends
        built here (ConfigError with a backend object, which was built without them).
        ``placement``: build each rung's backend there instead of on this host."""
        if placement is not None and warm is not None:
            raise ConfigError(
                "warm starts of a cluster are its nodes': give them to the cluster, not the "
                "executor"
            )
        self._warm = warm
        self._placement = placement
        self._built: dict[str, Backend] = {}
        self._lock = threading.Lock()
        self.requested: BackendName | None
        """The rung asked for; None lets each run's profile choose."""
        if isinstance(backend, str) or backend is None:
            self.requested = requested_backend(backend)
        else:
            if warm is not None:
                raise ConfigError(
                    "warm starts are an option of a backend built by name: pass warm with "
                    "backend='namespaces' (or 'gvisor', 'microvm'), or a backend object alone"
                )
            self.requested = check_name(backend.name)
            self._built[backend.name] = backend

    def all(self) -> list[Backend]:
        """Every backend built so far."""
        return list(self._built.values())

    def for_profile(self, profile: Profile, *, runtime: str | None = None) -> Backend:
        """The backend of a run under ``profile`` in ``runtime`` (None: the profile's).
        Raises ConfigError for a rung below the profile's minimum, IsolationUnavailable for one
        this host cannot provide."""
        return self.named(
            profile.backend_for(self.requested), runtime or profile.runtime.runtime, profile
        )

    def for_request(self, profile: Profile, request: RunRequest) -> Backend:
        """The backend of ``request``, admitted under ``profile``, once its runtime is known
        to be built (ConfigError or IsolationUnavailable, with the command that builds it)."""
        runtime_for(request.language, request.runtime)
        return self.for_profile(profile, runtime=request.runtime)

    def for_ticket(self, profile: Profile, ticket: Ticket) -> Backend:
        """The backend of an approved run: the rung it was submitted for (the one asked for
        must be that one, or none)."""
        submitted = ticket.profile.get("backend")
        if not isinstance(submitted, str):  # submitted before rungs were kept with a ticket
            return self.for_profile(profile, runtime=ticket.request.runtime)
        if self.requested is not None and self.requested != submitted:
            raise ConfigError(
                f"approval {ticket.id} is for a run on backend {submitted!r}, not "
                f"{self.requested!r}; approve it with --backend {submitted} (or none)"
            )
        runtime = ticket.request.runtime or profile.runtime.runtime
        return self.named(profile.backend_for(submitted), runtime, profile)

    def named(
        self, name: str, runtime: str = DEFAULT_RUNTIME, profile: Profile | None = None
    ) -> Backend:
        """The backend of rung ``name``; with warm starts, of ``runtime`` too (its template
        or pool preloads what the ``profile`` that first needed it says)."""
        plain = self._warm is None and self._placement is None
        key = name if plain or runtime == DEFAULT_RUNTIME else f"{name}:{runtime}"
        with self._lock:
            found = self._built.get(key)
            if found is None and self._placement is not None:
                found = self._placement.backend(check_name(name), runtime)
                self._built[key] = found
            elif found is None:
                warm = self._warm
                if warm is not None:
                    preload = profile.runtime.preload if profile is not None else None
                    warm = replace(
                        warm,
                        runtime=None if runtime == DEFAULT_RUNTIME else runtime,
                        preload=warm.preload if preload is None else preload,
                    )
                found = create_backend(name, warm=warm)
                self._built[key] = found
            return found
