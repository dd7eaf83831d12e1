"""The programs that run inside every rung's sandbox, shipped as source and run there by path.

Each is a standalone script that imports nothing of sandcell (the sandbox has only the runtime):
``_boot.py`` applies the last isolation layers and starts the program, ``_kernel.py`` is a
session's long-lived interpreter (``_kernel.mjs`` its Node.js twin for JavaScript and TypeScript
sessions, same channel), ``_display.py`` runs a cell as a notebook would and writes its
rich outputs. The namespaces backend, gVisor and the microVM guest run the same files.
``_procs.py``, a session's manager of background processes, terminals and watches, is not
shipped: :mod:`sandcell.sessions.processes` sends its source into the kernel on first use.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
BOOT_SCRIPT = _HERE / "_boot.py"
KERNEL_SCRIPT = _HERE / "_kernel.py"
NODE_KERNEL_SCRIPT = _HERE / "_kernel.mjs"
DISPLAY_SCRIPT = _HERE / "_display.py"
PROCS_SCRIPT = _HERE / "_procs.py"
