"""Rich outputs without a sandbox: ``run_cell`` in this process, and the host's validation of
what comes back (``collect_outputs``), fed with real outputs and with hostile ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

from sandcell.artifacts import ArtifactStore
from sandcell.backends.inside import _display
from sandcell.backends.inside._display import run_cell, user_traceback
from sandcell.cli.render import render_outputs
from sandcell.display import (
    DISPLAY_DIRNAME,
    DisplayLimits,
    collect_outputs,
    read_outputs,
    take_outputs,
)
from sandcell.spec import DisplayOutput

pd = pytest.importorskip("pandas")
mpl = pytest.importorskip("matplotlib")
mpl.use("Agg")
plt = pytest.importorskip("matplotlib.pyplot")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def manifests(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "store")


@pytest.fixture(autouse=True)
def _no_open_figures() -> None:
    plt.close("all")


# -- run_cell: values ------------------------------------------------------------------------


def test_last_expression_is_shown(out: Path) -> None:
    ns: dict[str, object] = {}
    assert run_cell("x = 6\nx * 7", ns, str(out)) == 1
    assert manifests(out) == [{"kind": "value", "data": {"text/plain": "42"}, "files": []}]
    assert ns["x"] == 6


@pytest.mark.parametrize(
    "source",
    ["x = 1", "None", "print('hi')", "42;", "42 ;  # hidden", "if True:\n    1", "def f(): pass"],
)
def test_nothing_shown(source: str, out: Path) -> None:
    assert run_cell(source, {}, str(out)) == 0
    assert not out.exists()


def test_semicolon_inside_a_comment_or_string_does_not_hide(out: Path) -> None:
    run_cell("'a;'  # ;", {}, str(out))
    assert manifests(out)[0]["data"]["text/plain"] == "'a;'"


def test_numbering_continues_from_seq_start(out: Path) -> None:
    ns: dict[str, object] = {}
    assert run_cell("1", ns, str(out), seq_start=7) == 8
    assert run_cell("2", ns, str(out), seq_start=8) == 9
    assert sorted(p.name for p in out.iterdir()) == ["0007.json", "0008.json"]


def test_huge_value_is_capped(out: Path) -> None:
    run_cell("'x' * (3 * 1024 * 1024)", {}, str(out))
    text = manifests(out)[0]["data"]["text/plain"]
    assert len(text.encode()) <= _display.MAX_TEXT_BYTES
    assert text.endswith("[truncated by sandcell]")


def test_failing_repr_is_reported_not_raised(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = "class Bad:\n    def __repr__(self):\n        raise RuntimeError('no')\nBad()"
    assert run_cell(src, {}, str(out)) == 0
    assert "cannot show the value: RuntimeError: no" in capsys.readouterr().err


def test_syntax_error_runs_nothing(out: Path) -> None:
    ns: dict[str, object] = {}
    with pytest.raises(SyntaxError) as info:
        run_cell("x = 1\n1 +", ns, str(out), filename="cell.py")
    assert info.value.filename == "cell.py"
    assert user_traceback(info.value.__traceback__) is None
    assert "x" not in ns


def test_exception_propagates_with_the_cells_frames(out: Path) -> None:
    with pytest.raises(ZeroDivisionError) as info:
        run_cell("def f():\n    return 1 / 0\nf()", {}, str(out), filename="cell.py")
    frames = traceback.extract_tb(user_traceback(info.value.__traceback__))
    assert [(f.filename, f.name) for f in frames] == [("cell.py", "<module>"), ("cell.py", "f")]


# -- run_cell: tables --------------------------------------------------------------------------


def test_dataframe_is_a_table(out: Path) -> None:
    run_cell("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})", {}, str(out))
    [m] = manifests(out)
    assert m["kind"] == "table" and m["files"] == []
    assert set(m["data"]) == {"text/plain", "text/html", "application/json"}
    assert m["data"]["text/plain"].splitlines()[:3] == ["   a  b", "0  1  x", "1  2  y"]
    assert "<table" in m["data"]["text/html"]
    doc = json.loads(m["data"]["application/json"])
    assert doc["data"] == [{"index": 0, "a": 1, "b": "x"}, {"index": 1, "a": 2, "b": "y"}]


def test_series_is_a_table(out: Path) -> None:
    run_cell("import pandas as pd\npd.Series([1.5, 2.5], name='v')", {}, str(out))
    [m] = manifests(out)
    assert m["kind"] == "table"
    assert "Name: v" in m["data"]["text/plain"]
    assert "<table" in m["data"]["text/html"]
    assert [r["v"] for r in json.loads(m["data"]["application/json"])["data"]] == [1.5, 2.5]


def test_multiindex_columns_fall_back_to_split_json(out: Path) -> None:
    src = (
        "import pandas as pd\n"
        "pd.DataFrame([[1, 2]], columns=pd.MultiIndex.from_tuples([('a', 'x'), ('a', 'y')]))"
    )
    run_cell(src, {}, str(out))
    doc = json.loads(manifests(out)[0]["data"]["application/json"])
    assert set(doc) == {"columns", "index", "data"}


def test_big_table_is_capped(out: Path) -> None:
    run_cell("import pandas as pd\npd.DataFrame({'a': range(100_000)})", {}, str(out))
    data = manifests(out)[0]["data"]
    assert len(data["text/plain"].splitlines()) < 70
    assert "[100000 rows x 1 columns]" in data["text/plain"]
    assert len(json.loads(data["application/json"])["data"]) == _display.JSON_ROWS[0]


# -- run_cell: figures -------------------------------------------------------------------------


def test_open_figure_is_saved_and_closed(out: Path) -> None:
    run_cell("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nx = 1", {}, str(out))
    [m] = manifests(out)
    assert m["kind"] == "figure"
    assert m["files"] == [
        {"name": "0000.png", "media_type": "image/png"},
        {"name": "0000.svg", "media_type": "image/svg+xml"},
    ]
    assert (out / "0000.png").read_bytes().startswith(PNG_MAGIC)
    assert b"<svg" in (out / "0000.svg").read_bytes()
    assert plt.get_fignums() == []


def test_value_then_two_figures(out: Path) -> None:
    src = "import matplotlib.pyplot as plt\nplt.figure(); plt.plot([1])\nplt.figure()\n'v'"
    assert run_cell(src, {}, str(out)) == 3
    assert [m["kind"] for m in manifests(out)] == ["value", "figure", "figure"]


def test_figure_as_value_is_shown_once(out: Path) -> None:
    run_cell("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nfig", {}, str(out))
    assert [m["kind"] for m in manifests(out)] == ["figure"]


def test_figure_is_kept_when_the_cell_fails(out: Path) -> None:
    with pytest.raises(ValueError, match="late"):
        run_cell(
            "import matplotlib.pyplot as plt\nplt.plot([1])\nraise ValueError('late')", {}, str(out)
        )
    assert [m["kind"] for m in manifests(out)] == ["figure"]
    assert plt.get_fignums() == []


def test_system_exit_propagates_after_the_figures(out: Path) -> None:
    with pytest.raises(SystemExit):
        run_cell("import sys, matplotlib.pyplot as plt\nplt.plot([1])\nsys.exit(3)", {}, str(out))
    assert [m["kind"] for m in manifests(out)] == ["figure"]


def test_output_count_is_capped(
    out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_display, "MAX_OUTPUTS", 2)
    src = "import matplotlib.pyplot as plt\nfor i in range(4):\n    plt.figure()\n'v'"
    assert run_cell(src, {}, str(out)) == 2
    assert [m["kind"] for m in manifests(out)] == ["value", "figure"]
    assert plt.get_fignums() == []
    assert "more than 2 outputs" in capsys.readouterr().err


def test_oversized_image_is_dropped(
    out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_display, "MAX_IMAGE_BYTES", 1000)
    run_cell("import matplotlib.pyplot as plt\nplt.plot([1, 2]);", {}, str(out))
    assert not out.exists()
    assert "over 1000 bytes; not kept" in capsys.readouterr().err


def test_matplotlib_and_pandas_are_never_imported_by_the_display(tmp_path: Path) -> None:
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('d', {_display.__file__!r})\n"
        "d = importlib.util.module_from_spec(spec); spec.loader.exec_module(d)\n"
        f"d.run_cell('x = [1]\\nx', {{}}, {str(tmp_path / 'o')!r})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'pandas')))"
    )
    r = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    )
    assert r.stdout.strip() == "[]"


def test_display_module_is_standalone() -> None:
    import ast

    tree = ast.parse(Path(_display.__file__).read_text())
    imported = {
        (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    assert not any(m.startswith("sandcell") for m in imported), imported


# -- collect_outputs: real outputs -------------------------------------------------------------


def test_round_trip(out: Path, store: ArtifactStore) -> None:
    ns: dict[str, object] = {}
    seq = run_cell("import pandas as pd\npd.DataFrame({'a': [1]})", ns, str(out))
    run_cell("import matplotlib.pyplot as plt\nplt.plot([1])\n7", ns, str(out), seq_start=seq)
    got = read_outputs(out, store)
    assert got.rejected == ()
    assert [o.kind for o in got.outputs] == ["table", "value", "figure"]
    fig = got.outputs[2]
    assert [(a.path, a.media_type) for a in fig.artifacts] == [
        ("display/0002.png", "image/png"),
        ("display/0002.svg", "image/svg+xml"),
    ]
    assert store.path_for(fig.artifacts[0].sha256).read_bytes().startswith(PNG_MAGIC)
    assert collect_outputs(out, store, first_seq=2) == (fig,)


def test_missing_directory_has_no_outputs(out: Path, store: ArtifactStore) -> None:
    assert collect_outputs(out, store) == ()


def test_take_outputs_removes_the_directory(tmp_path: Path, store: ArtifactStore) -> None:
    run_cell("1", {}, str(tmp_path / DISPLAY_DIRNAME))
    assert [o.kind for o in take_outputs(tmp_path, store).outputs] == ["value"]
    assert not (tmp_path / DISPLAY_DIRNAME).exists()


# -- collect_outputs: hostile directories ------------------------------------------------------


def write_manifest(out: Path, stem: str, doc: object) -> None:
    out.mkdir(exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(doc))


def figure_doc(stem: str, *types: str) -> dict[str, object]:
    ext = {"image/png": "png", "image/svg+xml": "svg"}
    files = [{"name": f"{stem}.{ext[t]}", "media_type": t} for t in types]
    return {"kind": "figure", "data": {"text/plain": "fig"}, "files": files}


def reasons(out: Path, store: ArtifactStore, **kw: Any) -> list[str]:
    got = read_outputs(out, store, **kw)
    assert got.outputs == ()
    return [f"{r.path}: {r.reason}" for r in got.rejected]


def test_manifest_pointing_at_a_host_file(out: Path, store: ArtifactStore) -> None:
    doc = {
        "kind": "figure",
        "data": {},
        "files": [{"name": "/etc/passwd", "media_type": "image/png"}],
    }
    write_manifest(out, "0000", doc)
    assert reasons(out, store) == [
        ".sandcell-display/0000.json: display output: the image/png file must be named 0000.png"
    ]


def test_symlinked_image(out: Path, store: ArtifactStore) -> None:
    write_manifest(out, "0000", figure_doc("0000", "image/png"))
    (out / "0000.png").symlink_to("/etc/passwd")
    assert "cannot be opened safely" in reasons(out, store)[0]


def test_symlinked_manifest_and_directory(tmp_path: Path, out: Path, store: ArtifactStore) -> None:
    out.mkdir()
    (out / "0000.json").symlink_to("/etc/passwd")
    assert "cannot be opened safely" in reasons(out, store)[0]
    link = tmp_path / "link"
    link.symlink_to(out)
    assert "output directory cannot be opened safely" in reasons(link, store)[0]


def test_huge_sparse_image_is_refused_unread(out: Path, store: ArtifactStore) -> None:
    write_manifest(out, "0000", figure_doc("0000", "image/png"))
    with open(out / "0000.png", "wb") as f:
        f.truncate(100 * 1024 * 1024)
    assert "over the cap" in reasons(out, store)[0]


def test_hard_link_and_fifo(out: Path, store: ArtifactStore) -> None:
    write_manifest(out, "0000", figure_doc("0000", "image/png"))
    (out / "0000.png").write_bytes(PNG_MAGIC)
    os.link(out / "0000.png", out / "extra")
    write_manifest(out, "0001", figure_doc("0001", "image/png"))
    os.mkfifo(out / "0001.png")
    got = reasons(out, store)
    assert any("0000.png has 2 hard links" in r for r in got)
    assert any("0001.png is not a regular file" in r for r in got)
    assert any("extra: display output: not a name" in r for r in got)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[" * 100_000, "not JSON"),
        (b'{"kind": "value", "data": {"text/plain": "x"}}', "exactly kind, data and files"),
        (b'{"kind": "evil", "data": {}, "files": []}', "unknown kind"),
        (b'{"kind": "value", "data": {"text/x-sh": "x"}, "files": []}', "data must map"),
        (b'{"kind": "value", "data": {"text/plain": 1}, "files": []}', "not text"),
        (b'{"kind": "value", "data": {"text/plain": "\\ud800"}, "files": []}', "valid Unicode"),
        (b'{"kind": "value", "data": {"text/html": "<b>"}, "files": []}', "needs a text/plain"),
        (
            b'{"kind": "table", "data": {"text/plain": "t", "application/json": "{"}, "files": []}',
            "application/json form is not JSON",
        ),
        (b'{"kind": "figure", "data": {}, "files": []}', "a figure without an image"),
        (
            b'{"kind": "figure", "data": {}, "files": '
            b'[{"name": "0000.exe", "media_type": "application/x-sh"}]}',
            "not an allowed image type",
        ),
    ],
)
def test_bad_manifests(out: Path, store: ArtifactStore, content: bytes, reason: str) -> None:
    out.mkdir()
    (out / "0000.json").write_bytes(content)
    [got] = reasons(out, store)
    assert reason in got


def test_text_over_the_cap(out: Path, store: ArtifactStore) -> None:
    write_manifest(out, "0000", {"kind": "value", "data": {"text/plain": "x" * 200}, "files": []})
    [got] = reasons(out, store, limits=DisplayLimits(max_text_bytes=100))
    assert "over 100 bytes" in got


@pytest.mark.parametrize(
    ("svg", "reason"),
    [
        (b"\xff<svg/>", "not UTF-8"),
        (b"<svg xmlns='http://www.w3.org/2000/svg'>", "not well-formed XML"),
        (b"<html/>", "not an SVG document"),
        (
            b'<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY a "aaaa">]>'
            b"<svg xmlns='http://www.w3.org/2000/svg'>&a;</svg>",
            "declares XML entities",
        ),
        (
            b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>",
            "contains a script element",
        ),
        (b"<svg xmlns='http://www.w3.org/2000/svg' onload='alert(1)'/>", "event handler"),
        (
            b"<svg xmlns='http://www.w3.org/2000/svg' xmlns:x='http://www.w3.org/1999/xlink'>"
            b"<a x:href=' java\tscript:alert(1)'/></svg>",
            "links to 'javascript:",
        ),
        (
            b"<svg xmlns='http://www.w3.org/2000/svg'><foreignObject/></svg>",
            "foreignobject element",
        ),
    ],
)
def test_bad_svg(out: Path, store: ArtifactStore, svg: bytes, reason: str) -> None:
    write_manifest(out, "0000", figure_doc("0000", "image/svg+xml"))
    (out / "0000.svg").write_bytes(svg)
    got = reasons(out, store)
    assert reason in got[0]
    assert got[1:] == [
        ".sandcell-display/0000.svg: display output: no valid manifest names this file"
    ]


def test_png_without_signature(out: Path, store: ArtifactStore) -> None:
    write_manifest(out, "0000", figure_doc("0000", "image/png"))
    (out / "0000.png").write_bytes(b"GIF89a")
    assert "no PNG signature" in reasons(out, store)[0]


def test_unreferenced_image_and_counts(out: Path, store: ArtifactStore) -> None:
    for i in range(3):
        write_manifest(
            out, f"{i:04d}", {"kind": "value", "data": {"text/plain": str(i)}, "files": []}
        )
    (out / "0009.png").write_bytes(PNG_MAGIC)
    got = read_outputs(out, store, limits=DisplayLimits(max_outputs=2))
    assert [o.data["text/plain"] for o in got.outputs] == ["0", "1"]
    assert sorted(r.reason for r in got.rejected) == [
        "display output: more than 2 outputs",
        "display output: no valid manifest names this file",
    ]


def test_total_cap(out: Path, store: ArtifactStore) -> None:
    for i in range(3):
        write_manifest(
            out, f"{i:04d}", {"kind": "value", "data": {"text/plain": "x" * 40}, "files": []}
        )
    got = read_outputs(out, store, limits=DisplayLimits(max_total_bytes=100))
    assert len(got.outputs) == 2
    assert "together are over 100 bytes" in got.rejected[0].reason


def test_many_refusals_are_summarised(out: Path, store: ArtifactStore) -> None:
    out.mkdir()
    for i in range(50):
        (out / f"junk{i}").write_text("")
    got = read_outputs(out, store)
    assert len(got.rejected) == 33
    assert got.rejected[-1].reason == "display output: 18 more refused"


# -- render_outputs ----------------------------------------------------------------------------


def test_render(tmp_path: Path, out: Path, store: ArtifactStore) -> None:
    ns: dict[str, object] = {}
    seq = run_cell("'\\x1b[31mred'", ns, str(out))
    seq = run_cell("import pandas as pd\npd.DataFrame({'a': [1, 2]})", ns, str(out), seq_start=seq)
    run_cell("import matplotlib.pyplot as plt\nplt.plot([1]);", ns, str(out), seq_start=seq)
    outputs = collect_outputs(out, store)
    dest = tmp_path / "figs"
    text = render_outputs(outputs, store, dest)
    assert text.splitlines() == [
        "Out[1]: '\\x1b[31mred'",
        "Out[2]:",
        "   a",
        "0  1",
        "1  2",
        "",
        "[2 rows x 1 columns]",
        "Out[3]: figure",
        f"  image/png: {dest}/display/0002.png",
        f"  image/svg+xml: {dest}/display/0002.svg",
    ]
    assert (dest / "display" / "0002.png").read_bytes().startswith(PNG_MAGIC)
    assert render_outputs((), store, dest) == ""
    assert (
        render_outputs((DisplayOutput(kind="value", data={"text/plain": "1"}),), store, dest)
        == "Out[1]: 1\n"
    )


def test_display_survives_an_approval_round_trip() -> None:
    from sandcell import RunRequest
    from sandcell.policy.approvals import request_from_dict, request_to_dict

    request = RunRequest(code="1", display=True)
    assert request_from_dict(request_to_dict(request)) == request
    stored_before_display = {k: v for k, v in request_to_dict(request).items() if k != "display"}
    assert request_from_dict(stored_before_display).display is False


# -- display() and plt.show() in order; a figure's chart data ---------------------------------

CHART = "application/vnd.sandcell.chart+json"


def test_display_and_show_are_outputs_in_the_order_they_were_called(
    out: Path, store: ArtifactStore
) -> None:
    src = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2]); plt.title('first'); plt.show()\n"
        "display('between', 2)\n"
        "plt.bar(['a'], [1]); plt.title('second'); plt.show()\n"
        "'last'"
    )
    assert run_cell(src, {}, str(out)) == 5
    got = read_outputs(out, store)
    assert got.rejected == ()
    titles = [json.loads(o.data[CHART])["title"] if CHART in o.data else None for o in got.outputs]
    assert titles == ["first", None, None, "second", None]
    assert [o.data["text/plain"] for o in got.outputs[1:3]] == ["'between'", "2"]
    assert [o.displayed for o in got.outputs] == [False, True, True, False, False]
    # Each show() closed its figure: the second plot did not draw into the first.
    assert len(json.loads(got.outputs[0].data[CHART])["elements"]) == 1
    assert plt.get_fignums() == []


def _chart(out: Path, store: ArtifactStore, src: str) -> dict[str, Any]:
    run_cell("import matplotlib.pyplot as plt\n" + src + "\npass", {}, str(out))
    got = read_outputs(out, store)
    assert got.rejected == ()
    [fig] = got.outputs
    chart: dict[str, Any] = json.loads(fig.data[CHART])
    return chart


def test_line_chart(out: Path, store: ArtifactStore) -> None:
    chart = _chart(
        out,
        store,
        "plt.plot([1, 2, 3], [3, 1, 2], label='sales')\nplt.title('Sales')\n"
        "plt.xlabel('Time (s)'); plt.ylabel('Amount [EUR]'); plt.yscale('log')",
    )
    assert chart["type"] == "line" and chart["title"] == "Sales"
    assert (chart["x_label"], chart["x_unit"], chart["y_unit"]) == ("Time (s)", "s", "EUR")
    assert (chart["x_scale"], chart["y_scale"]) == ("linear", "log")
    assert chart["elements"] == [{"label": "sales", "points": [[1.0, 3.0], [2.0, 1.0], [3.0, 2.0]]}]
    assert len(chart["x_ticks"]) == len(chart["x_tick_labels"]) > 0


def test_dates_and_categories_on_a_line_chart(out: Path, store: ArtifactStore) -> None:
    chart = _chart(
        out,
        store,
        "import datetime as dt\nplt.plot([dt.date(2024, 1, 1), dt.date(2024, 1, 2)], [1, 2])",
    )
    assert chart["x_scale"] == "datetime"
    assert chart["elements"][0]["points"][0][0].startswith("2024-01-01")
    plt.close("all")
    chart = _chart(out, store, "plt.plot(['mon', 'tue'], [1, float('nan')])")
    assert chart["x_scale"] == "categorical"
    # A gap (NaN) is no point; JSON has no NaN.
    assert chart["elements"][0]["points"] == [["mon", 1.0]]


def test_scatter_chart(out: Path, store: ArtifactStore) -> None:
    chart = _chart(out, store, "plt.scatter([1, 2], [3, 4], label='dots')")
    assert chart["type"] == "scatter"
    assert chart["elements"] == [{"label": "dots", "points": [[1.0, 3.0], [2.0, 4.0]]}]


def test_bar_chart(out: Path, store: ArtifactStore) -> None:
    chart = _chart(out, store, "plt.bar(['a', 'b'], [3, 5], label='2024')\nplt.title('Bars')")
    assert chart["type"] == "bar" and chart["title"] == "Bars"
    assert chart["elements"] == [
        {"label": "a", "group": "2024", "value": 3.0},
        {"label": "b", "group": "2024", "value": 5.0},
    ]


def test_pie_chart(out: Path, store: ArtifactStore) -> None:
    chart = _chart(out, store, "plt.pie([1, 3], labels=['x', 'y'])\nplt.title('Share')")
    assert chart == {
        "type": "pie",
        "title": "Share",
        "elements": [
            {"label": "x", "angle": 90.0, "radius": 1.0},
            {"label": "y", "angle": 270.0, "radius": 1.0},
        ],
    }


def test_box_and_whisker_chart(out: Path, store: ArtifactStore) -> None:
    chart = _chart(out, store, "plt.boxplot([[1, 2, 3, 4, 5, 40]])\nplt.ylabel('ms')")
    assert chart["type"] == "box_and_whisker" and chart["y_label"] == "ms"
    [box] = chart["elements"]
    assert (box["min"], box["median"], box["max"], box["outliers"]) == (1.0, 3.5, 5.0, [40.0])


def test_several_axes_are_a_superchart(out: Path, store: ArtifactStore) -> None:
    chart = _chart(
        out,
        store,
        "fig, (a, b) = plt.subplots(1, 2)\na.plot([1, 2])\nb.pie([1, 1])\nfig.suptitle('Both')",
    )
    assert chart["type"] == "superchart" and chart["title"] == "Both"
    assert [c["type"] for c in chart["elements"]] == ["line", "pie"]


def test_a_figure_that_is_no_chart_has_only_its_images(out: Path, store: ArtifactStore) -> None:
    run_cell("import matplotlib.pyplot as plt\nimage = plt.imshow([[1, 2], [3, 4]])", {}, str(out))
    [fig] = read_outputs(out, store).outputs
    assert CHART not in fig.data and fig.artifacts


def _forged(out: Path, chart: object, kind: str = "figure") -> None:
    out.mkdir()
    (out / "0000.png").write_bytes(PNG_MAGIC + b"rest")
    files = [{"name": "0000.png", "media_type": "image/png"}] if kind == "figure" else []
    data = {"text/plain": "f", CHART: chart if isinstance(chart, str) else json.dumps(chart)}
    manifest = {"kind": kind, "data": data, "files": files}
    (out / "0000.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("chart", "reason"),
    [
        ({"type": "pie", "title": None, "elements": [], "script": "x"}, "Extra inputs"),
        (
            '{"type": "pie", "title": null, "elements": [{"label": "a", "angle": NaN, '
            '"radius": 1}]}',
            "NaN",
        ),
        ({"type": "pie", "title": "t" * 5000, "elements": []}, "at most 1000 characters"),
        (
            {
                "type": "superchart",
                "title": None,
                "elements": [{"type": "superchart", "title": None, "elements": []}],
            },
            "does not match",
        ),
        (
            {
                "type": "bar",
                "title": None,
                "x_label": None,
                "y_label": None,
                "x_unit": None,
                "y_unit": None,
                "elements": [{"label": "a", "group": "g", "value": "1"}],
            },
            "valid number",
        ),
        (
            {
                "type": "pie",
                "title": None,
                "elements": [{"label": "a", "angle": 1, "radius": 1}] * 2000,
            },
            "at most 1024 items",
        ),
        ("[" * 100_000, "not a chart"),
    ],
)
def test_a_forged_chart_is_refused_and_the_figure_kept(
    out: Path, store: ArtifactStore, chart: object, reason: str
) -> None:
    _forged(out, chart)
    got = read_outputs(out, store)
    [fig] = got.outputs
    assert CHART not in fig.data and fig.artifacts
    [refused] = got.rejected
    assert "kept without its chart" in refused.reason and reason in refused.reason


def test_chart_data_only_on_a_figure(out: Path, store: ArtifactStore) -> None:
    _forged(out, {"type": "pie", "title": None, "elements": []}, kind="value")
    assert any("data must map" in r for r in reasons(out, store))


def test_a_valid_chart_is_stored_as_rewritten_by_the_host(out: Path, store: ArtifactStore) -> None:
    _forged(
        out,
        '{"type": "pie",   "title": null, "elements": [{"label": "a", "angle": 1, "radius": 1}]}',
    )
    [fig] = read_outputs(out, store).outputs
    assert fig.data[CHART] == (
        '{"type":"pie","title":null,"elements":[{"label":"a","angle":1.0,"radius":1.0}]}'
    )


@pytest.mark.parametrize("flag", [b"false", b"1", b'"yes"'])
def test_displayed_is_true_or_absent(out: Path, store: ArtifactStore, flag: bytes) -> None:
    out.mkdir()
    (out / "0000.json").write_bytes(
        b'{"kind": "value", "data": {"text/plain": "x"}, "files": [], "displayed": ' + flag + b"}"
    )
    assert any("displayed, when given, must be true" in r for r in reasons(out, store))


def test_the_host_holds_charts_to_the_caps_the_sandbox_reads_them_under() -> None:
    # Two copies by necessity (the display module is standalone inside the sandbox, and the
    # backends package imports the host side): this keeps them one value.
    from sandcell.display import chart as display_chart

    for name in ("CHART_TYPE", "MAX_CHART_ELEMENTS", "MAX_CHART_POINTS"):
        assert getattr(display_chart, name) == getattr(_display, name), name
