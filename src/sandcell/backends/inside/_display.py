"""sandcell display: run one cell of Python as a notebook would, and write its rich outputs.

:func:`run_cell` executes a cell in a namespace, shows the value of a last expression as IPython
does (``None`` is not shown, a trailing ``;`` hides it), and captures what a notebook would
display: the value (``text/plain``), a pandas DataFrame or Series as a table (``text/plain``,
``text/html``, ``application/json``), and every open matplotlib figure as PNG and SVG, closed once
saved. Each output is written to ``out_dir`` as ``NNNN.json`` (``{kind, data, files}``) next to
its image files ``NNNN.png`` / ``NNNN.svg``; the manifest is written last, so a manifest names
only files that were complete. The host reads them with :func:`sandcell.display.collect_outputs`.

This file is standalone on purpose: like the boot, it is compiled on the host and shipped into
the sandbox (``/sandcell/display.pyc``), so it must not import sandcell. It never imports pandas
or matplotlib itself: a table is recognised only when the cell imported pandas, figures are
looked for only when the cell imported ``matplotlib.pyplot`` (whose backend the sandbox forces to
Agg through ``MPLBACKEND``).

Every output is capped (:data:`MAX_TEXT_BYTES` per text form, :data:`MAX_IMAGE_BYTES` per image,
:data:`MAX_OUTPUTS` per cell); what goes over is dropped with a ``sandcell-display:`` line on
stderr. Exceptions of the cell propagate unchanged, after the outputs produced so far (the open
figures) are written; :func:`user_traceback` drops this module's frames for the report.

A cell may show outputs as it goes, in the order a notebook shows them: ``display(obj)`` (a
builtin, as in IPython) writes ``obj`` at once, marked ``"displayed": true`` (it is not the cell's
value), and ``plt.show()`` writes and closes the figures open at that moment (pyplot's ``show``
is wrapped when pyplot is imported). A figure's manifest also carries its chart's data
(``application/vnd.sandcell.chart+json``: line, scatter, bar, pie, box and whisker, or several
axes as a ``superchart``; the shapes of E2B's ``Result.chart``), read from the drawn figure.
``_sandcell_shell(program)`` (a builtin) runs a shell escape (``!cmd`` translated, see
:mod:`sandcell.e2b.ipython`) with ``/bin/bash -c``; the host's gate checks the program before
the cell runs.

Security limitations: this code runs inside the sandbox, next to the untrusted program, which can
replace it, bypass it or write any file it likes into ``out_dir``. Nothing here is a control: the
host validates everything it reads back, charts included.
"""

from __future__ import annotations

# _ast, not ast: the same node classes without ast.py's imports (enum, contextlib: ~10 ms).
import _ast
import io
import os
import sys
import warnings

try:
    from _json import encode_basestring_ascii as encode_string
except ImportError:  # another implementation: the pure-Python one
    from json.encoder import py_encode_basestring_ascii as encode_string

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any

MAX_TEXT_BYTES = 1024 * 1024
"""Largest text form of one output (UTF-8 bytes); longer text is cut and marked."""
MAX_IMAGE_BYTES = 8 * 1024 * 1024
"""Largest image; a figure whose PNG or SVG is larger loses that form."""
MAX_OUTPUTS = 64
"""Outputs one cell may produce; later ones are dropped (figures are still closed)."""
TABLE_ROWS = 60
"""Rows (and, for wide frames, ``TABLE_COLS`` columns) shown in the text and HTML forms."""
TABLE_COLS = 20
JSON_ROWS = (1000, 100, 10)
"""Rows tried for the JSON form of a table, largest first, until it fits the text cap."""

_TRUNCATED = "\n... [truncated by sandcell]"
_PNG = "image/png"
_SVG = "image/svg+xml"
CHART_TYPE = "application/vnd.sandcell.chart+json"
"""The text form of a figure that carries its chart's data."""
MAX_CHART_ELEMENTS = 1024
"""Series, bars, wedges or boxes in one chart (or axes in a superchart); more: no chart."""
MAX_CHART_POINTS = 100_000
"""Points of one series; more: no chart (a chart never holds part of the data)."""


class _State:
    writer: _Writer | None = None
    """The running cell's writer, for ``display()`` and ``plt.show()``."""


class _TooLarge(Exception):
    """Raised by :class:`_CappedBuffer` to stop a renderer that writes past the cap."""


class _CappedBuffer(io.BytesIO):
    # Stops savefig as soon as an image goes over the cap, so a huge SVG is never held whole.
    def write(self, data: object) -> int:
        n = super().write(data)  # type: ignore[arg-type]
        if self.tell() > MAX_IMAGE_BYTES:
            raise _TooLarge
        return n


def _warn(message: str) -> None:
    # Not contextlib.suppress: contextlib is one more import on every cell for one line.
    try:  # noqa: SIM105
        sys.stderr.write(f"sandcell-display: {message}\n")
    except Exception:  # noqa: S110 - a closed or broken stderr must not fail the cell
        pass


def _cap(text: str) -> str:
    """``text`` cut to :data:`MAX_TEXT_BYTES` UTF-8 bytes, marked when cut."""
    data = text.encode("utf-8", "replace")
    if len(data) <= MAX_TEXT_BYTES:
        return text
    keep = MAX_TEXT_BYTES - len(_TRUNCATED.encode())
    return data[:keep].decode("utf-8", "ignore") + _TRUNCATED


def _suppressed(source: str, last: _ast.expr) -> bool:
    """Whether the last expression is followed by ``;`` (IPython's "do not show")."""
    end_line, end_col = last.end_lineno, last.end_col_offset
    if end_line is None or end_col is None:
        return False
    # The tokenizer's line ends only (str.splitlines also splits at \f, \x1c, U+2028...).
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if end_line > len(lines):
        return False
    # Column offsets count UTF-8 bytes.
    rest = lines[end_line - 1].encode("utf-8", "surrogatepass")[end_col:]
    return rest.decode("utf-8", "replace").lstrip().startswith(";")


class _Writer:
    """Writes numbered outputs into ``out_dir``, creating it on the first one."""

    def __init__(self, out_dir: str, seq: int) -> None:
        self.out_dir = out_dir
        self.seq = seq
        self.written = 0
        self.shown: set[int] = set()
        """ids of figures already written (a figure that is also the cell's value)."""

    @property
    def full(self) -> bool:
        return self.written >= MAX_OUTPUTS

    def _write_file(self, name: str, data: bytes) -> None:
        path = os.path.join(self.out_dir, name)
        # O_NOFOLLOW: a name planted as a symlink is refused rather than written through.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def emit(
        self,
        kind: str,
        data: dict[str, str],
        images: list[tuple[str, bytes]],
        *,
        displayed: bool = False,
    ) -> None:
        """Write one output: its image files, then its manifest."""
        if self.full:
            _warn(f"more than {MAX_OUTPUTS} outputs in one cell; a {kind} was dropped")
            return
        stem = f"{self.seq:04d}"
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            files = []
            for media_type, blob in images:
                name = f"{stem}.{'png' if media_type == _PNG else 'svg'}"
                self._write_file(name, blob)
                files.append({"name": name, "media_type": media_type})
            manifest: dict[str, object] = {"kind": kind, "data": data, "files": files}
            if displayed:
                manifest["displayed"] = True
            self._write_file(f"{stem}.json", _to_json(manifest).encode("utf-8"))
        except OSError as exc:
            _warn(f"cannot write a {kind} to {self.out_dir}: {exc}")
            return
        self.seq += 1
        self.written += 1

    # -- what is shown ---------------------------------------------------------------------

    def value(self, value: object, *, displayed: bool = False) -> None:
        if value is None:
            return
        try:
            if _is_figure(value):
                self.figure(value, displayed=displayed)
                return
            table = _table_data(value)
            if table is not None:
                self.emit("table", table, [], displayed=displayed)
                return
            text = repr(value)
        except Exception as exc:
            _warn(f"cannot show the value: {type(exc).__name__}: {exc}")
            return
        self.emit("value", {"text/plain": _cap(text)}, [], displayed=displayed)

    def figure(self, fig: object, *, displayed: bool = False) -> None:
        self.shown.add(id(fig))
        if self.full:
            _warn(f"more than {MAX_OUTPUTS} outputs in one cell; a figure was dropped")
            return
        images: list[tuple[str, bytes]] = []
        for media_type, fmt in ((_PNG, "png"), (_SVG, "svg")):
            buf = _CappedBuffer()
            try:
                # bbox tight as notebooks show figures; no date, so the same figure gives
                # the same bytes.
                fig.savefig(  # type: ignore[attr-defined]
                    buf,
                    format=fmt,
                    bbox_inches="tight",
                    metadata={"Date": None} if fmt == "svg" else None,
                )
            except _TooLarge:
                _warn(f"a figure's {fmt.upper()} is over {MAX_IMAGE_BYTES} bytes; not kept")
                continue
            except Exception as exc:
                _warn(f"cannot save a figure as {fmt.upper()}: {type(exc).__name__}: {exc}")
                continue
            images.append((media_type, buf.getvalue()))
        try:
            text = repr(fig)
        except Exception:
            text = "<Figure>"
        data = {"text/plain": _cap(text)}
        chart = _chart_text(fig) if images else None
        if chart is not None:
            data[CHART_TYPE] = chart
        if images:
            self.emit("figure", data, images, displayed=displayed)

    def open_figures(self) -> None:
        """Write, then close, every figure pyplot still has open."""
        plt = sys.modules.get("matplotlib.pyplot")
        helpers = sys.modules.get("matplotlib._pylab_helpers")
        if plt is None or helpers is None:
            return  # the cell never used pyplot: nothing to look for, nothing imported
        try:
            figures = [m.canvas.figure for m in helpers.Gcf.get_all_fig_managers()]
        except Exception as exc:
            _warn(f"cannot list the open figures: {type(exc).__name__}: {exc}")
            return
        for fig in figures:
            if id(fig) not in self.shown:
                self.figure(fig)
            try:
                plt.close(fig)
            except Exception as exc:
                _warn(f"cannot close a figure: {type(exc).__name__}: {exc}")


def _to_json(value: object) -> str:
    """JSON text of a manifest (dicts, lists and strings), without importing json (and re)."""
    if isinstance(value, str):
        return str(encode_string(value))
    if isinstance(value, dict):
        items = (f"{_to_json(k)}: {_to_json(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_to_json(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and _finite(value) is not None:
        return repr(value)
    raise TypeError(f"not in a manifest: {type(value).__name__} {value!r:.40}")


def _is_figure(value: object) -> bool:
    mpl_figure = sys.modules.get("matplotlib.figure")
    figure_type = getattr(mpl_figure, "Figure", None) if mpl_figure is not None else None
    return isinstance(figure_type, type) and isinstance(value, figure_type)


def _table_data(value: Any) -> dict[str, str] | None:
    """The table forms of a DataFrame or Series; None for anything else."""
    pd = sys.modules.get("pandas")
    frame_type = getattr(pd, "DataFrame", None)
    series_type = getattr(pd, "Series", None)
    if not (isinstance(frame_type, type) and isinstance(series_type, type)):
        return None
    table: Any = value  # isinstance against a runtime type narrows to object: keep it Any
    if isinstance(value, series_type):
        frame = table.to_frame()
        text = table.to_string(max_rows=TABLE_ROWS, length=True, dtype=True, name=True)
    elif isinstance(value, frame_type):
        frame = table
        text = table.to_string(max_rows=TABLE_ROWS, max_cols=TABLE_COLS, show_dimensions=True)
    else:
        return None
    data = {"text/plain": _cap(text)}
    html = frame.to_html(max_rows=TABLE_ROWS, max_cols=TABLE_COLS, show_dimensions=True)
    data["text/html"] = _cap(html)
    json_text = _table_json(table)
    if json_text is not None:
        data["application/json"] = json_text
    return data


def _table_json(value: Any) -> str | None:
    """The first rows as JSON (``orient="table"``, else ``"split"``), within the text cap."""
    for rows in JSON_ROWS:
        head = value.head(rows)
        try:
            text = head.to_json(orient="table", default_handler=str)
        except Exception:  # MultiIndex columns, duplicate names: table schema cannot say them
            try:
                text = head.to_json(orient="split", date_format="iso", default_handler=str)
            except Exception as exc:
                _warn(f"cannot turn a table into JSON: {type(exc).__name__}: {exc}")
                return None
        if len(text.encode("utf-8")) <= MAX_TEXT_BYTES:
            return str(text)
    _warn("a table's JSON form is over the size cap even for 10 rows; not kept")
    return None


# -- charts: a figure's data, in the shapes of E2B's Result.chart -------------------------------


class _NoChart(Exception):
    """The figure is no chart this module reads (or is too large to carry whole)."""


def _finite(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    # NaN is the one number unequal to itself.
    return f if f - f == 0.0 else None


def _unit(label: str) -> str | None:
    """The unit a label names at its end: ``Time (s)`` or ``Price [EUR]``."""
    text = label.rstrip()
    for open_, close in (("(", ")"), ("[", "]")):
        if text.endswith(close) and open_ in text:
            unit = text[text.rindex(open_) + 1 : -1].strip()
            return unit or None
    return None


def _scale(ax: Any, axis: str) -> str:
    the_axis = ax.xaxis if axis == "x" else ax.yaxis
    dates = sys.modules.get("matplotlib.dates")
    category = sys.modules.get("matplotlib.category")
    units = getattr(the_axis, "units", None)
    # get_converter since Matplotlib 3.10, whose converter attribute warns.
    getter = getattr(the_axis, "get_converter", None)
    converter = getter() if callable(getter) else getattr(the_axis, "converter", None)
    if dates is not None and isinstance(converter, getattr(dates, "DateConverter", ())):
        return "datetime"
    if dates is not None and isinstance(converter, getattr(dates, "_SwitchableDateConverter", ())):
        return "datetime"
    if category is not None and isinstance(units, getattr(category, "UnitData", ())):
        return "categorical"
    scale = ax.get_xscale() if axis == "x" else ax.get_yscale()
    return str(scale)


def _coordinate(value: Any, scale: str) -> float | str | None:
    """One coordinate as JSON: a number, an ISO date, or a category's text."""
    if scale == "datetime":
        if isinstance(value, int | float):
            dates = sys.modules.get("matplotlib.dates")
            return dates.num2date(value).isoformat() if dates is not None else None
        iso = getattr(value, "isoformat", None)
        if callable(iso):
            return str(iso())
        return str(value)[:64]
    if isinstance(value, str):
        return value[:1000]
    return _finite(value)


def _points(xs: Any, ys: Any, x_scale: str, y_scale: str) -> list[list[float | str]]:
    xs, ys = list(xs), list(ys)
    if len(xs) > MAX_CHART_POINTS:
        raise _NoChart(f"a series has more than {MAX_CHART_POINTS} points")
    points: list[list[float | str]] = []
    for x, y in zip(xs, ys, strict=False):
        px, py = _coordinate(x, x_scale), _coordinate(y, y_scale)
        if px is not None and py is not None:  # a gap (NaN) is no point
            points.append([px, py])
    return points


def _texts(labels: Any) -> list[str]:
    return [str(t.get_text())[:1000] for t in labels]


def _axes_2d(ax: Any) -> dict[str, Any]:
    x_label, y_label = str(ax.get_xlabel()), str(ax.get_ylabel())
    return {
        "title": str(ax.get_title()) or None,
        "x_label": x_label or None,
        "y_label": y_label or None,
        "x_unit": _unit(x_label),
        "y_unit": _unit(y_label),
    }


def _ticks(ax: Any, axis: str, scale: str) -> dict[str, Any]:
    ticks = ax.get_xticks() if axis == "x" else ax.get_yticks()
    labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    texts = _texts(labels)
    if scale == "categorical":
        values: list[Any] = list(texts)
    else:
        values = [v for v in (_coordinate(t, scale) for t in ticks) if v is not None]
    return {f"{axis}_ticks": values, f"{axis}_tick_labels": texts, f"{axis}_scale": scale}


def _bar_chart(ax: Any, bars: list[Any]) -> dict[str, Any]:
    tick_at: dict[float, str] = {}
    for pos, text in zip(ax.get_xticks(), _texts(ax.get_xticklabels()), strict=False):
        f = _finite(pos)
        if f is not None:
            tick_at[round(f, 6)] = text
    elements = []
    for container in bars:
        group = str(container.get_label())
        horizontal = getattr(container, "orientation", "vertical") == "horizontal"
        for rect in container.patches:
            if horizontal:
                where, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
            else:
                where, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
            label = tick_at.get(round(float(where), 6), f"{float(where):g}")
            v = _finite(value)
            if v is not None:
                elements.append({"label": label, "group": group, "value": v})
    return {"type": "bar", **_axes_2d(ax), "elements": elements}


def _box_chart(ax: Any, stats: list[dict[str, Any]]) -> dict[str, Any]:
    texts = _texts(ax.get_xticklabels())
    elements = []
    for i, box in enumerate(stats):
        label = box.get("label")
        if label is None:
            label = texts[i] if i < len(texts) and texts[i] else str(i + 1)
        numbers = [_finite(box.get(k)) for k in ("whislo", "q1", "med", "q3", "whishi")]
        if any(n is None for n in numbers):
            continue
        fliers = [f for f in (_finite(v) for v in list(box.get("fliers", []))) if f is not None]
        if len(fliers) > MAX_CHART_POINTS:
            raise _NoChart(f"a box has more than {MAX_CHART_POINTS} outliers")
        low, q1, med, q3, high = numbers
        elements.append(
            {
                "label": str(label)[:1000],
                "min": low,
                "first_quartile": q1,
                "median": med,
                "third_quartile": q3,
                "max": high,
                "outliers": fliers,
            }
        )
    return {"type": "box_and_whisker", **_axes_2d(ax), "elements": elements}


def _axes_chart(ax: Any) -> dict[str, Any] | None:
    patches_mod = sys.modules.get("matplotlib.patches")
    containers_mod = sys.modules.get("matplotlib.container")
    collections_mod = sys.modules.get("matplotlib.collections")
    stats = getattr(ax, "_sandcell_boxes", None)
    if stats:
        return _box_chart(ax, stats)
    wedge = getattr(patches_mod, "Wedge", None)
    wedges = [p for p in ax.patches if wedge is not None and isinstance(p, wedge)]
    if wedges and len(wedges) == len(ax.patches):
        return {
            "type": "pie",
            "title": str(ax.get_title()) or None,
            "elements": [
                {
                    "label": str(w.get_label())[:1000],
                    "angle": abs(float(w.theta2) - float(w.theta1)),
                    "radius": float(w.r),
                }
                for w in wedges
            ],
        }
    bar_type = getattr(containers_mod, "BarContainer", None)
    bars = [c for c in ax.containers if bar_type is not None and isinstance(c, bar_type)]
    if bars:
        return _bar_chart(ax, bars)
    x_scale, y_scale = _scale(ax, "x"), _scale(ax, "y")
    path_type = getattr(collections_mod, "PathCollection", None)
    dots = [c for c in ax.collections if path_type is not None and isinstance(c, path_type)]
    lines = list(ax.get_lines())
    if dots and not lines:
        elements = [
            {
                "label": str(c.get_label())[:1000],
                "points": _points(
                    (o[0] for o in c.get_offsets()), (o[1] for o in c.get_offsets()), "", ""
                ),
            }
            for c in dots
        ]
        kind = "scatter"
    elif lines and not dots:
        elements = [
            {
                "label": str(line.get_label())[:1000],
                "points": _points(line.get_xdata(), line.get_ydata(), x_scale, y_scale),
            }
            for line in lines
        ]
        kind = "line"
    else:
        return None
    return {
        "type": kind,
        **_axes_2d(ax),
        **_ticks(ax, "x", x_scale),
        **_ticks(ax, "y", y_scale),
        "elements": elements,
    }


def _chart_of(fig: Any) -> dict[str, Any] | None:
    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    charts = [c for c in (_axes_chart(ax) for ax in axes) if c is not None]
    for chart in charts:
        if len(chart["elements"]) > MAX_CHART_ELEMENTS:
            raise _NoChart(f"a chart has more than {MAX_CHART_ELEMENTS} elements")
    if len(axes) == 1:
        return charts[0] if charts else None
    if not charts:
        return None
    if len(charts) > MAX_CHART_ELEMENTS:
        raise _NoChart(f"more than {MAX_CHART_ELEMENTS} axes")
    title = getattr(fig, "_suptitle", None)
    return {
        "type": "superchart",
        "title": (str(title.get_text()) or None) if title is not None else None,
        "elements": charts,
    }


def _chart_text(fig: Any) -> str | None:
    """The chart's data as JSON text, read after the figure was drawn (its tick labels are
    known then); None for a figure that is no chart this module reads."""
    try:
        chart = _chart_of(fig)
        if chart is None:
            return None
        text = _to_json(chart)
    except _NoChart as exc:
        _warn(f"a figure's chart data is not kept: {exc}")
        return None
    except Exception as exc:
        _warn(f"cannot read a figure's chart data: {type(exc).__name__}: {exc}")
        return None
    if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
        _warn(f"a figure's chart data is over {MAX_TEXT_BYTES} bytes; not kept")
        return None
    return text


# -- what a notebook offers a cell: display(), plt.show() in order, shell escapes -------------


class _ShellLines(list):  # type: ignore[type-arg]
    """The lines ``x = !cmd`` captured, as IPython's ``SList``: ``.s``, ``.n``, ``.l``."""

    @property
    def s(self) -> str:
        return " ".join(self)

    @property
    def n(self) -> str:
        return "\n".join(self)

    @property
    def l(self) -> list[str]:  # noqa: E743 - IPython's name
        return list(self)


def _shell(program: str, capture: bool = False, check: bool = False) -> _ShellLines | None:
    """Run a shell escape with Bash in the kernel's directory and environment: its output goes
    to the cell's (``capture``: returned as lines, stderr with stdout, as IPython does);
    ``check``: a non-zero exit raises ``CalledProcessError``, as ``%%bash`` does."""
    import subprocess

    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - what the cell printed comes before the command's output
            stream.flush()
        except Exception:  # noqa: S110
            pass
    argv = ["/bin/bash", "-c", program]
    if capture:
        done = subprocess.run(
            argv,
            check=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        return _ShellLines(done.stdout.decode("utf-8", "replace").splitlines())
    code = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL).returncode
    if check and code != 0:
        raise subprocess.CalledProcessError(code, program)
    return None


def _display(*objs: object) -> None:
    """IPython's ``display``: each object is an output now, in order."""
    writer = _State.writer
    for obj in objs:
        if writer is None:
            print(repr(obj))  # outside a cell (a thread left running): as text
        else:
            writer.value(obj, displayed=True)


def _install_builtins() -> None:
    import builtins

    if not hasattr(builtins, "display"):
        builtins.display = _display  # type: ignore[attr-defined]
    builtins._sandcell_shell = _shell  # type: ignore[attr-defined]


def _show(*args: object, **kwargs: object) -> None:
    """``plt.show()`` in a cell: the open figures are outputs now, and closed."""
    writer = _State.writer
    if writer is not None:
        writer.open_figures()


def _record_boxes(bxp: Any) -> Any:
    # A box plot's statistics are known only to the call that draws it: kept on its axes.
    def wrapped(self: Any, bxpstats: Any, *args: Any, **kwargs: Any) -> Any:
        result = bxp(self, bxpstats, *args, **kwargs)
        try:
            stats = [dict(s) for s in bxpstats]
            labels = kwargs.get("labels") or kwargs.get("tick_labels")
            if labels is not None:
                for box, label in zip(stats, labels, strict=False):
                    box["label"] = label
            self._sandcell_boxes = [*getattr(self, "_sandcell_boxes", []), *stats]
        except Exception as exc:
            _warn(f"cannot keep a box plot's statistics: {type(exc).__name__}: {exc}")
        return result

    wrapped._sandcell_wrapped = True  # type: ignore[attr-defined]
    return wrapped


def _hook_matplotlib() -> None:
    """Wrap pyplot's ``show`` and ``Axes.bxp`` once pyplot is loaded (idempotent)."""
    plt: Any = sys.modules.get("matplotlib.pyplot")
    if plt is None or getattr(plt, "_sandcell_hooked", False):
        return
    plt.show = _show
    axes = sys.modules.get("matplotlib.axes")
    axes_type = getattr(axes, "Axes", None)
    bxp = getattr(axes_type, "bxp", None)
    if bxp is not None and not getattr(bxp, "_sandcell_wrapped", False):
        axes_type.bxp = _record_boxes(bxp)  # type: ignore[union-attr]
    plt._sandcell_hooked = True


def _quiet_show() -> None:
    # With MPLBACKEND=Agg, plt.show() warns that it cannot show; here the figure is shown.
    warnings.filterwarnings("ignore", message=".*non-interactive, and thus cannot be shown")


class _HookingLoader:
    """pyplot's own loader, which hooks pyplot (:func:`_hook_matplotlib`) once it has run."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _hook_matplotlib()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _MatplotlibWatch:
    """A meta-path finder that quiets ``plt.show()`` when matplotlib is first imported, and
    hooks pyplot when it is. Not at once: ``filterwarnings`` imports ``re`` (~10 ms), which
    matplotlib imports anyway, and a cell without matplotlib should not pay for it."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> Any:
        if name == "matplotlib":
            _quiet_show()
            return None
        if name != "matplotlib.pyplot":
            return None
        # Not contextlib.suppress: one import more for one line.
        try:  # noqa: SIM105
            sys.meta_path.remove(_MatplotlibWatch)
        except ValueError:  # the cell took it out already
            pass
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _HookingLoader(spec.loader)  # type: ignore[assignment]
        return spec


def _watch_matplotlib() -> None:
    if "matplotlib" in sys.modules:
        _quiet_show()
    if "matplotlib.pyplot" in sys.modules:
        _hook_matplotlib()
    elif _MatplotlibWatch not in sys.meta_path:
        sys.meta_path.insert(0, _MatplotlibWatch)


def user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """The cell's part of ``tb``: what follows the last frame of this module (:func:`run_cell`),
    or ``tb`` itself when no frame of this module is in it."""
    cell = tb
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _OWN_FILE:
            cell = tb.tb_next
        tb = tb.tb_next
    return cell


def run_cell(
    source: str,
    namespace: dict[str, object],
    out_dir: str,
    *,
    filename: str = "<cell>",
    seq_start: int = 0,
) -> int:
    """Run ``source`` in ``namespace`` as a notebook cell; write its outputs into ``out_dir``.

    Returns the next output number (``seq_start`` plus the outputs written). A syntax error is
    raised before anything runs, with no frame of this module in its traceback. An exception of
    the cell (``SystemExit`` included) propagates after the open figures are written.
    """
    try:
        tree = compile(source, filename, "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as exc:
        raise exc.with_traceback(None) from None
    if not isinstance(tree, _ast.Module):  # what PyCF_ONLY_AST returns in "exec" mode
        raise TypeError(f"compile returned {type(tree).__name__}, not a module")
    last: _ast.expr | None = None
    tail = tree.body[-1] if tree.body else None
    if isinstance(tail, _ast.Expr) and not _suppressed(source, tail.value):
        tree.body.pop()
        last = tail.value
    writer = _Writer(out_dir, seq_start)
    _watch_matplotlib()
    _install_builtins()
    _State.writer = writer
    try:
        code = compile(tree, filename, "exec", dont_inherit=True)
        exec(code, namespace)  # noqa: S102 - running the cell is the point
        if last is not None:
            expr = compile(_ast.Expression(body=last), filename, "eval", dont_inherit=True)
            value = eval(expr, namespace)  # noqa: S307 - the cell's own last expression
            writer.value(value)
    finally:
        _State.writer = None
        writer.open_figures()
    return writer.seq


_OWN_FILE = run_cell.__code__.co_filename

__all__ = ["MAX_IMAGE_BYTES", "MAX_OUTPUTS", "MAX_TEXT_BYTES", "run_cell", "user_traceback"]
