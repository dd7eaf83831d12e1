"""The runsc binary: finding it, proving it starts a sandbox here, and its state directory.

:func:`find_runsc` fails closed (IsolationUnavailable) when runsc is missing, does not report a
version, or cannot run a trivial container on this host as this user. The state directory is
private to the user (``<runs root>/.gvisor-state``); container ids start with the supervisor's
owner tag, so the sweep can tell which belong to a supervisor that is gone.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandcell.backends.host import workspace
from sandcell.errors import IsolationUnavailable

PLATFORM = "ptrace"
"""The only platform that works on this kind of host: KVM hangs at boot in a para-virtualised
VM without VT-x, and systrap does not exist in the 2022 releases."""
HOST_UDS = "open"
"""runsc's narrowest host Unix socket setting that allows connecting (``create`` would let the
sandbox bind sockets on the host, ``all`` both)."""
_SEARCH = ("/usr/bin/runsc", "/usr/sbin/runsc", "/usr/local/bin/runsc")
STATE_DIRNAME = ".gvisor-state"


@dataclass(frozen=True, slots=True, kw_only=True)
class Runsc:
    """A runsc binary that starts sandboxes here, and how sandcell calls it."""

    path: str
    version_text: str
    release: str
    platform: str
    rootless: bool
    state_dir: Path
    host_uds: bool = False
    """Whether this runsc has ``--host-uds`` (a run that reaches outside needs it)."""

    def argv(self, *args: str, host_uds: bool = False) -> list[str]:
        """The command line of one runsc call: every sandbox has no network, and its cgroup is
        the host's (made and joined before runsc starts), so runsc's own cgroup code is off.

        ``host_uds``: the sandbox may connect to host Unix sockets in its mounts (its run's
        socket directory, the only mount that holds any), never create one: without it the
        sentry refuses every connect to a socket file the gofer serves."""
        base = [self.path, "--root", str(self.state_dir), "--network=none"]
        base += [f"--platform={self.platform}", "--ignore-cgroups"]
        if host_uds:
            base.append(f"--host-uds={HOST_UDS}")
        if self.rootless:
            base.append("--rootless")
        return [*base, *args]

    def describe(self) -> str:
        mode = "rootless" if self.rootless else "as root"
        return f"runsc {self.release} ({self.path}), platform {self.platform}, {mode}"


def state_dir() -> Path:
    # A dot name: the namespaces backend's sweep removes every other entry of the runs root
    # that is not a live supervisor's.
    path = workspace.runs_root() / STATE_DIRNAME
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _locate() -> str | None:
    override = os.environ.get("SANDCELL_RUNSC")
    if override:
        return override if os.access(override, os.X_OK) else None
    found = shutil.which("runsc")
    if found:
        return found
    return next((p for p in _SEARCH if os.access(p, os.X_OK)), None)


@functools.cache
def find_runsc() -> Runsc:
    """A runsc that runs a container here as this user; raises IsolationUnavailable if none."""
    workspace.prepare_root()
    path = _locate()
    if path is None:
        raise IsolationUnavailable(
            "gvisor",
            "runsc was not found (looked at $SANDCELL_RUNSC, PATH and " + ", ".join(_SEARCH) + ")",
            "install gVisor (apt-get install runsc) or point SANDCELL_RUNSC at a runsc binary",
        )
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=20, check=False, env={}
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise IsolationUnavailable(
            "gvisor", f"{path} --version failed: {exc}", "reinstall runsc"
        ) from exc
    m = re.search(r"runsc version (\S+)", out.stdout)
    if out.returncode != 0 or m is None:
        raise IsolationUnavailable(
            "gvisor",
            f"{path} --version did not report a version: {(out.stdout + out.stderr).strip()!r}",
            "reinstall runsc",
        )
    runsc = Runsc(
        path=path,
        version_text=out.stdout.strip().replace("\n", "; "),
        release=m.group(1),
        platform=os.environ.get("SANDCELL_RUNSC_PLATFORM", PLATFORM),
        rootless=os.geteuid() != 0,
        state_dir=state_dir(),
        host_uds=_has_flag(path, "host-uds"),
    )
    _start_check(runsc)
    return runsc


def _has_flag(path: str, name: str) -> bool:
    """Whether ``runsc flags`` lists the global flag ``name``."""
    try:
        out = subprocess.run(
            [path, "flags"], capture_output=True, text=True, timeout=20, check=False, env={}
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return re.search(rf"^\s*-{re.escape(name)}\b", out.stdout + out.stderr, re.M) is not None


def write_bare_bundle(
    bundle: Path,
    runsc: Runsc,
    args: Sequence[str],
    *,
    env: Sequence[str] = (),
    cwd: str = "/",
    mounts: Sequence[Mapping[str, object]] = (),
) -> None:
    """Write the smallest OCI bundle that runs ``args`` into the directory ``bundle``: a read-only
    empty root with the host's ``/usr`` bound read-only (``/bin``, ``/lib``, ``/lib64`` as the
    host's links into it), ``/proc``, new namespaces, no capabilities, as nobody (as root when
    rootless: the only user there), plus ``mounts`` (OCI mount objects; their destinations are
    made in the root). What the start check runs, and the floor a benchmark compares with."""
    rootfs = bundle / "rootfs"
    extra = (str(m["destination"]).lstrip("/") for m in mounts)
    for d in ("usr", "proc", "dev", "tmp", *extra):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "lib", "lib64"):
        if os.path.islink(f"/{link}"):
            os.symlink(os.readlink(f"/{link}"), rootfs / link)
    config = {
        "ociVersion": "1.0.2",
        "process": {
            "user": {"uid": 0 if runsc.rootless else 65534, "gid": 65534},
            "args": list(args),
            "env": list(env),
            "cwd": cwd,
            "capabilities": {},
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs), "readonly": True},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]},
            *mounts,
        ],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
    }
    (bundle / "config.json").write_text(json.dumps(config))


def _start_check(runsc: Runsc) -> None:
    """Run ``/usr/bin/true`` in a container, or raise IsolationUnavailable with runsc's error."""
    bundle = Path(
        tempfile.mkdtemp(prefix=f".gvcheck-{workspace.owner_tag()}-", dir=runsc.state_dir)
    )
    cid = f"{workspace.owner_tag()}.check"
    try:
        write_bare_bundle(bundle, runsc, ["/usr/bin/true"])
        try:
            proc = subprocess.run(
                runsc.argv("run", "--bundle", str(bundle), cid),
                capture_output=True,
                timeout=60,
                check=False,
                env={},
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise IsolationUnavailable(
                "gvisor",
                f"runsc did not start a test container: {exc}",
                f"check that platform {runsc.platform} works here (`runsc --platform="
                f"{runsc.platform} do /bin/true`)",
            ) from exc
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip()
            who = "as an ordinary user (rootless)" if runsc.rootless else "as root"
            raise IsolationUnavailable(
                "gvisor",
                f"runsc could not run a test container {who}: {err or f'exit {proc.returncode}'}",
                "run as root, or enable unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1) for rootless gVisor",
            )
    finally:
        delete(runsc, cid)
        shutil.rmtree(bundle, ignore_errors=True)


def leftover(runsc: Runsc, container_id: str) -> bool:
    """Whether the state directory still holds ``container_id`` (a killed ``runsc run`` leaves
    it there until ``runsc delete --force``)."""
    with contextlib.suppress(OSError):
        return any(container_id in name for name in os.listdir(runsc.state_dir))
    return False


def delete(runsc: Runsc, container_id: str) -> None:
    """``runsc delete --force``: ends what is left of the container and removes its state."""
    if not leftover(runsc, container_id):
        return
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            runsc.argv("delete", "--force", container_id),
            capture_output=True,
            timeout=30,
            check=False,
            env={},
            stdin=subprocess.DEVNULL,
        )


def forget(runsc: Runsc, container_id: str) -> None:
    """Remove a container's state files once none of its processes can be alive (its cgroup is
    empty, or its workspace helper, which reaps every descendant, has exited): what ``runsc
    delete --force`` would do then, without its 1-2 s of waiting for a sandbox that is gone."""
    prefix = f"{container_id}_sandbox:"
    with contextlib.suppress(OSError):
        for name in os.listdir(runsc.state_dir):
            if name.startswith(prefix):
                with contextlib.suppress(FileNotFoundError):
                    (runsc.state_dir / name).unlink()


def container_ids(runsc: Runsc) -> list[str]:
    """The containers the state directory holds (``<id>_sandbox:<sandbox id>.state`` files;
    read directly: ``runsc list`` of this release skips containers it cannot load)."""
    ids: set[str] = set()
    with contextlib.suppress(OSError):
        for name in os.listdir(runsc.state_dir):
            cid, sep, _rest = name.partition("_sandbox:")
            if sep and cid:
                ids.add(cid)
    return sorted(ids)


def owner_of(container_id: str) -> str:
    """The owner tag a container id starts with (``<pid>-<start time>.<rest>``)."""
    return container_id.partition(".")[0]


def versions(runsc: Runsc) -> dict[str, str]:
    return {
        "runsc": runsc.version_text,
        "runsc_release": runsc.release,
        "runsc_platform": runsc.platform,
        "runsc_path": runsc.path,
        "runsc_rootless": str(runsc.rootless).lower(),
    }


__all__ = [
    "HOST_UDS",
    "PLATFORM",
    "STATE_DIRNAME",
    "Runsc",
    "container_ids",
    "delete",
    "find_runsc",
    "forget",
    "leftover",
    "owner_of",
    "state_dir",
    "versions",
    "write_bare_bundle",
]
