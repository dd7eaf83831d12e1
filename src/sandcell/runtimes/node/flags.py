"""The command line every JavaScript and TypeScript program starts with, on every rung.

Node.js runs with its permission model on, a second wall inside the sandbox: the sandbox bounds
what the process can reach; the permission model takes away what a V8 process could do inside
it that Python cannot, and what no program here needs:

* no child processes and no worker threads (``ERR_ACCESS_DENIED``): a program computes in its
  own process; Bash is the language for running programs;
* no native addons (``process.dlopen``, ``.node`` files: ``ERR_DLOPEN_DISABLED``), no WASI,
  no ``process.binding`` into Node's internals, no inspector (``inspector.open``, sessions);
* ``SIGUSR1`` does not start the inspector (``--disable-sigusr1``);
* files are read wherever the sandbox shows them and written only under the workspace,
  ``/tmp`` and ``/dev/shm`` (``/home/user`` is the workspace bound a second time).

A program cannot widen these: ``NODE_OPTIONS`` and the other variables that change how Node
starts are refused in its environment (``spec.NODE_RESERVED_ENV``), and a new Node process is a
child process.
"""

from __future__ import annotations

WRITABLE = ("/sandbox", "/home/user", "/tmp", "/dev/shm")
"""Where a program may write: the sandbox's writable places, nothing else."""

NODE_FLAGS: tuple[str, ...] = (
    "--permission",
    "--allow-fs-read=*",
    *(f"--allow-fs-write={path}" for path in WRITABLE),
    "--disable-sigusr1",
)
"""Node's flags before the program's path (``Runtime.interpreter_args``)."""
