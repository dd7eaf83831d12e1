"""JavaScript and TypeScript checks on the tree-sitter parse: each rule fires where it should,
with its severity and location; ordinary programs pass; the evasion twins of the Python
checker's held-out tricks are caught; the gate decides a JavaScript program as it does Python."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sandcell.policy import gate
from sandcell.policy.checks import RULES, Finding, check, check_javascript
from sandcell.policy.profiles import Profile, load_profile
from sandcell.runtimes.node.locked import locked_packages
from sandcell.spec import RunRequest

LOCKED = frozenset(locked_packages())

PROGRAM = """\
const _ = require("lodash");
const fs = require("node:fs");
const path = require("path");

const text = fs.readFileSync("data.csv", "utf8");
const rows = text.trim().split("\\n").map((line) => line.split(","));
const byKey = _.groupBy(rows.slice(1), (r) => r[0]);
const totals = Object.entries(byKey).map(([k, rs]) => [k, _.sumBy(rs, (r) => Number(r[1]))]);
fs.mkdirSync("out", { recursive: true });
fs.writeFileSync(path.join("out", "totals.json"), JSON.stringify(totals));
fs.writeFileSync("/tmp/scratch.txt", String(rows.length));
const extra = fs.existsSync("/inputs/extra.csv") ? fs.readFileSync("/inputs/extra.csv") : null;
class Row { constructor(k) { this.k = k; this.kind = this.constructor.name; } }
setTimeout(() => console.log(JSON.stringify({ rows: rows.length, extra: !!extra })), 0);
"""

TS_PROGRAM = """\
import { z } from "zod";
import { readFileSync } from "node:fs";
import type { Options } from "./options";

interface Row<T> {
  id: number;
  value: T;
}
type Key = string | number;
const Schema = z.object({ id: z.number(), value: z.string() });

function first<T>(items: readonly T[]): T | undefined {
  return items[0];
}

abstract class Store<T extends { id: Key }> {
  protected items: Map<Key, T> = new Map();
  abstract load(path: string): T[];
}

const raw: unknown = JSON.parse(readFileSync("/inputs/rows.json", "utf8"));
const rows = (raw as Row<string>[]).map((r) => Schema.parse(r));
const head = first(rows)!;
const total = rows.reduce<number>((n, r) => n + r.id, 0) satisfies number;
console.log(JSON.stringify({ head, total }));
"""


def findings(
    code: str, *, ts: bool = False, network: bool = False, allowed: frozenset[str] | None = LOCKED
) -> list[Finding]:
    return check_javascript(code, typescript=ts, allowed_imports=allowed, network=network)


def rules(code: str, *, ts: bool = False, allowed: frozenset[str] | None = None) -> set[str]:
    return {f.rule_id for f in findings(code, ts=ts, allowed=allowed)}


def test_ordinary_program_has_no_findings() -> None:
    assert findings(PROGRAM) == []


def test_ordinary_typescript_with_types_interfaces_and_generics_has_no_findings() -> None:
    assert findings(TS_PROGRAM, ts=True) == []


def test_check_dispatches_javascript_and_typescript() -> None:
    js = check('require("child_process")', "javascript", allowed_imports=None, network=False)
    ts = check("let x: number = 1;", "typescript", allowed_imports=None, network=False)
    assert [f.rule_id for f in js] == ["js.process"] and ts == []
    # The TypeScript grammar, not the JavaScript one, reads a TypeScript program.
    assert check("let x: number = 1;", "javascript", allowed_imports=None, network=False)


# -- each rule, with its severity and location -----------------------------------------------

CASES = [
    # code, rule, severity, line, column
    ("let x = 1;\nif (x {\n", "js.syntax", "deny", 2, 1),
    ('const a = 1;\nconst lib = require("left-pad");', "js.import", "warning", 2, 13),
    ('import x from "left-pad";', "js.import", "warning", 1, 1),
    ('const { execSync } = require("child_process");', "js.process", "warning", 1, 22),
    ('import { Worker } from "node:worker_threads";', "js.process", "warning", 1, 1),
    ('const cluster = await import("cluster");', "js.process", "warning", 1, 23),
    ('process.dlopen(module, "/tmp/x.node");', "js.native", "deny", 1, 1),
    ('const b = process.binding("spawn_sync");', "js.native", "deny", 1, 11),
    ('process._linkedBinding("x");', "js.native", "deny", 1, 1),
    ('const addon = require("./build/addon.node");', "js.native", "deny", 1, 15),
    ('import { WASI } from "wasi";', "js.native", "deny", 1, 1),
    ("eval(userCode);", "js.dynamic-code", "deny", 1, 1),
    ('eval("1 + 1");', "js.dynamic-code", "warning", 1, 1),
    ("const f = new Function(body);", "js.dynamic-code", "deny", 1, 11),
    ("setTimeout(code + '', 5);", "js.dynamic-code", "deny", 1, 1),
    ('({}).constructor.constructor("return process")();', "js.dynamic-code", "deny", 1, 1),
    ("const m = require(name);", "js.dynamic-code", "warning", 1, 11),
    ('const vm = require("vm");\nvm.runInNewContext(src);', "js.dynamic-code", "deny", 2, 1),
    ("const v = globalThis[key];", "js.reflection", "warning", 1, 11),
    ("const p = process[k];", "js.reflection", "warning", 1, 11),
    ('Reflect.get(globalThis, "process");', "js.reflection", "warning", 1, 1),
    ("const p = new Proxy(process, {});", "js.reflection", "warning", 1, 11),
    ('const net = require("net");', "js.network", "warning", 1, 13),
    ('const r = await fetch("https://example.com");', "js.network", "warning", 1, 17),
    ('const ws = new WebSocket("wss://example.com");', "js.network", "warning", 1, 16),
    ('export { request } from "node:https";', "js.network", "warning", 1, 1),
    ('const t = fs.readFileSync("/etc/passwd", "utf8");', "js.path", "warning", 1, 27),
    ('fs.writeFileSync("../../escape.txt", "x");', "js.path", "warning", 1, 18),
    ('import inspector from "node:inspector";', "js.inspector", "deny", 1, 1),
    ('const args = ["--inspect=0.0.0.0:9229"];', "js.inspector", "warning", 1, 15),
]


@pytest.mark.parametrize(("code", "rule", "severity", "line", "column"), CASES)
def test_rule_fires_with_severity_and_location(
    code: str, rule: str, severity: str, line: int, column: int
) -> None:
    hits = [f for f in findings(code) if f.rule_id == rule]
    assert hits, (code, findings(code))
    assert any((f.severity, f.line, f.column) == (severity, line, column) for f in hits), hits
    assert rule in RULES


def test_every_rule_id_is_described_and_exercised() -> None:
    js_rules = {r for r in RULES if r.startswith("js.")}
    assert js_rules == {c[1] for c in CASES}


def test_columns_count_characters_not_bytes() -> None:
    (f,) = findings('const café = "é"; eval(x);')
    assert (f.line, f.column) == (1, 19)


def test_typescript_runs_the_same_rules() -> None:
    code = 'import cp = require("child_process");\nconst b = (process as any).binding;\n'
    assert rules(code, ts=True) == {"js.process", "js.native"}


def test_type_only_imports_load_nothing() -> None:
    assert findings('import type { Foo } from "left-pad";\nlet f: Foo;', ts=True) == []


def test_network_modules_are_fine_with_a_network() -> None:
    code = 'const https = require("https");\nfetch("https://example.com");'
    assert [f.rule_id for f in findings(code, allowed=None, network=True)] == []


def test_relative_imports_and_safe_builtins_pass_an_allowlist() -> None:
    code = 'import { helper } from "./lib/helper.js";\nconst fsp = require("node:fs/promises");'
    assert findings(code, allowed=frozenset()) == []
    assert [f.rule_id for f in findings('require("lodash")', allowed=frozenset())] == ["js.import"]


def test_scoped_packages_are_allowed_by_their_scope_and_name() -> None:
    code = 'import { x } from "@scope/pkg/sub";'
    assert findings(code, allowed=frozenset({"@scope/pkg"})) == []
    assert [f.rule_id for f in findings(code, allowed=frozenset({"@scope/other"}))] == ["js.import"]


def test_code_in_eval_strings_is_checked_in_turn() -> None:
    hits = findings("eval(\"require('child_process').execSync('id')\");", allowed=None)
    assert {f.rule_id for f in hits} == {"js.dynamic-code", "js.process"}
    assert any(f.message.startswith("in the string given to eval()") for f in hits)


def test_deeply_nested_eval_is_denied() -> None:
    code = "1"
    for _ in range(6):
        code = f"eval({code!r})".replace("'", '"') if '"' not in code else f"eval('{code}')"
    assert any(f.severity == "deny" for f in findings(code, allowed=None))


def test_import_of_code_from_a_url_is_denied() -> None:
    for code in (
        'import("data:text/javascript,process.exit()")',
        'import("https://x.example/m.js")',
    ):
        (f,) = findings(code, allowed=None)
        assert (f.rule_id, f.severity) == ("js.dynamic-code", "deny")


def test_self_referencing_bindings_terminate() -> None:
    code = 'let a = a + "x";\nlet b = c; let c = b;\nrequire(a); b.binding("x");'
    assert "js.dynamic-code" in rules(code)


def test_long_programs_are_checked() -> None:
    body = "".join(f'const v{i} = "k{i}" + {i};\n' for i in range(3000))
    assert findings(body + 'require("child_" + "process");', allowed=None)[0].line == 3001


# -- the evasion twins of the Python checker's held-out tricks ---------------------------------

EVASIONS = [
    # code, a rule that must catch it
    ('require("child_" + "process").execSync("id")', "js.process"),
    ('const m = "process"; require(`child_${m}`).execSync("id")', "js.process"),
    ('require(["child", "process"].join("_")).execSync("id")', "js.process"),
    ('require("ssecorp_dlihc".split("").reverse().join(""))', "js.process"),
    ("require(String.fromCharCode(118, 109)).runInThisContext(s)", "js.dynamic-code"),
    ('const r = require; r("child_process").execSync("id")', "js.process"),
    ('const { execSync: e } = require("child_process"); e("id")', "js.process"),
    ('const cp = require; const m = cp("node:child_process");', "js.process"),
    ('globalThis["req" + "uire"]("child_process")', "js.process"),
    ('global[["re", "quire"].join("")]("net")', "js.network"),
    ("const m = await import(name);", "js.dynamic-code"),
    ('const m = await import("node:" + x);', "js.dynamic-code"),
    ('const { spawn } = await import("node:child_process");', "js.process"),
    ('const m = "child_process"; import(m).then((cp) => cp.exec("id"));', "js.process"),
    ('eval("req" + "uire(\'child_process\')")', "js.process"),
    ('eval(Buffer.from("cmVxdWlyZSgnY2hpbGRfcHJvY2VzcycpKQ==", "base64").toString())',
     "js.dynamic-code"),
    ('eval(atob("cmVxdWlyZSgnY2hpbGRfcHJvY2VzcycpKQ=="))', "js.dynamic-code"),
    ("(0, eval)(payload)", "js.dynamic-code"),
    ("const e = eval; e(payload)", "js.dynamic-code"),
    ("const run = eval.bind(null); run(payload)", "js.dynamic-code"),
    ('process["bind" + "ing"]("spawn_sync")', "js.native"),
    ('Reflect.get(process, "bin" + "ding")("spawn_sync")', "js.native"),
    ('const { binding: b } = process; b("fs")', "js.native"),
    ("process[key]('fs')", "js.reflection"),
    ('module.require("child_process")', "js.process"),
    ('process.mainModule.require("child_process")', "js.process"),
    ('require.call(null, "child_process")', "js.process"),
    ('require.apply(null, ["child_process"])', "js.process"),
    ('import { createRequire } from "node:module";\ncreateRequire(import.meta.url)("cluster")',
     "js.process"),
    ('const M = require("module"); M._load("child_process")', "js.process"),
    ('Object.getPrototypeOf(async () => {}).constructor("return process")()', "js.dynamic-code"),
    ('(() => {})["constr" + "uctor"]("return process")()', "js.dynamic-code"),
    ('Function("return this")().process.binding("fs")', "js.dynamic-code"),
    ('setTimeout("require(\'child_process\')", 0)', "js.process"),
    ('new (require("vm").Script)(code).runInThisContext()', "js.dynamic-code"),
    ("with (process) { binding('fs') }", "js.reflection"),
]  # fmt: skip


@pytest.mark.parametrize(("code", "rule"), EVASIONS)
def test_evasion_twin_is_caught(code: str, rule: str) -> None:
    found = findings(code, allowed=None)
    assert rule in {f.rule_id for f in found if f.severity != "info"}, found


# -- the gate ------------------------------------------------------------------------------------


def _with_node(name: str) -> Profile:
    profile = load_profile(name)
    languages = (*profile.runtime.languages, "javascript", "typescript")
    return replace(profile, runtime=replace(profile.runtime, languages=languages))


def test_gate_decides_a_javascript_program_as_its_python_twin() -> None:
    profile = _with_node("strict")
    py = gate.admit(RunRequest(code="import subprocess\nsubprocess.run(['id'])\n"), profile)
    js = gate.admit(
        RunRequest(
            code='const { execSync } = require("child_process");\nexecSync("id");\n',
            language="javascript",
        ),
        profile,
    )
    assert py.decision.verdict == js.decision.verdict != "allow"
    assert {f.rule_id for f in js.decision.findings} >= {"js.process", "js.import"}
    # The runtime's locked packages and Node's safe built-ins pass; a denied rule denies.
    clean = gate.admit(RunRequest(code=PROGRAM, language="javascript"), profile)
    assert clean.decision.verdict == "allow" and clean.decision.findings == ()
    native = gate.admit(
        RunRequest(code='process.binding("spawn_sync");', language="typescript"),
        profile,
    )
    assert native.decision.verdict == "deny"
