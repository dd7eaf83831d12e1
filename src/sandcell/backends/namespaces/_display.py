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

Security limitations: this code runs inside the sandbox, next to the untrusted program, which can
replace it, bypass it or write any file it likes into ``out_dir``. Nothing here is a control: the
host validates everything it reads back. ``plt.show()`` does not split a cell's figures (each open
figure is captured once, at the end of the cell).
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

    def emit(self, kind: str, data: dict[str, str], images: list[tuple[str, bytes]]) -> None:
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
            manifest = {"kind": kind, "data": data, "files": files}
            self._write_file(f"{stem}.json", _to_json(manifest).encode("utf-8"))
        except OSError as exc:
            _warn(f"cannot write a {kind} to {self.out_dir}: {exc}")
            return
        self.seq += 1
        self.written += 1

    # -- what is shown ---------------------------------------------------------------------

    def value(self, value: object) -> None:
        if value is None:
            return
        try:
            if _is_figure(value):
                self.figure(value)
                return
            table = _table_data(value)
            if table is not None:
                self.emit("table", table, [])
                return
            text = repr(value)
        except Exception as exc:
            _warn(f"cannot show the value: {type(exc).__name__}: {exc}")
            return
        self.emit("value", {"text/plain": _cap(text)}, [])

    def figure(self, fig: object) -> None:
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
        if images:
            self.emit("figure", {"text/plain": _cap(text)}, images)

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
    if isinstance(value, list):
        return "[" + ", ".join(_to_json(v) for v in value) + "]"
    raise TypeError(f"not in a manifest: {type(value).__name__}")


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


def _quiet_show() -> None:
    # With MPLBACKEND=Agg, plt.show() warns that it cannot show; here the figure is shown.
    warnings.filterwarnings("ignore", message=".*non-interactive, and thus cannot be shown")


class _MatplotlibWatch:
    """A meta-path finder that finds nothing: it quiets ``plt.show()`` when matplotlib is first
    imported. Not at once: ``filterwarnings`` imports ``re`` (~10 ms), which matplotlib imports
    anyway, and a cell without matplotlib should not pay for it."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name == "matplotlib":
            _quiet_show()
            # Not contextlib.suppress: one import more for one line.
            try:  # noqa: SIM105
                sys.meta_path.remove(_MatplotlibWatch)
            except ValueError:  # the cell took it out already
                pass


def _quiet_show_when_matplotlib_loads() -> None:
    if "matplotlib" in sys.modules:
        _quiet_show()
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
    _quiet_show_when_matplotlib_loads()
    try:
        code = compile(tree, filename, "exec", dont_inherit=True)
        exec(code, namespace)  # noqa: S102 - running the cell is the point
        if last is not None:
            expr = compile(_ast.Expression(body=last), filename, "eval", dont_inherit=True)
            value = eval(expr, namespace)  # noqa: S307 - the cell's own last expression
            writer.value(value)
    finally:
        writer.open_figures()
    return writer.seq


_OWN_FILE = run_cell.__code__.co_filename

__all__ = ["MAX_IMAGE_BYTES", "MAX_OUTPUTS", "MAX_TEXT_BYTES", "run_cell", "user_traceback"]
