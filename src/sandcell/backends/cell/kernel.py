"""Which kernel a session runs, by its language, and how it starts: the one place every rung
asks, so a rung's session code never tells Python from Node itself.

A Python session's kernel is ``_kernel.py``, compiled for the sandbox's path and run by the
runtime's interpreter (``python -I /sandcell/kernel.pyc``); a JavaScript or TypeScript session's
is ``_kernel.mjs``, its Node twin on the same channel, run by Node with the permission model's
flags (``node_program.program_args``: the runtime's ``interpreter_args``, and V8's heap limit
where no cgroup sizes it), with ``--typescript`` for TypeScript cells. Both take ``--outputs`` (the
directory of each cell's rich outputs); the Python kernel also takes ``--path`` (directories on
every cell's ``sys.path``: packages, the tool client) and the compiled display module's path,
where the Node kernel shows a cell's value itself (``--display``) and finds its packages in the
runtime's ``/node_modules``.

A rung lays the kernel's file out (:func:`kernel_file`) and starts :func:`kernel_command` after its
boot's ``exec``; the microVM's guest, whose runner starts the program itself, gets what it needs
in the session job (:func:`guest_kernel`). A Node session's memory is never saved
(:func:`memory_refusal`): pause, snapshot and fork keep its files.
"""

from __future__ import annotations

from collections.abc import Sequence

from sandcell.backends import inside
from sandcell.backends.host import landlock, node_program
from sandcell.backends.host.layout import CONTROL_DIR
from sandcell.runtimes import Runtime
from sandcell.spec import NODE_LANGUAGES, IsolationMode, Language, Limits

__all__ = [
    "NODE_KERNEL",
    "PYTHON_KERNEL",
    "guest_kernel",
    "kernel_command",
    "kernel_file",
    "kernel_options",
    "memory_refusal",
]

PYTHON_KERNEL = "kernel.pyc"
NODE_KERNEL = "kernel.mjs"


def kernel_file(language: Language) -> tuple[str, bytes]:
    """The kernel of a session in ``language`` as a control file: its name in the control
    directory and its bytes (Python's compiled, its tracebacks naming ``/sandcell/kernel.py``;
    Node's the module's source)."""
    if language in NODE_LANGUAGES:
        return NODE_KERNEL, inside.NODE_KERNEL_SCRIPT.read_bytes()
    code = landlock.boot_bytecode(f"{CONTROL_DIR}/kernel.py", script=inside.KERNEL_SCRIPT)
    return PYTHON_KERNEL, code


def kernel_options(
    language: Language,
    *,
    paths: Sequence[str] = (),
    display: str | None = None,
    outputs: str | None = None,
) -> list[str]:
    """The kernel's own arguments, after its path. ``paths``: directories on a Python cell's
    ``sys.path`` (a Node session has none: its packages are the runtime's); ``display``: the
    compiled display module's path in the sandbox (a Node kernel, given one, shows values
    itself); ``outputs``: where each cell's rich outputs go (None: the kernel's ``/tmp``)."""
    options: list[str] = []
    if language in NODE_LANGUAGES:
        if language == "typescript":
            options.append("--typescript")
        if display is not None:
            options.append("--display")
    else:
        for path in paths:
            options += ["--path", path]
        if display is not None:
            options += ["--display", display]
    if outputs is not None:
        options += ["--outputs", outputs]
    return options


def kernel_command(
    language: Language,
    runtime: Runtime,
    limits: Limits,
    mode: IsolationMode,
    *,
    paths: Sequence[str] = (),
    display: str | None = None,
    outputs: str | None = None,
) -> list[str]:
    """The kernel's command line in the sandbox (``runtime`` is the session's, of its
    language), for a boot to ``exec`` once the sandbox's last layers are on."""
    name, _ = kernel_file(language)
    path = f"{CONTROL_DIR}/{name}"
    options = kernel_options(language, paths=paths, display=display, outputs=outputs)
    if language in NODE_LANGUAGES:
        args = node_program.program_args(language, runtime.interpreter_args, limits, mode)
        return [runtime.sandbox_interpreter, *args, path, *options]
    return [runtime.sandbox_python, "-I", path, *options]


def guest_kernel(language: Language, *, outputs: str) -> dict[str, str | list[str]]:
    """What a microVM's session job carries for its guest to start the kernel. Python: the
    kernel's and the display module's sources, which the guest's runner runs in its own process
    (the preloaded modules already imported). Node: the kernel's source, the path the guest
    writes it to and the kernel's arguments; the runner executes the job's interpreter with its
    ``interpreter_args``, that path and these arguments."""
    if language not in NODE_LANGUAGES:
        return {
            "kernel_source": inside.KERNEL_SCRIPT.read_text(encoding="utf-8"),
            "display_source": inside.DISPLAY_SCRIPT.read_text(encoding="utf-8"),
        }
    return {
        "kernel_source": inside.NODE_KERNEL_SCRIPT.read_text(encoding="utf-8"),
        "kernel_path": f"{CONTROL_DIR}/{NODE_KERNEL}",
        # Any display turns the Node kernel's own on (it has no display module to name).
        "kernel_args": kernel_options(language, display="", outputs=outputs),
    }


def memory_refusal(language: Language) -> str | None:
    """Why a session in ``language`` cannot save its memory on any rung (None: it can). A
    copy of a Node kernel's memory holds the state of V8's ``Math.random`` and of OpenSSL's
    generator behind ``crypto``, which nothing can reseed from outside (the Python kernel's
    ``random`` is reseeded after a restore, and ``os.urandom`` asks the kernel each time):
    every session restored from one state would draw the same numbers."""
    if language not in NODE_LANGUAGES:
        return None
    return (
        f"a {language} session cannot save its memory: every copy restored from it would draw "
        "the same numbers from Math.random and crypto (their generators' state lives in Node's "
        "memory and cannot be reseeded); save its files instead (mode=files)"
    )
