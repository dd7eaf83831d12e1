"""The ``# boundary`` line of ``sandcell audit show``: a run record's backend versions, readably.

A record's ``backend`` holds the rung's name and the versions the backend reported
(``Backend.versions()``). Several of those values already start with their tool's name
(``runsc version ...``, ``QEMU emulator version ...``) and some repeat one another (runsc's release
is inside its version text), so printing ``key value`` pairs said things twice. Each known key
has a phrase here; a key this module does not know (a newer backend's) is still shown, as
``key value``, so nothing in the record is hidden.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

_Phrase = Callable[[Mapping[str, str]], str]


def _strip(value: str, *prefixes: str) -> str:
    for prefix in prefixes:
        if value.lower().startswith(prefix.lower()):
            return value[len(prefix) :].strip()
    return value


def _runsc(v: Mapping[str, str]) -> str:
    # The release alone: the full version text adds the OCI spec version after a "; ", which
    # reads as the separator between parts.
    release = v.get("runsc_release") or _strip(v["runsc"], "runsc version ").split(";")[0]
    details = [f"{v['runsc_platform']} platform"] if v.get("runsc_platform") else []
    if v.get("runsc_rootless") in ("true", "false"):
        details.append("rootless" if v["runsc_rootless"] == "true" else "as root")
    if v.get("runsc_path"):
        details.append(v["runsc_path"])
    return f"runsc {release}" + (f" ({', '.join(details)})" if details else "")


def _host_kernel(v: Mapping[str, str]) -> str:
    return " ".join(["host kernel", v["kernel"], *([v["arch"]] if v.get("arch") else [])])


_PHRASES: Mapping[str, _Phrase] = {
    "bubblewrap": lambda v: f"bubblewrap {_strip(v['bubblewrap'], 'bubblewrap ')}",
    "kernel": _host_kernel,
    "runsc": _runsc,
    "kernel_seen_by_program": lambda v: (
        f"kernel seen by the program: {v['kernel_seen_by_program']}"
    ),
    "qemu": lambda v: f"QEMU {_strip(v['qemu'], 'QEMU emulator version ', 'qemu ')}",
    "accelerator": lambda v: f"accelerator {v['accelerator']}",
    "guest_kernel": lambda v: f"guest kernel {v['guest_kernel']}",
    "guest_kernel_sha256": lambda v: f"guest kernel sha256 {v['guest_kernel_sha256']}",
    "guest_image_sha256": lambda v: f"guest image sha256 {v['guest_image_sha256']}",
    "guest_initrd_sha256": lambda v: f"guest initrd sha256 {v['guest_initrd_sha256']}",
    # The wasm rung: the interpreter the program had is Pyodide's CPython, not the runtime's.
    "pyodide": lambda v: (
        f"Pyodide {v['pyodide']}" + (f" ({v['python']})" if v.get("python") else "")
    ),
    "node": lambda v: f"Node.js {v['node']}",
}

_TAKEN_BY: Mapping[str, str] = {
    "arch": "kernel",
    "runsc_release": "runsc",
    "runsc_platform": "runsc",
    "runsc_rootless": "runsc",
    "runsc_path": "runsc",
    "python": "pyodide",
}
"""Keys shown inside another key's phrase (when that key is in the record)."""


def boundary_line(record: object) -> str:
    """The backend and each versioned part of the boundary a run had, on one line."""
    r = record if isinstance(record, Mapping) else {}
    backend = r.get("backend")
    b = backend if isinstance(backend, Mapping) else {}
    name = str(b.get("name", "unknown"))
    versions = {str(k): str(v) for k, v in b.items() if k != "name"}
    # The phrases' order, not the record's (stored with its keys sorted): the tool, then the
    # kernel the program sees, then the hashes; keys unknown here come last.
    parts = [phrase(versions) for key, phrase in _PHRASES.items() if key in versions]
    parts += [
        f"{key.replace('_', ' ')} {value}"
        for key, value in versions.items()
        if key not in _PHRASES and _TAKEN_BY.get(key) not in versions
    ]
    return name + (f" ({'; '.join(parts)})" if parts else "")


__all__ = ["boundary_line"]
