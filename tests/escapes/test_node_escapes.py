"""Escapes by JavaScript and TypeScript programs: one test per vector, on every rung that runs
them, as root and as an ordinary user (``node_sandbox``, tests/conftest.py).

Node.js runs with its permission model on (``runtimes/node/flags.py``) inside the sandbox of each
rung: what the permission model takes away (child processes, workers, addons, WASI, internal
bindings, the inspector, writes outside the writable directories) must fail inside the sandbox,
and what the sandbox takes away (host files, the network) must fail whatever Node allows.
Programs run under the ``unchecked`` profile: no static check stands between them and the wall.

Attacks print their verdicts as the Python ones do (``blocked:``, ``BREACH``, ``UNEXPECTED``, the
completion marker) and are judged by the same :meth:`Attack.expect_blocked`.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import Sandbox, run_as_user

from sandcell import ConfigError, RunRequest
from sandcell.backends.host.node_program import ADDRESS_RESERVE
from sandcell.spec import NODE_RESERVED_ENV, MiB

from .conftest import END, Attack, Listener

REPO = Path(__file__).resolve().parents[2]

PRELUDE = """\
"use strict";
function blocked(what, why) { console.log(`blocked: ${what} -> ${why}`); }
function breach(what) { console.log(`BREACH ${what}`); }
function unexpected(what, why) { console.log(`UNEXPECTED ${what} -> ${why}`); }
function codeOf(e) { return (e && (e.code || (e.cause && e.cause.code) || e.name)) || String(e); }
function judge(what, e, ok) {
  const code = codeOf(e);
  if (!ok || ok.includes(code)) blocked(what, code);
  else unexpected(what, `${code}: ${e && e.message}`);
}
function shown(r) {
  try { return JSON.stringify(r).slice(0, 200); } catch { return String(r).slice(0, 200); }
}
function attempt(what, fn, ok) {
  let r;
  try { r = fn(); } catch (e) { judge(what, e, ok); return; }
  breach(`${what}: ${shown(r)}`);
}
async function attemptAsync(what, fn, ok) {
  let r;
  try { r = await fn(); } catch (e) { judge(what, e, ok); return; }
  breach(`${what}: ${shown(r)}`);
}
function connect(port, host) {
  const net = require("net");
  return new Promise((resolve, reject) => {
    const s = net.connect({ port, host });
    const late = Object.assign(new Error("timeout"), { code: "ETIMEDOUT" });
    s.setTimeout(5000, () => { s.destroy(); reject(late); });
    s.on("connect", () => { s.destroy(); resolve("connected"); });
    s.on("error", reject);
  });
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
"""

DENIED = '["ERR_ACCESS_DENIED"]'
NET_BLOCKED = '["ECONNREFUSED", "ENETUNREACH", "EHOSTUNREACH", "EACCES", "EPERM", "ETIMEDOUT"]'


def js_attack(body: str) -> str:
    """An attack program: the prelude, the body (run in an async function, CommonJS), the
    completion marker; an exception that escapes the body is reported, never a pass."""
    text = textwrap.indent(textwrap.dedent(body).strip("\n"), "  ")
    return (
        PRELUDE
        + "(async () => {\n"
        + text
        + f"\n  console.log({END!r});\n}})().catch((e) => "
        + 'console.log("UNEXPECTED the attack crashed -> " + (e && e.stack)));\n'
    )


@pytest.fixture
def attack(node_sandbox: Sandbox) -> Attack:
    return Attack(sandbox=node_sandbox, identity=node_sandbox.identity, home=node_sandbox.home)


def _run(attack: Attack, body: str, **kw: Any) -> dict[str, object]:
    return attack.run(js_attack(body), raw=True, lang="javascript", **kw)


def test_child_processes_are_denied(attack: Attack) -> None:
    res = _run(
        attack,
        f"""
        const cp = require("child_process");
        attempt("spawn /bin/sh", () => cp.spawn("/bin/sh", ["-c", "id"]), {DENIED});
        attempt("spawnSync /bin/sh", () => cp.spawnSync("/bin/sh", ["-c", "id"]), {DENIED});
        attempt("execSync id", () => cp.execSync("id"), {DENIED});
        attempt("execFile node", () => cp.execFile(process.execPath, ["-v"]), {DENIED});
        attempt("fork main.js", () => cp.fork(__filename), {DENIED});
        """,
    )
    attack.expect_blocked(res, attempts=5)


def test_worker_threads_are_denied(attack: Attack) -> None:
    res = _run(
        attack,
        f"""
        const {{ Worker }} = require("worker_threads");
        attempt("eval worker", () => new Worker("1", {{ eval: true }}), {DENIED});
        attempt("file worker", () => new Worker(__filename), {DENIED});
        """,
    )
    attack.expect_blocked(res, attempts=2)


def test_native_addons_are_refused(attack: Attack) -> None:
    """``process.dlopen`` and ``require`` of a ``.node`` file: addons are disabled, whatever the
    file (a real shared library, or one the program wrote)."""
    res = _run(
        attack,
        """
        const fs = require("fs");
        const off = ["ERR_DLOPEN_DISABLED"];
        const libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
          .find((p) => fs.existsSync(p)) || "/lib64/ld-linux-x86-64.so.2";
        fs.copyFileSync(libc, "/tmp/addon.node");
        attempt("process.dlopen libc", () => process.dlopen({ exports: {} }, libc), off);
        attempt("require a .node", () => require("/tmp/addon.node"), off);
        attempt(
          "the .node loader",
          () => require("module")._extensions[".node"]({ exports: {} }, "/tmp/addon.node"),
          off,
        );
        """,
    )
    attack.expect_blocked(res, attempts=3)


def test_internal_bindings_are_denied(attack: Attack) -> None:
    res = _run(
        attack,
        f"""
        for (const name of ["fs", "spawn_sync", "process_wrap", "natives"]) {{
          attempt(`process.binding(${{name}})`, () => process.binding(name), {DENIED});
        }}
        // Only an embedder links bindings; none reaches the program.
        attempt(
          "process._linkedBinding(spawn_sync)",
          () => process._linkedBinding("spawn_sync"),
          ["ERR_ACCESS_DENIED", "ERR_INVALID_MODULE"],
        );
        """,
    )
    attack.expect_blocked(res, attempts=5)


def test_wasi_is_denied(attack: Attack) -> None:
    res = _run(
        attack,
        f"""
        const {{ WASI }} = require("wasi");
        attempt("new WASI", () => new WASI({{ version: "preview1", preopens: {{ "/": "/" }} }}),
          {DENIED});
        """,
    )
    attack.expect_blocked(res, attempts=1)


def test_inspector_cannot_be_opened(attack: Attack) -> None:
    """``inspector.open``, a session, and the signal that would start the inspector: nothing
    listens on 9229 afterwards."""
    res = _run(
        attack,
        f"""
        const inspector = require("inspector");
        attempt("inspector.open", () => inspector.open(9229, "127.0.0.1"), {DENIED});
        attempt("inspector session", () => new inspector.Session().connect(), {DENIED});
        process.kill(process.pid, "SIGUSR1");
        process._debugProcess(process.pid);
        await sleep(500);
        // Nothing listens (Landlock refuses the connection on the namespaces rung; a guest
        // without run sockets has no loopback up).
        await attemptAsync("connect to the inspector's port", () => connect(9229, "127.0.0.1"),
          ["ECONNREFUSED", "EACCES", "EPERM", "ENETUNREACH"]);
        """,
    )
    attack.expect_blocked(res, attempts=3)


def test_writes_outside_the_writable_directories(attack: Attack) -> None:
    """The runtime, the packages, the program and the system directories are read-only to the
    program: the permission model refuses first, the sandbox's read-only mounts beneath it."""
    res = _run(
        attack,
        """
        const fs = require("fs");
        const ok = ["ERR_ACCESS_DENIED", "EROFS", "EACCES", "EPERM", "ENOENT"];
        const files = [
          "/etc/passwd", "/etc/sandcell-escape", "/usr/sandcell-escape",
          "/node_modules/lodash/lodash.js", "/node_modules/sandcell-escape.js",
          "/opt/sandcell/node/bin/node", "/opt/sandcell/sandcell-escape", "/sandcell/main.js",
        ];
        for (const f of files) attempt(`write ${f}`, () => fs.writeFileSync(f, "x"), ok);
        attempt("mkdir /node_modules/evil", () => fs.mkdirSync("/node_modules/evil"), ok);
        attempt("chmod node", () => fs.chmodSync("/opt/sandcell/node/bin/node", 0o777), ok);
        attempt("symlink into /node_modules",
          () => fs.symlinkSync("/tmp", "/node_modules/evil-link"), ok);
        const _ = require("lodash");
        if (typeof _.chunk !== "function") breach("lodash was changed");
        fs.writeFileSync("/tmp/allowed", "x");
        fs.writeFileSync("/sandbox/allowed", "x");
        """,
    )
    attack.expect_blocked(res, attempts=11)


def test_host_secrets_are_unreadable(attack: Attack) -> None:
    """Node may read anywhere the sandbox shows (``--allow-fs-read=*``): the sandbox shows
    nothing of the host's secrets, its users' homes, sandcell's store or this checkout."""
    paths = [
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/sudoers",
        "/root",
        "/root/.bash_history",
        "/home/sandcell-test",
        "/var/lib/sandcell",
        str(REPO),
    ]
    res = _run(
        attack,
        f"""
        const fs = require("fs");
        for (const p of {json.dumps(paths)}) {{
          attempt(`read ${{p}}`, () => {{
            const st = fs.statSync(p);
            return st.isDirectory() ? fs.readdirSync(p).slice(0, 20) : fs.readFileSync(p, "utf8");
          }}, ["ENOENT", "EACCES", "EPERM"]);
        }}
        """,
    )
    attack.expect_blocked(res, attempts=len(paths))


def test_network_is_unreachable(attack: Attack, tcp_listener: Listener) -> None:
    res = _run(
        attack,
        f"""
        await attemptAsync("tcp to the host's loopback",
          () => connect({tcp_listener.port}, "127.0.0.1"), {NET_BLOCKED});
        await attemptAsync("tcp to the internet", () => connect(443, "1.1.1.1"), {NET_BLOCKED});
        await attemptAsync("dns lookup", () => require("dns").promises.lookup("example.com"),
          ["ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ESERVFAIL"]);
        await attemptAsync("fetch", () => fetch("http://1.1.1.1/", {{
          signal: AbortSignal.timeout(5000) }}), [...{NET_BLOCKED}, "TimeoutError"]);
        """,
    )
    attack.expect_blocked(res, attempts=4)
    assert not tcp_listener.stop(), f"[{attack.identity}] ESCAPE: {tcp_listener.seen}"


def test_node_start_variables_are_refused_before_the_run(
    attack: Attack, request: pytest.FixtureRequest
) -> None:
    """A variable that changes how Node starts (its flags, its module path) is refused before
    any sandbox starts, through the API and the CLI alike."""
    for name in NODE_RESERVED_ENV:
        with pytest.raises(ConfigError, match=name):
            RunRequest(code="1", language="javascript", env={name: "--allow-child-process"})
    if attack.identity == "user":
        unpriv = request.getfixturevalue("unpriv")
        args = ["run", "--json", "--profile", "unchecked", "--lang", "javascript"]
        args += ["--env", "NODE_OPTIONS=--allow-child-process", "-c", "console.log(1)"]
        if attack.sandbox.backend != "namespaces":
            args.insert(1, f"--backend={attack.sandbox.backend}")
        proc = run_as_user(unpriv, args)
        assert proc.returncode == 78, proc
        assert b"NODE_OPTIONS" in proc.stderr and not proc.stdout, proc
    # And the program's own environment holds none of them.
    res = _run(
        attack,
        """
        for (const k of Object.keys(process.env)) {
          if (k.startsWith("NODE_")) breach(`${k} is set`);
        }
        attempt("NODE_OPTIONS set late widens nothing", () => {
          process.env.NODE_OPTIONS = "--allow-child-process";
          return require("child_process").spawnSync(process.execPath, ["-v"]);
        }, ["ERR_ACCESS_DENIED"]);
        """,
    )
    attack.expect_blocked(res, attempts=1)


def test_promise_and_allocation_storm_is_bounded(attack: Attack) -> None:
    """Unbounded promises, arrays and buffers end at the memory limit, not the host's."""
    res = _run(
        attack,
        """
        const held = [];
        console.log("storming");
        for (;;) {
          held.push(new Array(4096).fill(held.length), Buffer.alloc(1 << 16, 1));
          held.push(Promise.all(Array.from({ length: 64 }, () => new Promise(() => {}))));
          if (held.length % 512 === 0) await Promise.resolve();
        }
        """,
        memory_mb=128,
        wall_time_s=10,
    )
    # Ended at the memory limit; or, where the sandbox's memory is full of the runtime's
    # reclaimable pages (a guest without KVM thrashes on Node's 100 MiB binary), by the wall
    # time with its memory still within the limit.
    assert res["outcome"] in ("memory_limit", "timeout"), f"[{attack.identity}] {res}"
    if res["outcome"] == "timeout":
        assert "wall-time limit" in str(res["reason"]), f"[{attack.identity}] {res}"
        peak = res["usage"]["peak_memory_bytes"]  # type: ignore[index]
        assert peak <= 128 * MiB + ADDRESS_RESERVE, f"[{attack.identity}] {res}"
    assert "BREACH" not in str(res["stdout"])


def test_permission_flags_cannot_be_widened(attack: Attack) -> None:
    """The flags are the program's for good: it sees them, cannot drop or add one, and a new
    Node process with wider flags would be a child process."""
    res = _run(
        attack,
        f"""
        const argv = process.execArgv;
        if (!argv.includes("--permission")) breach(`no --permission in ${{argv}}`);
        for (const scope of ["child", "worker", "wasi", "inspector", "addon"]) {{
          if (process.permission.has(scope)) breach(`permission ${{scope}} granted`);
        }}
        if (process.permission.has("fs.write", "/etc")) breach("fs.write /etc granted");
        attempt("spawn node --allow-child-process",
          () => require("child_process").spawnSync(process.execPath,
            ["--allow-child-process", "-e", "1"]), {DENIED});
        try {{ require("v8").setFlagsFromString("--allow-child-process"); }} catch {{}}
        try {{ process.permission.has = () => true; }} catch {{}}
        process.execArgv.length = 0;
        attempt("spawn after tampering", () => require("child_process").spawnSync("/bin/sh"),
          {DENIED});
        """,
    )
    attack.expect_blocked(res, attempts=2)
