"""IPython syntax in ``run_code``, translated into the plain Python that runs.

E2B's interpreter is IPython, so agents send notebook syntax: ``!pwd``, ``files = !ls``,
``%time f()``, ``%%bash`` cells, code indented as a whole. :func:`translate` turns the subset
agents use into plain Python *before* the policy check, so the checks read what runs:

* a cell indented as a whole is dedented (IPython strips a common leading indent);
* ``!cmd`` runs ``cmd`` with Bash (``/bin/bash -c``, the kernel's directory and environment)
  and shows its output; ``x = !cmd`` and ``!!cmd`` capture its output (stdout and stderr) as a
  list of lines. Each becomes a call of the kernel's ``_sandcell_shell`` with the command as a
  literal, which the gate checks as the Bash program it is
  (:mod:`sandcell.policy.checks.shell_escapes`);
* ``%%bash`` / ``%%sh``: the rest of the cell is one such program (run with Bash; a non-zero
  exit raises ``CalledProcessError``, as IPython's script magics do);
* ``%time STMT``, ``%%time`` (the cell's value still shown), ``%timeit [-n N] [-r R] STMT``,
  ``%pwd``, ``%cd [DIR]``, ``%env [NAME[=VALUE]]``, ``%%writefile [-a] PATH`` become the ``os``,
  ``time`` and ``open`` calls that do the same (``%timeit``'s loop written out: ``timeit`` is
  no module a profile allows); ``%matplotlib ...`` is nothing (figures are always shown);
* ``%pip`` / ``%conda`` are refused with the route packages take in sandcell, and any other
  magic is refused naming the ones served (:class:`IPythonSyntaxError`).

Python values are not put into shell commands (IPython's ``{x}`` and ``$x``): the command the
checks read is the command that runs, so ``{x}`` and ``$x`` reach Bash as written (``$x`` is
then the environment variable). Every line of the cell stays one line of the translation, so
tracebacks and findings point at the line the agent wrote.
"""

from __future__ import annotations

import ast
import re
import shlex
import textwrap
from dataclasses import dataclass

from sandcell.errors import ConfigError
from sandcell.policy.checks.shell_escapes import SHELL_ESCAPE

__all__ = ["IPythonSyntaxError", "translate"]

SERVED = (
    "!cmd, x = !cmd, !!cmd, %time, %timeit, %pwd, %cd, %env, %matplotlib, "
    "%%bash, %%sh, %%time, %%writefile"
)
_PACKAGES = (
    "installing packages at run time is not served: a sandbox imports its runtime's packages "
    "(numpy, pandas, matplotlib in the analysis runtime) and the packages its profile allows "
    "from sandcell's wheel cache (an operator adds one with `sandcell packages add "
    "NAME==VERSION` and lists it in the profile's [runtime] allowed_packages)"
)
_ASSIGN = re.compile(r"((?:[A-Za-z_][\w.]*\s*,\s*)*[A-Za-z_][\w.]*)\s*=\s*!(.*)")
_MAGIC = re.compile(r"%([A-Za-z_]\w*)(.*)")
_P = "_sandcell"
"""The prefix of the names a translation binds in the cell's namespace."""
_OS = f"import os as {_P}_os"
_FMT = (
    f"{_P}_fmt = lambda s: f'{{s * 1e9:.3g}} ns' if s < 1e-6 else "
    "f'{s * 1e6:.3g} µs' if s < 1e-3 else f'{s * 1e3:.3g} ms' if s < 1 else f'{s:.3g} s'"
)


class IPythonSyntaxError(ConfigError):
    """IPython syntax sandcell does not serve; the message says which and what to do instead."""


@dataclass(frozen=True, slots=True)
class _Line:
    text: str
    starts_statement: bool
    """False inside brackets, a string or after a backslash: not where a magic can start."""


def _lines(code: str) -> list[_Line]:
    """The lines of ``code``, each marked with whether a statement may start on it.

    A scan of strings, comments, brackets and continuations rather than Python's tokenizer,
    which stops at the first ``!`` or ``%`` a notebook line starts with.
    """
    out: list[_Line] = []
    depth = 0
    quote = ""  # the open string's delimiter ("'", '"', "'''" or '\"\"\"'), or none
    continued = False
    for text in code.split("\n"):
        starts = depth == 0 and not quote and not continued
        out.append(_Line(text, starts))
        stripped = text.lstrip()
        if starts and (stripped.startswith(("!", "%")) or _ASSIGN.fullmatch(stripped)):
            continue  # a magic line: its text is no Python to scan
        continued = False
        i, n = 0, len(text)
        while i < n:
            c = text[i]
            if quote:
                if c == "\\":
                    i += 2
                    continue
                if text.startswith(quote, i):
                    i += len(quote)
                    quote = ""
                    continue
                i += 1
                continue
            if c == "#":
                break
            if c in "'\"":
                quote = text[i : i + 3] if text[i : i + 3] in ("'''", '"""') else c
                i += len(quote)
                continue
            if c in "([{":
                depth += 1
            elif c in ")]}":
                depth = max(depth - 1, 0)
            elif c == "\\" and i == n - 1:
                continued = True
            i += 1
        if quote in ("'", '"') and not continued:
            quote = ""  # an unterminated one-line string: the parser reports it
    return out


def _shell(program: str, *, capture: bool = False, check: bool = False) -> str:
    args = [repr(program)]
    if capture:
        args.append("capture=True")
    if check:
        args.append("check=True")
    return f"{SHELL_ESCAPE}({', '.join(args)})"


def _is_expression(source: str) -> bool:
    try:
        ast.parse(source, mode="eval")
    except SyntaxError:
        return False
    return True


def _simple_statement(source: str, magic: str) -> ast.stmt:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise IPythonSyntaxError(f"%{magic}: {source!r} is not Python ({exc.msg})") from None
    if len(tree.body) != 1 or isinstance(
        tree.body[0],
        ast.FunctionDef
        | ast.AsyncFunctionDef
        | ast.ClassDef
        | ast.For
        | ast.AsyncFor
        | ast.While
        | ast.If
        | ast.With
        | ast.AsyncWith
        | ast.Try
        | ast.Match,
    ):
        raise IPythonSyntaxError(
            f"%{magic} takes one simple statement on its line; time a block with %%time, or "
            "put it in a function and time the call"
        )
    return tree.body[0]


def _time_start() -> str:
    p = _P
    return (
        f"import time as {p}_time; {_OS}; {_FMT}; "
        f"{p}_t0 = ({p}_os.times(), {p}_time.perf_counter())"
    )


def _time_report() -> str:
    # IPython's report: CPU times from os.times(), wall time from the performance counter.
    p = _P
    user = f"{p}_t1[0].user - {p}_t0[0].user"
    system = f"{p}_t1[0].system - {p}_t0[0].system"
    return (
        f"{p}_t1 = ({p}_os.times(), {p}_time.perf_counter()); "
        f"print(f'CPU times: user {{{p}_fmt({user})}}, sys: {{{p}_fmt({system})}}, "
        f"total: {{{p}_fmt({user} + {system})}}"
        f"\\nWall time: {{{p}_fmt({p}_t1[1] - {p}_t0[1])}}')"
    )


def _time(stmt: str) -> str:
    _simple_statement(stmt, "time")
    if _is_expression(stmt):
        # Its value is shown, as IPython shows the value of a timed expression.
        value = f"{_P}_value"
        return f"{_time_start()}; {value} = ({stmt}); {_time_report()}; {value}"
    return f"{_time_start()}; {stmt}; {_time_report()}"


def _timeit(args: str) -> str:
    words = args.split()
    number = repeat = None
    while words and words[0] in ("-n", "-r"):
        if len(words) < 2 or not words[1].isdigit() or int(words[1]) < 1:
            raise IPythonSyntaxError(f"%timeit {words[0]} takes a positive whole number")
        if words[0] == "-n":
            number = int(words[1])
        else:
            repeat = int(words[1])
        words = words[2:]
    if words and words[0].startswith("-"):
        raise IPythonSyntaxError(f"%timeit option {words[0]} is not served; use -n and -r")
    stmt = args[args.find(words[0]) :] if words else ""
    if not stmt:
        raise IPythonSyntaxError("%timeit needs a statement to time")
    node = _simple_statement(stmt, "timeit")
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        timed = ast.unparse(node.value)
    elif isinstance(node, ast.Expr):
        timed = stmt
    else:
        raise IPythonSyntaxError(
            "%timeit times an expression or one assignment; put anything else in a function "
            "and time the call"
        )
    # timeit's own loop, written out: the timeit module is no module a profile allows.
    p = _P
    runs = repeat or 7
    run = (
        f"{p}_fn = lambda: ({timed}); "
        f"{p}_run = lambda k: (lambda t0: ([{p}_fn() for _ in range(k)], "
        f"{p}_time.perf_counter() - t0)[1])({p}_time.perf_counter())"
    )
    if number is not None:
        n = str(number)
    else:
        # timeit's autorange: the first of 1, 2, 5, 10, 20, 50... loops that takes 0.2 s.
        n = (
            f"next(k for k in (10 ** e * m for e in range(7) for m in (1, 2, 5)) "
            f"if {p}_run(k) >= 0.2 or k >= 5000000)"
        )
    return (
        f"import time as {p}_time, statistics as {p}_stats; {_FMT}; {run}; {p}_n = {n}; "
        f"{p}_per = [{p}_run({p}_n) / {p}_n for _ in range({runs})]; "
        f"print(f'{{{p}_fmt({p}_stats.mean({p}_per))}} ± "
        f"{{{p}_fmt({p}_stats.pstdev({p}_per))}} per loop (mean ± std. dev. of {runs} runs, "
        f"{{{p}_n:,}} loops each)')"
    )


def _words(args: str, magic: str) -> list[str]:
    try:
        return shlex.split(args)
    except ValueError as exc:
        raise IPythonSyntaxError(f"%{magic}: {exc}; quote the argument once") from None


def _cd(args: str) -> str:
    words = _words(args, "cd")
    if len(words) > 1 or (words and words[0].startswith("-")):
        raise IPythonSyntaxError("%cd takes one directory (no options, bookmarks or history)")
    p = _P
    if not words or words[0] == "~":
        target = f"{p}_os.environ.get('HOME') or {p}_os.getcwd()"
    elif words[0].startswith("~/"):
        target = f"{p}_os.path.join({p}_os.environ.get('HOME', ''), {words[0][2:]!r})"
    else:
        target = repr(words[0])
    return f"{_OS}; {p}_os.chdir({target}); print({p}_os.getcwd())"


def _env(args: str) -> str:
    p = _P
    text = args.strip()
    if not text:
        return f"{_OS}; dict({p}_os.environ)"
    name, sep, value = text.partition("=")
    if not sep:
        name, _, value = text.partition(" ")
        sep = " " if value.strip() else ""
    name, value = name.strip(), value.strip()
    if not name.isidentifier():
        raise IPythonSyntaxError(f"%env: {name!r} is not a variable name")
    if not sep:
        return f"{_OS}; {p}_os.environ[{name!r}]"
    return f"{_OS}; {p}_os.environ[{name!r}] = {value!r}; print({f'env: {name}={value}'!r})"


def _line_magic(name: str, args: str) -> str:
    if name in ("pip", "conda", "mamba"):
        raise IPythonSyntaxError(f"%{name}: {_PACKAGES}")
    if name == "time":
        if not args.strip():
            raise IPythonSyntaxError("%time needs a statement to time")
        return _time(args.strip())
    if name == "timeit":
        return _timeit(args.strip())
    if name == "pwd":
        return f"{_OS}; {_P}_os.getcwd()"
    if name == "cd":
        return _cd(args)
    if name == "env":
        return _env(args)
    if name == "matplotlib":
        return "pass"
    if name in ("sx", "system"):
        return _shell(args.strip(), capture=True)
    raise IPythonSyntaxError(f"IPython magic %{name} is not served by sandcell; served: {SERVED}")


def _writefile(args: str, body: str) -> str:
    words = _words(args, "writefile")
    append = bool(words) and words[0] in ("-a", "--append")
    if append:
        words = words[1:]
    if len(words) != 1:
        raise IPythonSyntaxError("%%writefile takes one path (and -a to append)")
    path = words[0]
    p = _P
    mode = "a" if append else "w"
    said = "Appending to" if append else "Writing"
    return (
        f"with open({path!r}, {mode!r}, encoding='utf-8') as {p}_file: {p}_file.write({body!r})\n"
        f"print({f'{said} {path}'!r})"
    )


def _cell_magic(name: str, args: str, body: str) -> str | None:
    """The translation of a cell magic's cell, or None for ``%%time`` (the body is Python)."""
    if name in ("bash", "sh"):
        if args.strip():
            raise IPythonSyntaxError(f"%%{name} options are not served; use the cell alone")
        return _shell(body, check=True)
    if name == "writefile":
        return _writefile(args, body)
    if name == "time":
        return None
    if name in ("pip", "conda", "mamba"):
        raise IPythonSyntaxError(f"%%{name}: {_PACKAGES}")
    raise IPythonSyntaxError(f"IPython magic %%{name} is not served by sandcell; served: {SERVED}")


def _translate_lines(code: str) -> str:
    out: list[str] = []
    for line in _lines(code):
        stripped = line.text.lstrip()
        indent = line.text[: len(line.text) - len(stripped)]
        if not line.starts_statement or not stripped.startswith(("!", "%")):
            assigned = _ASSIGN.fullmatch(stripped) if line.starts_statement else None
            if assigned is not None:
                out.append(f"{indent}{assigned[1]} = {_shell(assigned[2].strip(), capture=True)}")
            else:
                out.append(line.text)
            continue
        if stripped.startswith("!!"):
            out.append(indent + _shell(stripped[2:].strip(), capture=True))
        elif stripped.startswith("!"):
            out.append(indent + _shell(stripped[1:].strip()))
        elif stripped.startswith("%%"):
            raise IPythonSyntaxError(
                f"{stripped.split()[0]} is a cell magic: it must be the first line of the cell"
            )
        else:
            magic = _MAGIC.fullmatch(stripped)
            if magic is None:
                raise IPythonSyntaxError(f"{stripped[:40]!r} is not a magic sandcell knows")
            out.append(indent + _line_magic(magic[1], magic[2]))
    return "\n".join(out)


def _keep_last_value(body: str) -> tuple[str, str]:
    """``body`` with its last expression's value kept in a name, and the line that shows it
    after the timing report (IPython's ``%%time`` shows the cell's value); ``""`` when there
    is none to show (no last expression, one hidden by ``;``, or a body that does not parse,
    whose error the cell reports when it runs)."""
    try:
        tree = ast.parse(body)
    except (SyntaxError, ValueError, RecursionError):
        return body, ""
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr) or last.end_lineno is None or last.end_col_offset is None:
        return body, ""
    lines = body.split("\n")
    first, end = last.lineno - 1, last.end_lineno - 1
    # Column offsets count UTF-8 bytes.
    tail = lines[end].encode()
    if tail[last.end_col_offset :].decode(errors="replace").lstrip().startswith(";"):
        return body, ""
    lines[end] = (tail[: last.end_col_offset] + b")" + tail[last.end_col_offset :]).decode()
    head = lines[first].encode()
    lines[first] = (
        head[: last.col_offset] + f"{_P}_value = (".encode() + head[last.col_offset :]
    ).decode()
    return "\n".join(lines), f"\n{_P}_value"


def translate(code: str) -> str:
    """The plain Python that runs ``code`` (a notebook cell); raises :class:`IPythonSyntaxError`
    for what is not served. Plain Python comes back unchanged but for a common indent."""
    if code.lstrip().startswith("%%"):
        first, _, body = code.lstrip().partition("\n")
        magic = re.fullmatch(r"%%([A-Za-z_]\w*)(.*)", first.rstrip())
        if magic is None:
            raise IPythonSyntaxError(f"{first[:40]!r} is not a cell magic sandcell knows")
        rest = body.split("\n")
        done = _cell_magic(magic[1], magic[2], body)
        if done is not None:
            # One line per line of the cell, the magic's own line empty: a finding in the body
            # points at the line it is on.
            return "\n" + done + "\n" * max(len(rest) - 1 - done.count("\n"), 0)
        timed, value = _keep_last_value(_translate_lines(textwrap.dedent(body)))
        return f"{_time_start()}\n{timed}\n{_time_report()}{value}"
    if "!" not in code and "%" not in code:
        return textwrap.dedent(code)
    return _translate_lines(textwrap.dedent(code))
