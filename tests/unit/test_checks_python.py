"""Python checks: each rule fires on its case and is quiet on ordinary analysis code; decide()."""

from __future__ import annotations

import ast
from collections.abc import Collection

import pytest

from sandcell.errors import ConfigError
from sandcell.policy.checks import (
    SAFE_STDLIB,
    Decision,
    Finding,
    check,
    check_python,
    decide,
)

ANALYSIS = '''\
"""Revenue by region, from the CSV in the inputs."""
from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

INPUT = Path("/inputs/sales.csv")
OUT = Path(os.environ.get("OUT", "out"))
OUT.mkdir(parents=True, exist_ok=True)

df = pd.read_csv(INPUT, parse_dates=["date"]).dropna(subset=["region"])
df["revenue"] = df["price"] * df["quantity"]
by_region = df.groupby("region")["revenue"].agg(["sum", "mean", "count"]).sort_values("sum")
print(by_region.to_string())
monthly = df.set_index("date").resample("ME")["revenue"].sum()
trend = np.polyfit(np.arange(len(monthly)), monthly.to_numpy(), 1)
words = Counter(w.lower() for w in " ".join(df["product"]).split())
fig, ax = plt.subplots(figsize=(8, 4))
monthly.plot(ax=ax, title="Monthly revenue")
fig.savefig(OUT / "monthly.png", dpi=120)
by_region.to_csv(os.path.join("out", "by_region.csv"))
pattern = __import__("re").compile(r"\\d+")
with open("/tmp/scratch.txt", "w") as fh:
    fh.write(repr(getattr(df, "shape")))
with open("result.json", "w") as fh:
    json.dump({"slope": float(trend[0]), "top": words.most_common(3)}, fh)
print(f"{len(df)} rows, {type(df).__name__}, {df.__class__.__name__}", file=sys.stderr)
'''
PACKAGES = ("pandas", "numpy", "matplotlib")


def findings(
    code: str, *, allowed: Collection[str] | None = PACKAGES, network: bool = False
) -> list[Finding]:
    return check_python(code, allowed_imports=allowed, network=network)


def rules(code: str, **kwargs: object) -> set[str]:
    return {f.rule_id for f in findings(code, **kwargs)}  # type: ignore[arg-type]


def only(code: str, rule: str, **kwargs: object) -> list[Finding]:
    return [f for f in findings(code, **kwargs) if f.rule_id == rule]  # type: ignore[arg-type]


def test_ordinary_analysis_script_has_no_findings() -> None:
    assert findings(ANALYSIS) == []


def test_check_dispatches_python() -> None:
    assert check("import socket", "python", allowed_imports=None, network=False)[0].rule_id == (
        "py.network"
    )


# -- py.syntax ---------------------------------------------------------------------------------


def test_syntax_error_is_a_deny_with_location() -> None:
    (f,) = findings("x = 1\ndef f(:\n    pass\n")
    assert (f.rule_id, f.severity, f.line) == ("py.syntax", "deny", 2)
    assert "does not parse" in f.message and f.snippet == "def f(:"


def test_null_byte_is_a_syntax_finding() -> None:
    assert rules("x = 1\x00") == {"py.syntax"}


# -- py.import -----------------------------------------------------------------------------------


def test_import_outside_allowlist() -> None:
    (f,) = only("import yaml", "py.import")
    assert f.severity == "warning" and "allowlist" in f.message and "yaml" in f.message


def test_import_allowlist_accepts_stdlib_and_listed_packages() -> None:
    code = "import json, os.path, statistics\nfrom collections import Counter\nimport yaml.nodes"
    assert rules(code, allowed=["yaml"]) == set()
    assert {"math", "json", "os", "re", "pathlib"} <= SAFE_STDLIB


def test_no_allowlist_allows_any_import() -> None:
    assert rules("import yaml, scipy.stats", allowed=None) == set()


def test_from_import_and_dynamic_import_are_checked_against_allowlist() -> None:
    assert only("from yaml import safe_load", "py.import")
    assert only('__import__("yaml")', "py.import")
    assert only('import importlib\nimportlib.import_module("yaml.nodes")', "py.import")


# -- py.process ----------------------------------------------------------------------------------


def test_subprocess_call_message_is_actionable() -> None:
    found = only("import subprocess\nsubprocess.run(['ls'])", "py.process", allowed=None)
    assert [f.line for f in found] == [1, 2]
    assert found[1].message.startswith("subprocess.run starts a process;")
    assert "profile that allows it" in found[1].message


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.system('id')",
        "import os as o\no.popen('id')",
        "from os import system as s\ns('id')",
        "from subprocess import *\ncheck_output(['id'])",
        "import os\nos.execvp('id', ['id'])",
        "import os\nos.spawnlp(os.P_WAIT, 'id', 'id')",
        "import os\nos.fork()",
        "import pty\npty.spawn('sh')",
        "import asyncio\nasyncio.create_subprocess_exec('id')",
    ],
)
def test_process_creation(code: str) -> None:
    assert "py.process" in rules(code, allowed=None)


def test_process_quiet_on_lookalikes() -> None:
    code = "import os, platform\nplatform.system()\nos.path.join('a', 'b')\nos.getcwd()"
    assert rules(code) == set()


# -- py.native -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code", ["import ctypes", "from cffi import FFI", "__import__('ctypes').CDLL(None)"]
)
def test_native_code_is_a_deny(code: str) -> None:
    (f,) = only(code, "py.native", allowed=None)
    assert f.severity == "deny"


def test_native_quiet_on_numpy() -> None:
    assert rules("import numpy as np\nnp.zeros(3).ctypes", allowed=None) == set()


# -- py.dynamic-code -----------------------------------------------------------------------------


def test_exec_of_computed_string_is_a_deny() -> None:
    (f,) = only("exec(open('x.py').read())", "py.dynamic-code")
    assert f.severity == "deny" and "computed string" in f.message


def test_exec_of_literal_is_a_warning_and_the_literal_is_checked() -> None:
    found = findings("exec('import subprocess')", allowed=None)
    assert ("py.dynamic-code", "warning") in {(f.rule_id, f.severity) for f in found}
    assert any(f.rule_id == "py.process" and "given to exec()" in f.message for f in found)


@pytest.mark.parametrize(
    "code",
    [
        "eval(user_input)",
        "compile(src, 'x', 'exec')",
        "f = eval",
        "__import__(name)",
        "import importlib\nimportlib.import_module(name)",
        "breakpoint()",
        "import runpy\nrunpy.run_path('x.py')",
        "import types\ntypes.CodeType",
    ],
)
def test_dynamic_code(code: str) -> None:
    assert "py.dynamic-code" in rules(code, allowed=None)


def test_dynamic_code_quiet_on_lookalikes() -> None:
    code = (
        "import re, importlib\nimport pandas as pd\nre.compile('a+')\n"
        "pd.DataFrame().eval('a + b')\nimportlib.import_module('json')"
    )
    assert rules(code) == set()


def test_string_built_import_is_flagged_and_resolved() -> None:
    found = findings('__import__("o" + "s").system("id")', allowed=None)
    assert {f.rule_id for f in found} == {"py.dynamic-code", "py.process"}
    assert any("'os'" in f.message for f in found if f.rule_id == "py.dynamic-code")


def test_unicode_identifiers_are_normalised_by_the_parser() -> None:
    # Python NFKC-normalises identifiers, so a fullwidth exec is exec; the checks see that.
    tree = ast.parse("ｅｘｅｃ(x)")
    call = tree.body[0].value  # type: ignore[attr-defined]
    assert call.func.id == "exec"
    assert only("ｅｘｅｃ(x)", "py.dynamic-code")[0].severity == "deny"


# -- py.reflection -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "import os\ngetattr(os, name)",
        "getattr(__builtins__, name)",
        "().__class__.__base__.__subclasses__()",
        "f.__globals__['x']",
        "import sys\nsys._getframe(1).f_globals",
        "globals()['x'] = 1",
        "globals().update(x=1)",
        "import os\nvars(os)",
        "import os\nos.__dict__",
        "import os\nsetattr(os, 'system', print)",
        "import math\nmath.pi = 3",
        "import sys\nsys.modules[name]",
        "getattr(obj, '__subclasses__')",
    ],
)
def test_reflection(code: str) -> None:
    assert "py.reflection" in rules(code, allowed=None)


def test_reflection_quiet_on_ordinary_getattr_and_vars() -> None:
    code = (
        "class A:\n    def f(self, name):\n        return getattr(self, name), vars(self)\n"
        "print(A().__class__.__name__, globals().get('A'), type(1).__name__)"
    )
    assert rules(code) == set()


# -- py.deserialize ------------------------------------------------------------------------------


def test_pickle_import_is_a_warning_and_loads_a_deny() -> None:
    found = only("import pickle\npickle.loads(data)", "py.deserialize", allowed=None)
    assert [(f.line, f.severity) for f in found] == [(1, "warning"), (2, "deny")]


@pytest.mark.parametrize(
    "code",
    [
        "import marshal\nmarshal.loads(b)",
        "import pandas as pd\npd.read_pickle('x.pkl')",
        "import numpy as np\nnp.load('x.npy', allow_pickle=True)",
        "import shelve\nshelve.open('db')",
        "from pickle import Unpickler",
    ],
)
def test_deserialize_denies(code: str) -> None:
    assert any(f.severity == "deny" for f in only(code, "py.deserialize", allowed=None))


def test_deserialize_quiet_on_json_and_plain_numpy() -> None:
    code = "import json\nimport numpy as np\njson.loads('{}')\nnp.load('x.npy')"
    assert rules(code) == set()


# -- py.network ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "import socket",
        "import urllib.request",
        "import urllib\nurllib.request.urlopen('x')",
        "import requests",
        "import pandas as pd\npd.read_csv('https://example.com/x.csv')",
    ],
)
def test_network_without_a_network(code: str) -> None:
    assert "py.network" in rules(code, allowed=None, network=False)
    assert "py.network" not in rules(code, allowed=None, network=True)


def test_network_quiet_on_url_parsing() -> None:
    code = "from urllib.parse import urlparse\nfrom http import HTTPStatus\nurlparse('https://x')"
    assert rules(code) == set()


# -- py.path -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "open('/etc/passwd')",
        "from pathlib import Path\nPath('/root/.ssh/id_rsa').read_text()",
        "import pandas as pd\npd.read_csv('/home/alice/data.csv')",
        "open('/home/user/../alice/x')",
        "open('../../etc/passwd')",
        "import os\nos.listdir('/')",
        "open('~/.netrc')",
        "open('/sandbox/../etc/shadow')",
        "import os\nopen(os.path.join('/proc', 'self', 'environ'))",
        "df.to_csv('/etc/cron.d/x')",
    ],
)
def test_paths_outside_roots(code: str) -> None:
    (f,) = only(code, "py.path", allowed=None)
    assert f.severity == "warning" and "/inputs" in f.message


def test_paths_inside_roots_are_quiet() -> None:
    code = (
        "open('/inputs/a.csv')\nopen('/sandbox/out/b.txt', 'w')\nopen('/tmp/c')\n"
        "open('data.csv')\nopen('/dev/null')\nprint('/etc/passwd')\n"
        # The workspace again (layout.SANDBOX_HOME), where E2B code reads and writes.
        "open('/home/user/data.csv')\nopen('/home/user/out/d.txt', 'w')"
    )
    assert rules(code, allowed=None) == set()


def test_readable_roots_are_configurable() -> None:
    code = "open('/data/a.csv')"
    assert only(code, "py.path", allowed=None)
    assert check_python(code, allowed_imports=None, network=False, readable_roots=["/data"]) == []


# -- locations -----------------------------------------------------------------------------------


def test_columns_are_one_based_characters() -> None:
    (f,) = only('s = "é€"; import os; os.system("x")', "py.process", allowed=None)
    assert (f.line, f.column) == (1, 22)
    assert f.snippet == 's = "é€"; import os; os.system("x")'


def test_finding_to_dict_and_long_snippets() -> None:
    (f,) = only("os_ = __import__('ctypes')  # " + "x" * 200, "py.native", allowed=None)
    assert len(f.snippet) == 120 and f.snippet.endswith("...")
    assert f.to_dict()["rule_id"] == "py.native"


# -- decide() ------------------------------------------------------------------------------------

WARN = Finding("py.process", "warning", 1, 1, "w", "")
DENY = Finding("py.native", "deny", 2, 1, "d", "")
INFO = Finding("sh.background", "info", 3, 1, "i", "")


@pytest.mark.parametrize(
    ("approval", "found", "verdict"),
    [
        ("never", [], "allow"),
        ("never", [INFO], "allow"),
        ("never", [WARN], "allow"),
        ("never", [WARN, DENY], "deny"),
        ("on_findings", [], "allow"),
        ("on_findings", [INFO], "allow"),
        ("on_findings", [WARN], "approve"),
        ("on_findings", [DENY], "deny"),
        ("always", [], "approve"),
        ("always", [WARN], "approve"),
        ("always", [DENY], "deny"),
    ],
)
def test_decide_every_approval_mode(approval: str, found: list[Finding], verdict: str) -> None:
    d = decide(found, approval=approval)  # type: ignore[arg-type]
    assert isinstance(d, Decision) and d.verdict == verdict
    assert d.findings == tuple(found) and d.reason


def test_decide_never_records_warnings() -> None:
    d = decide([WARN], approval="never")
    assert d.findings == (WARN,) and "py.process" in d.reason


def test_decide_deny_reason_names_rule_and_line() -> None:
    d = decide([WARN, DENY], approval="never")
    assert "py.native" in d.reason and "line 2" in d.reason


def test_decide_severity_overrides_and_disabled_rules() -> None:
    assert decide([WARN], approval="never", severity_overrides={"py.process": "deny"}).verdict == (
        "deny"
    )
    d = decide([DENY], approval="on_findings", severity_overrides={"py.native": "info"})
    assert d.verdict == "allow" and d.findings[0].severity == "info"
    d = decide([WARN, DENY], approval="on_findings", disabled=["py.native"])
    assert d.verdict == "approve" and d.findings == (WARN,)


def test_decide_rejects_unknown_modes() -> None:
    with pytest.raises(ConfigError):
        decide([], approval="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        decide([], approval="never", severity_overrides={"py.process": "fatal"})  # type: ignore[dict-item]
