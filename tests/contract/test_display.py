"""Rich outputs through the real sandbox: ``RunRequest(display=True)`` as root in-process, and
``sandcell run --display`` as an ordinary user (the rootless path reads the outputs through
``/proc/PID/root``). Values, tables and figures come back; whatever the program forges in the
output directory is refused with a reason, and nothing crashes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from tests.conftest import UnprivEnv, run_as_user, run_cli

from sandcell import Executor, IsolationMode, RunRequest, RunResult
from sandcell.spec import Outcome

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(params=["cold", "template", "pool"])
def executor(request: pytest.FixtureRequest, executor: Executor) -> Executor:
    """Every in-process case also with warm starts: rich outputs are served warm too."""
    if request.param == "cold":
        return executor
    warm: Executor = request.getfixturevalue(f"executor_{request.param}")
    return warm


def show(ex: Executor, code: str, **kw: object) -> RunResult:
    r = ex.run(RunRequest(code=code, display=True, **kw))  # type: ignore[arg-type]
    warm = getattr(ex.backend, "warm_stats", lambda: None)()
    if warm is not None and kw.get("language", "python") == "python":
        assert r.start.mode == warm.mode, r.enforcement
    return r


def test_last_expression_value(executor: Executor) -> None:
    r = show(executor, "import sys\nx = 6\nprint('out')\nx * 7")
    assert r.outcome is Outcome.OK, r.stderr
    assert r.stdout == "out\n"
    assert [(o.kind, dict(o.data)) for o in r.outputs] == [("value", {"text/plain": "42"})]
    record = executor.audit.get(r.run_id)
    assert record is not None and record.record["display"] is True
    assert record.record["outputs"] == [
        {"kind": "value", "data": {"text/plain": "42"}, "artifacts": []}
    ]


def test_python_script_semantics_hold(executor: Executor) -> None:
    code = (
        "import sys\n"
        "print(__name__, __file__, sys.argv, sys.modules['__main__'].__dict__ is globals())\n"
        "'shown'\n"
    )
    r = show(executor, code)
    assert r.stdout == "__main__ /sandcell/main.py ['/sandcell/main.py'] True\n"
    assert [o.data["text/plain"] for o in r.outputs] == ["'shown'"]
    r = show(executor, "import sys\nsys.exit(3)\n1")
    assert (r.outcome, r.exit_code, r.outputs) == (Outcome.ERROR, 3, ())


def test_dataframe_and_series_are_tables(executor: Executor) -> None:
    r = show(
        executor,
        "import pandas as pd\ndf = pd.DataFrame({'city': ['Oslo', 'Rome'], 'n': [3, 5]})\ndf\n",
    )
    assert r.outcome is Outcome.OK, r.stderr
    [table] = r.outputs
    assert table.kind == "table"
    assert table.data["text/plain"].splitlines()[:3] == [
        "   city  n",
        "0  Oslo  3",
        "1  Rome  5",
    ]
    assert "<td>Oslo</td>" in table.data["text/html"]
    rows = json.loads(table.data["application/json"])["data"]
    assert rows == [{"index": 0, "city": "Oslo", "n": 3}, {"index": 1, "city": "Rome", "n": 5}]

    r = show(executor, "import pandas as pd\npd.Series([1, 2], name='n').cumsum()")
    [series] = r.outputs
    assert series.kind == "table" and "Name: n" in series.data["text/plain"]
    assert [row["n"] for row in json.loads(series.data["application/json"])["data"]] == [1, 3]


def test_figures_come_back_without_savefig(executor: Executor) -> None:
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 3, 2])\n"
        "plt.figure()\n"
        "plt.bar(['a', 'b'], [2, 1])\n"
        "plt.title('second');\n"
    )
    r = show(executor, code, exports=("**",))
    assert r.outcome is Outcome.OK, r.stderr
    assert [o.kind for o in r.outputs] == ["figure", "figure"]
    for n, fig in enumerate(r.outputs):
        assert [(a.path, a.media_type) for a in fig.artifacts] == [
            (f"display/{n:04d}.png", "image/png"),
            (f"display/{n:04d}.svg", "image/svg+xml"),
        ]
        png, svg = (executor.store.path_for(a.sha256).read_bytes() for a in fig.artifacts)
        assert png.startswith(PNG_MAGIC)
        assert b"<svg" in svg
    # The output directory is not a file of the program: not exported, even by "**".
    assert r.artifacts == () and r.rejected_exports == ()


def test_plt_show_shows_quietly(executor: Executor) -> None:
    code = (
        "import sys\n"
        "print('re' in sys.modules)  # the display costs no regex import before matplotlib\n"
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1])\n"
        "plt.show()\n"
    )
    r = show(executor, code)
    # A warm start's template preloaded pandas, which imported re before the program ran.
    imported = "False\n" if r.start.mode == "cold" else "True\n"
    assert (r.outcome, r.stdout, r.stderr) == (Outcome.OK, imported, ""), r.stderr
    assert [o.kind for o in r.outputs] == ["figure"]


def test_trailing_semicolon_hides_the_value(executor: Executor) -> None:
    r = show(executor, "x = 5\nx * 2;")
    assert r.outcome is Outcome.OK and r.outputs == ()


def test_exception_after_a_figure(executor: Executor) -> None:
    r = show(executor, "import matplotlib.pyplot as plt\nplt.plot([1])\nx = 1\n1 / 0\n")
    assert (r.outcome, r.exit_code) == (Outcome.ERROR, 1)
    assert [o.kind for o in r.outputs] == ["figure"]
    assert r.stderr == (
        "Traceback (most recent call last):\n"
        '  File "/sandcell/main.py", line 4, in <module>\n'
        "    1 / 0\n"
        "    ~~^~~\n"
        "ZeroDivisionError: division by zero\n"
    )
    r = show(executor, "1 +")
    assert r.outcome is Outcome.ERROR and r.outputs == ()
    assert r.stderr.startswith('  File "/sandcell/main.py", line 1\n')
    assert r.stderr.endswith("SyntaxError: invalid syntax\n")


def test_display_false_is_unchanged(executor: Executor) -> None:
    code = "import os, matplotlib.pyplot as plt\nplt.plot([1])\nprint(os.listdir('.'))\n42\n"
    r = executor.run(RunRequest(code=code, exports=("**",)))
    assert r.outcome is Outcome.OK, r.stderr
    assert (r.stdout, r.outputs, r.artifacts) == ("[]\n", (), ())
    record = executor.audit.get(r.run_id)
    assert record is not None and record.record["display"] is False


def test_bash_has_no_outputs(executor: Executor) -> None:
    r = executor.run(RunRequest(code="echo hi", language="bash", display=True))
    assert (r.outcome, r.stdout, r.outputs) == (Outcome.OK, "hi\n", ())


def test_strict_profile_allows_display(executor: Executor) -> None:
    code = "import pandas as pd\npd.DataFrame({'a': [1]}).describe()"
    r = executor.run(RunRequest(code=code, display=True), profile="strict")
    assert r.outcome is Outcome.OK, (r.reason, r.stderr)
    assert [o.kind for o in r.outputs] == ["table"]


FORGER = r"""
import json, os
d = "/sandbox/.sandcell-display"
os.makedirs(d, exist_ok=True)
def manifest(stem, doc):
    with open(f"{d}/{stem}.json", "w") as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))
def fig(stem, name=None):
    files = [{"name": name or f"{stem}.png", "media_type": "image/png"}]
    return {"kind": "figure", "data": {}, "files": files}
manifest("0100", fig("0100", "/etc/passwd"))
manifest("0101", fig("0101")); os.symlink("/etc/passwd", f"{d}/0101.png")
manifest("0102", fig("0102"))
with open(f"{d}/0102.png", "wb") as f:
    f.write(b"\x89PNG\r\n\x1a\n"); f.truncate(100 * 1024 * 1024)
manifest("0103", "{not json")
os.symlink("/etc/shadow", f"{d}/0104.json")
manifest("0105", {"kind": "value", "data": {"text/plain": "forged but well-formed"}, "files": []})
"the real value"
"""


def test_forged_outputs_are_refused(executor: Executor) -> None:
    r = show(executor, FORGER)
    assert r.outcome is Outcome.OK, r.stderr
    # The forged manifest that is well-formed is only text; the cell's own value comes first.
    assert [o.data["text/plain"] for o in r.outputs] == [
        "'the real value'",
        "forged but well-formed",
    ]
    reasons = {rej.path.rpartition("/")[2]: rej.reason for rej in r.rejected_exports}
    assert "must be named 0100.png" in reasons["0100.json"]
    assert "cannot be opened safely" in reasons["0101.json"]
    assert "over the cap" in reasons["0102.json"]
    assert "not JSON" in reasons["0103.json"]
    assert "cannot be opened safely" in reasons["0104.json"]
    assert all(a.path.startswith("display/") for o in r.outputs for a in o.artifacts)


def test_output_directory_swapped_for_a_symlink(executor: Executor) -> None:
    code = "import os\nos.symlink('/tmp', '/sandbox/.sandcell-display')\n'value'"
    r = show(executor, code)
    assert r.outcome is Outcome.OK, r.stderr
    assert r.outputs == ()
    [rejected] = r.rejected_exports
    assert rejected.path == ".sandcell-display"
    assert "the output directory cannot be opened safely" in rejected.reason


# -- as an ordinary user, through the CLI --------------------------------------------------------


def _user_args(env: UnprivEnv) -> list[str]:
    return ["--isolation=rlimits"] if env.mode is IsolationMode.RLIMITS else []


def test_cli_display_as_user(unpriv: UnprivEnv, tmp_path: Path) -> None:
    code = (
        "import pandas as pd, matplotlib.pyplot as plt\n"
        "plt.plot([1, 2])\n"
        "pd.DataFrame({'a': [1, 2]})\n"
    )
    base = ["run", *_user_args(unpriv), "--profile", "unchecked", "--display", "-c", code]
    r = run_as_user(unpriv, [*base[:1], "--json", *base[1:]])
    assert r.returncode == 0, r.stderr.decode()
    body = json.loads(r.stdout)
    assert [o["kind"] for o in body["outputs"]] == ["table", "figure"]
    assert [a["media_type"] for a in body["outputs"][1]["artifacts"]] == [
        "image/png",
        "image/svg+xml",
    ]

    out = Path(f"/tmp/sandcell-display-out-{os.getpid()}")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(mode=0o755)
    shutil.chown(out, unpriv.user, unpriv.user)
    try:
        r = run_as_user(unpriv, [*base, "--out", str(out)])
        assert r.returncode == 0, r.stderr.decode()
        lines = r.stdout.decode().splitlines()
        assert lines[:4] == ["Out[1]:", "   a", "0  1", "1  2"]
        assert lines[-3:] == [
            "Out[2]: figure",
            f"  image/png: {out}/display/0001.png",
            f"  image/svg+xml: {out}/display/0001.svg",
        ]
        assert (out / "display" / "0001.png").read_bytes().startswith(PNG_MAGIC)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_cli_display_refuses_bash(tmp_path: Path) -> None:
    from sandcell.cli import main

    home = tmp_path / "home"
    home.mkdir()
    assert main(["--home", str(home), "run", "--display", "--lang", "bash", "-c", "echo"]) != 0


def test_rejections_reach_the_cli_json(tmp_path: Path) -> None:
    env = {**os.environ, "SANDCELL_HOME": str(tmp_path / "home")}
    code = "import os\nos.makedirs('.sandcell-display')\nopen('.sandcell-display/x', 'w')\n1"
    r = run_cli(["run", "--json", "--display", "-c", code], env=env)
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert [o["data"] for o in body["outputs"]] == [{"text/plain": "1"}]
    assert body["rejected_exports"] == [
        {
            "path": ".sandcell-display/x",
            "reason": "display output: not a name the display module writes",
        }
    ]
