"""What the namespaces backend makes of a run's ways out (:mod:`sandcell.run_sockets`), as data.

A run whose profile reaches outside comes with a :class:`~sandcell.run_sockets.SandboxSockets`.
Every start mode (cold, template, pool, session) turns it into the same few things, built here:

* the socket directory read-only at :data:`~sandcell.run_sockets.SANDBOX_DIR`: bound by bwrap
  on a cold start; on a warm one, moved in as a detached mount tree at ``/sandcell/run/sandcell``
  (the run's own tmpfs), which the template's ``/run`` symlink leads to (a template cannot
  grow a ``/run`` per run, and a run without sockets must find none). Never through the read-only
  overlays that serve the other host sources (``neutral_sources``): a Unix socket reached
  through an overlay refuses connections;
* the program's environment (:func:`program_env`) and its ``sys.path``
  (:data:`~sandcell.run_sockets.SANDBOX_LIB` after the runtime's own paths);
* Landlock: the socket directory readable, and TCP connect to the bridge's port allowed where
  TCP is otherwise denied (:func:`landlock_extras`), whether or not the run has egress, so that
  a run without it finds the port closed (``ECONNREFUSED``) in every start mode, as a pooled
  sandbox prepared before its profile was known does. Nothing in the sandbox but the bridge can
  listen on that port: binding stays denied to the program;
* the bridge (:func:`bridge_script`): run in the sandbox's own network namespace by its pid 1
  (the boot, or a warm run's pid 1), in the run's cgroup, before the program starts;
* a session's ingress agent (:func:`ingress_script`), started the same way by the boot after the
  bridge (cold starts only: a session's sandbox always starts cold), and its ports, which the
  program may bind where Landlock denies it TCP (:func:`serve_ports`);
* the enforcement report's lines (:func:`layers`).

Security limitations: the socket directory is bound as it is, so its host path (a random
``/tmp/sandcell-XXXXXXXX``) shows in the sandbox's ``/proc/self/mountinfo``. Landlock (ABI 7 on
the development host) does not restrict connecting to a path-named Unix socket, so the program
can reach both sockets directly as well as through the bridge; both servers check every
request themselves (the proxy its allowlist, the gateway its profile).
"""

from __future__ import annotations

from collections.abc import Mapping

from sandcell.errors import InfraError
from sandcell.run_sockets import PROXY_PORT, SANDBOX_DIR, SANDBOX_LIB, SandboxSockets

__all__ = [
    "bridge_script",
    "ingress_script",
    "landlock_extras",
    "layers",
    "program_env",
    "python_paths",
    "serve_ports",
]


def program_env(
    base: Mapping[str, str], sockets: SandboxSockets | None, request_env: Mapping[str, str]
) -> dict[str, str]:
    """The program's environment: ``base`` (the runtime's), the sockets' variables, then the
    request's own on top. A ``PYTHONPATH`` of the request keeps :data:`SANDBOX_LIB` after its
    own entries, so that ``import sandcell_tools`` still works in Pythons the program starts."""
    extra = sockets.env() if sockets is not None else {}
    env = {**base, **extra, **request_env}
    ours = extra.get("PYTHONPATH")
    theirs = request_env.get("PYTHONPATH")
    if ours and theirs and ours not in theirs.split(":"):
        env["PYTHONPATH"] = f"{theirs}:{ours}"
    return env


def python_paths(sockets: SandboxSockets | None) -> list[str]:
    """Directories for the program's ``sys.path`` (the boot runs it under ``-I``, which ignores
    ``PYTHONPATH``)."""
    return [SANDBOX_LIB] if sockets is not None else []


def landlock_extras(sockets: SandboxSockets | None) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(paths readable, TCP ports reachable) that the program's Landlock plan adds."""
    if sockets is None:
        return (), ()
    return (SANDBOX_DIR,), (PROXY_PORT,)


def serve_ports(sockets: SandboxSockets | None) -> tuple[int, ...]:
    """TCP ports the program may bind where Landlock denies it TCP: a session's ingress ports."""
    return sockets.ingress if sockets is not None else ()


def bridge_script(sockets: SandboxSockets | None) -> list[str] | None:
    """The bridge's script and arguments (``bridge_argv`` without its interpreter: the pid 1
    that starts it is one already), or None without egress.

    Raises:
        InfraError: ``bridge_argv`` is not ``python -I SCRIPT ARGS...``.
    """
    if sockets is None:
        return None
    return _script(sockets.bridge_argv("python"), "egress bridge")


def ingress_script(sockets: SandboxSockets | None) -> list[str] | None:
    """The ingress agent's script and arguments, as :func:`bridge_script`; None without ports."""
    if sockets is None:
        return None
    return _script(sockets.ingress_argv("python"), "ingress agent")


def _script(argv: list[str] | None, what: str) -> list[str] | None:
    if argv is None:
        return None
    if len(argv) < 3 or argv[1] != "-I" or not argv[2].endswith(".py"):
        raise InfraError(f"the {what}'s command has an unexpected shape: {argv!r}")
    return argv[2:]


def layers(
    sockets: SandboxSockets | None, *, landlock_abi: int | None, cgroup: bool
) -> dict[str, str]:
    """The enforcement report's lines for the run's ways out (none without sockets); ``cgroup``:
    whether the run has one (the bridge is in it), else the bridge holds the run's rlimits."""
    if sockets is None:
        return {}
    if landlock_abi is None:
        tcp = "TCP not restricted by Landlock (off)"
    elif landlock_abi < 4:
        tcp = f"TCP not restricted by Landlock (needs ABI 4, kernel has {landlock_abi})"
    else:
        tcp = f"Landlock denies the program TCP but connect to port {PROXY_PORT}"
    if sockets.ingress and landlock_abi is not None and landlock_abi >= 4:
        tcp += f", and bind to port {', '.join(map(str, sockets.ingress))} (ingress)"
    lines = {"outside": f"{sockets.describe()}; sockets read-only at {SANDBOX_DIR}; {tcp}"}
    if sockets.egress:
        limits = "the run's cgroup" if cgroup else "the run's rlimits"
        lines["egress_bridge"] = (
            f"127.0.0.1:{PROXY_PORT} to {SANDBOX_DIR}/egress.sock, started by the sandbox's "
            f"pid 1 in its own network namespace, under {limits}, before the program"
        )
    if sockets.ingress:
        limits = "the run's cgroup" if cgroup else "the run's rlimits"
        lines["ingress_agent"] = (
            f"{SANDBOX_DIR}/ingress.sock to 127.0.0.1:{', '.join(map(str, sockets.ingress))}, "
            f"started by the sandbox's pid 1 outside the program's Landlock domain, under "
            f"{limits}, before the program; the host opens each connection"
        )
    return lines
