"""Where things are inside every rung's sandbox: one floor plan, whatever isolates it.

The workspace, its second mount at the home E2B code expects, the read-only control directory,
the packages and the run's socket directory appear at these paths on every rung (the namespaces
backend's bubblewrap and zygote, gVisor's bundle, the microVM guest's agent and image), so that a
program, a profile's path rules and an export see one layout.
"""

from __future__ import annotations

from collections.abc import Mapping

from sandcell.backends.host import landlock
from sandcell.display import DISPLAY_DIRNAME
from sandcell.run_sockets import SANDBOX_DIR
from sandcell.spec import RunRequest

SANDBOX_UID = 1000


SANDBOX_GID = 1000


SANDBOX_HOSTNAME = "sandcell"


SANDBOX_WORKDIR = "/sandbox"
"""The writable working directory inside the sandbox (a name hosts rarely use, see build_argv)."""


SANDBOX_HOME = "/home/user"
"""The same workspace again, where code written for other sandboxes (E2B's) expects its home
and files: a second mount of the one directory, not a copy or a link, so that ``os.getcwd()``
there says ``/home/user`` and every limit and export rule of the workspace holds through it."""


PACKAGES_DIR = "/packages"
"""Where packages from the wheel cache appear, read-only, one directory each."""


SOCKETS_DIR = SANDBOX_DIR
"""Where a run's socket directory appears (``run_sockets.SANDBOX_DIR``)."""


ETC_FILES: Mapping[str, str] = {
    "passwd": (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:/tmp:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "group": f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\nnogroup:x:65534:\n",
    "hosts": f"127.0.0.1 localhost {SANDBOX_HOSTNAME}\n::1 localhost\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
}
"""Synthetic ``/etc`` files: enough for ``id`` and ``localhost``, nothing of the host."""


CONTROL_BOOT = "boot.pyc"


CONTROL_PLAN = "plan.json"


CONTROL_DISPLAY = "display.pyc"


CONTROL_INIT = "init"
"""The native pid 1 of a cold run (``inside/_init.c``, ``host/native_init.py``), linked into the
control directory when it could be built."""


CONTROL_DIR = landlock.SANDBOX_DIR
"""Where the control directory appears in the sandbox (read-only)."""


# Display outputs go to a directory of the workspace: it outlives the sandbox until the host
# collects it (a tmpfs of bwrap's own would die with the sandbox), it is already capped by the
# workspace quota, and the rootless path reads it through /proc/PID/root like the exports. The
# executor reads it first and removes it, so it is never exported nor seen as a program's file.
DISPLAY_DIR = f"{SANDBOX_WORKDIR}/{DISPLAY_DIRNAME}"


def displays(request: RunRequest) -> bool:
    """Whether the run captures rich outputs (python programs only)."""
    return request.display and request.language == "python"


SESSION_OUTPUTS_DIR = "/tmp/.sandcell-outputs"
"""Where a session's kernel writes each cell's rich outputs (``<dir>/<cell id>``) on the rungs
whose workspace is not a host directory the kernel could use (the namespaces sandbox's private
``/tmp``, the microVM guest's); the kernel (``backends/inside/_kernel.py``) and the guest agent
name it too, as they import nothing of sandcell."""
