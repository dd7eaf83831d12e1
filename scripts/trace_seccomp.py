"""Which system calls sandboxed programs make, under which seccomp filter: the allowlist's evidence.

    .venv/bin/python scripts/trace_seccomp.py OUT -- COMMAND...

Runs COMMAND (a test run, a script using sandcell) with ``SANDCELL_BWRAP`` pointing at a wrapper
that starts every sandbox's bubblewrap under ``strace -f``, then reads the traces and writes OUT in
the format of ``tests/unit/data/seccomp_trace.txt``. A call counts from the moment its process (or
the parent it was forked from) installed a filter: the cold path's filter, or in a warm template
first the setup filter ("setup") and then the run's full filter ("full"). Calls that the policy
refuses by name are written apart ("attacks"): the escape suite makes them on purpose. Needs root
(strace follows the sandbox into its namespaces) and strace; traces go to a temporary directory.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sandcell.backends.host.bubblewrap import find_bwrap
from sandcell.backends.host.seccomp import build_policy, build_setup_policy, native_arch

_CALL = re.compile(r"^(\d+) +(?:<\.\.\. (\w+) resumed>|(\w+)\()")
_RET = re.compile(r"= (\d+)(?: /\* (\d+) in strace's PID NS \*/)?\s*$")
_FORKS = ("clone", "clone3", "fork", "vfork")

_WRAPPER = """#!/bin/sh
case "$1" in --version|--help) exec {bwrap} "$@";; esac
kind=cold
for a in "$@"; do case "$a" in *zygote*) kind=template;; esac; done
exec {strace} -f -qq --pidns-translation -s 0 -o "{out}/$kind.$$" {bwrap} "$@"
"""


def levels(trace: str) -> dict[int, collections.Counter[str]]:
    """Filter depth (0: none yet) to the calls made at that depth, from one ``strace -f`` log."""
    lines = trace.splitlines()
    installs: dict[int, list[int]] = collections.defaultdict(list)
    parent: dict[int, tuple[int, int]] = {}
    started: dict[int, int] = {}
    calls: list[tuple[int, int, str]] = []
    for i, line in enumerate(lines):
        m = _CALL.match(line)
        if m is None:
            continue
        pid, name = int(m[1]), m[2] or m[3]
        if m[2] is None:
            calls.append((pid, i, name))
            if "PR_SET_SECCOMP" in line or (name == "seccomp" and "SET_MODE_FILTER" in line):
                installs[pid].append(i)
            if name in _FORKS:
                started[pid] = i
        if name in _FORKS and "unfinished" not in line and (r := _RET.search(line)):
            parent[int(r[2] or r[1])] = (pid, started.get(pid, i))

    inherited: dict[int, int] = {}

    def depth(pid: int, at: int) -> int:
        if pid not in inherited:
            inherited[pid] = depth(*parent[pid]) if pid in parent else 0
        return inherited[pid] + sum(1 for j in installs[pid] if j < at)

    out: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for pid, i, name in calls:
        out[depth(pid, i)][name] += 1
    return out


def render(seen: dict[str, set[str]], how: str) -> str:
    """The data file: one line per filter, calls refused by name set apart."""
    arch = native_arch()
    refused = {
        "full": {d.name for d in build_policy(arch).denied},
        "setup": {d.name for d in build_setup_policy(arch).denied},
    }
    attacks = (seen["full"] & refused["full"]) | (seen["setup"] & refused["setup"])
    lines = [
        f"# System calls seen inside sandboxes ({arch}), by scripts/trace_seccomp.py:",
        f"#   {how}",
        "# setup: under a warm template's setup filter; full: under the run's filter;",
        "# attacks: calls the policy refuses by name, made on purpose by the escape suite.",
        "full: " + " ".join(sorted(seen["full"] - refused["full"])),
        "setup: " + " ".join(sorted(seen["setup"] - refused["setup"])),
        "attacks: " + " ".join(sorted(attacks)),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    out_file, command = Path(argv[0]), argv[2:]
    strace = shutil.which("strace")
    if strace is None:
        print("trace_seccomp: strace is not installed (apt-get install strace)", file=sys.stderr)
        return 1
    seen: dict[str, set[str]] = {"setup": set(), "full": set()}
    with tempfile.TemporaryDirectory(prefix="sandcell-trace-") as tmp:
        traces = Path(tmp, "traces")
        traces.mkdir()
        traces.chmod(0o777)  # sandboxes of the unprivileged test user write here too
        wrapper = Path(tmp, "bwrap")
        wrapper.write_text(_WRAPPER.format(bwrap=find_bwrap().path, strace=strace, out=traces))
        wrapper.chmod(0o755)
        Path(tmp).chmod(0o755)
        env = {**os.environ, "SANDCELL_BWRAP": str(wrapper)}
        status = subprocess.run(command, env=env, check=False).returncode
        for path in sorted(traces.iterdir()):
            template = path.name.startswith("template.")
            for depth, counts in levels(path.read_text(errors="replace")).items():
                if depth:
                    seen["setup" if template and depth == 1 else "full"].update(counts)
    out_file.write_text(render(seen, " ".join(command)))
    print(f"trace_seccomp: {len(seen['full'])} calls under the full filter -> {out_file}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
