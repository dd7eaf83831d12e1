"""The ``sandcell`` command's first step: a plain ``sandcell run`` goes straight to a running
service; everything else goes to :func:`sandcell.cli.main`.

With a service up, the service runs the program in a warm sandbox in a few milliseconds, and the
command's own start is most of what a person waits for: the interpreter, then sandcell's imports
(argparse, the request and result types, the error hierarchy). This module imports nothing but
the interpreter's own C modules (``_socket``, ``_json``; not ``socket`` or ``json``, which pull in
``enum`` and ``re``), so that a call it serves costs little more than the interpreter's start.

It serves ``sandcell [--home DIR] run (-c CODE | FILE) [--lang L] [--profile NAME] [--json]``
when ``SANDCELL_API_KEY`` is set and a service listens on the local socket in the sandcell home
(or on ``SANDCELL_URL=unix:PATH``): the same request :mod:`sandcell.cli.remote_run` sends, over
the same HTTP/1.1. Anything else, anything it does not recognise exactly, and a socket nobody
listens on (a service that is gone), are the full command line's, before a request is sent, so
that every error is said there, once, as it always is. After the request is sent, an answer that
is not a plain finished run (an error status, a denial, findings, redactions, a terminal that
needs the output neutralised) is handed to the full command line's report
(:func:`sandcell.cli.remote_run.report_answer`), not sent again: the output is the same by
construction, and only the plain case is printed here.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

__all__ = ["entry", "main"]

# sandcell.spec.LANGUAGE_ALIASES, copied (importing spec costs more than this module; a test
# holds the two equal): a name sent is the full one, as the full command line sends it.
_LANGUAGES = {
    "python": "python",
    "py": "python",
    "bash": "bash",
    "sh": "bash",
    "shell": "bash",
    "javascript": "javascript",
    "js": "javascript",
    "node": "javascript",
    "typescript": "typescript",
    "ts": "typescript",
}
_CONNECT_TIMEOUT_S = 2.0  # as the full command line's probe: a service too busy to accept is none


class _Plan:
    """A run this module can send: where to, and the request. (A plain class: ``dataclasses``
    imports ``inspect``, which alone costs more than this whole module.)"""

    __slots__ = ("as_json", "key", "payload", "socket")

    def __init__(self, *, socket: str, key: str, payload: bytes, as_json: bool) -> None:
        self.socket = socket
        self.key = key
        self.payload = payload
        self.as_json = as_json


def main(argv: list[str] | None = None) -> int:
    """The exit status of ``sandcell`` with ``argv`` (default: this process's arguments)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    status = _served(argv)
    if status is not None:
        return status
    from sandcell.cli import main as full

    return full(argv)


def entry() -> None:
    """The command itself (bin/sandcell, ``python -m sandcell``): :func:`main`, and a call this
    module served ends as soon as its output is out."""
    argv = sys.argv[1:]
    status = _served(argv, leave=True)
    if status is not None:
        sys.exit(status)
    from sandcell.cli import main as full

    sys.exit(full(argv))


def _served(argv: list[str], *, leave: bool = False) -> int | None:
    """The exit status of ``argv`` when this module serves it, else None (nothing was sent);
    with ``leave``, a plain answer printed here ends the process (:func:`_leave`)."""
    plan = _plan(argv)
    return None if plan is None else _serve(plan, leave=leave)


def _leave(status: int) -> NoReturn:
    """Exit with ``status`` without the interpreter's finalization. A plain answer printed here
    imported only built-in modules, started no thread and registered nothing to run at exit, so
    tearing the interpreter down (its modules, its objects) does nothing anyone sees; it was
    about 2 ms of the command's 12-13 ms of CPU (bench/bench_cli.py). Output that cannot be
    flushed (a reader that went away) is left to the interpreter's own exit, as before."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(status)
    os._exit(status)


def _plan(argv: list[str]) -> _Plan | None:
    """The request for ``argv`` when it is a run this module serves, else None."""
    home, i = None, 0
    while i < len(argv) and argv[i].startswith("--home"):
        if argv[i] == "--home" and i + 1 < len(argv):
            home, i = argv[i + 1], i + 2
        elif argv[i].startswith("--home="):
            home, i = argv[i].removeprefix("--home="), i + 1
        else:
            return None
    if argv[i : i + 1] != ["run"] or home == "" or (home or "").startswith("-"):
        return None
    opts = _run_options(argv[i + 1 :])
    if opts is None:
        return None
    code, lang, profile, as_json = opts
    key = os.environ.get("SANDCELL_API_KEY") or None
    # As sandcell.cli.remote.find_service: without a key the socket is not used; a key that
    # cannot go into a header line is the full command line's error to say.
    if key is None or not (key.isascii() and key.isprintable() and " " not in key):
        return None
    where = _socket_path(home)
    if where is None:
        return None
    profile = profile or os.environ.get("SANDCELL_PROFILE") or None
    if profile is not None and ("/" in profile or profile.endswith(".toml")):
        return None
    payload = _body(code, lang, profile)
    if payload is None:
        return None
    return _Plan(socket=where, key=key, payload=payload, as_json=as_json)


def _run_options(args: list[str]) -> tuple[str, str, str | None, bool] | None:
    """(code, language, profile, --json) from ``run``'s arguments, when they are only those
    options, each written out in full and given once; else None."""
    values: dict[str, str] = {}
    as_json = False
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        if arg == "--json":
            as_json, i = True, i + 1
            continue
        if arg == "-c" or name in ("--lang", "--profile"):
            option = "code" if arg == "-c" else name
            if eq:
                value, i = inline, i + 1
            elif i + 1 < len(args):
                value, i = args[i + 1], i + 2
            else:
                return None
            if option in values or value.startswith("-"):
                return None
            values[option] = value
            continue
        if arg.startswith("-") or "file" in values:
            return None
        values["file"], i = arg, i + 1
    if ("code" in values) == ("file" in values):
        return None
    lang = _LANGUAGES.get(values.get("--lang", "python").strip().lower())
    if lang is None:
        return None
    code = values.get("code")
    if code is None:
        code = _read_program(values["file"])
        if code is None:
            return None
    return code, lang, values.get("--profile"), as_json


def _read_program(path: str) -> str | None:
    """The program file's text as ``sandcell run FILE`` reads it; None when it cannot be read
    (the full command line says why)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _socket_path(home: str | None) -> str | None:
    """The service socket to try: ``SANDCELL_URL=unix:PATH``, else ``service.sock`` in the home
    (``--home``, ``$SANDCELL_HOME``, else the user data directory as :func:`sandcell.home.data_dir`
    finds it on Linux). None when the full command line must decide (a TCP URL, another platform,
    an unusual environment)."""
    url = os.environ.get("SANDCELL_URL") or None
    if url is not None:
        return url.removeprefix("unix:") if url.startswith("unix:") and len(url) > 5 else None
    home = home or os.environ.get("SANDCELL_HOME") or None
    if home is None:
        if sys.platform != "linux":
            return None
        # platformdirs' user data directory, without importing it (it costs more than a run):
        # $XDG_DATA_HOME when absolute, else ~/.local/share with an absolute $HOME. A test
        # holds this to sandcell.home.data_dir().
        xdg = os.environ.get("XDG_DATA_HOME", "")
        user = os.environ.get("HOME", "")
        if xdg.startswith("/"):
            home = os.path.join(xdg, "sandcell")
        elif user.startswith("/"):
            home = os.path.join(user.rstrip("/") + "/.local/share", "sandcell")
        else:
            return None
    return os.path.join(home, "service.sock")


def _body(code: str, lang: str, profile: str | None) -> bytes | None:
    """The ``POST /v1/runs`` body :func:`sandcell.cli.remote_run.request_body` makes for these
    options; None for text that is not UTF-8 (the full command line says so)."""
    quote = _json_quote()
    text = (
        f'{{"code": {quote(code)}, "language": {quote(lang)}, "profile": '
        f"{'null' if profile is None else quote(profile)}, "
        '"backend": null, "stdin": "", "env": {}, "exports": [], "limits": null, '
        '"display": false, "invariants": [], "result_file": null, "files": {}}'
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return None


def _serve(plan: _Plan, *, leave: bool = False) -> int | None:
    """Send the run and report it; None when no service listens there (nothing was sent).
    With ``leave``, a plain answer printed here ends the process (:func:`_leave`); the full
    report, which imports the command line, ends as every command does."""
    try:
        answer = _exchange(plan)
    except KeyboardInterrupt:
        return 130
    if answer is None:
        return None
    status = _print_plain(answer, as_json=plan.as_json) if isinstance(answer, bytes) else None
    if status is not None and leave:
        _leave(status)
    return status if status is not None else _report_fully(plan, answer)


def _exchange(plan: _Plan) -> bytes | OSError | None:
    """The whole answer to the request (the connection is closed after it), the error that cut
    it short, or None when nothing listens on the socket."""
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            sock.settimeout(_CONNECT_TIMEOUT_S)
            sock.connect(plan.socket)
            sock.settimeout(None)  # a run answers when it ends
        except OSError:
            return None
        head = (
            f"POST /v1/runs HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            f"Authorization: Bearer {plan.key}\r\nAccept: application/json\r\n"
            f"Content-Length: {len(plan.payload)}\r\nContent-Type: application/json\r\n\r\n"
        )
        chunks = []
        try:
            sock.sendall(head.encode("latin-1") + plan.payload)
            while chunk := sock.recv(262144):
                chunks.append(chunk)
        except OSError as exc:
            return exc
        return b"".join(chunks)
    finally:
        sock.close()


def _report_fully(plan: _Plan, answer: bytes | OSError) -> int:
    from pathlib import Path

    from sandcell.cli import guarded
    from sandcell.cli.remote import Target
    from sandcell.cli.remote_run import report_answer

    target = Target(key=plan.key, socket=Path(plan.socket))
    return guarded(lambda: report_answer(target, answer, as_json=plan.as_json))


def _print_plain(answer: bytes, *, as_json: bool) -> int | None:
    """Print a finished run's output (or with ``as_json`` its JSON line) as
    :func:`sandcell.cli.run.report` does, when the answer is a 200 with a body of its stated
    length, and the run ended ``ok`` or ``error`` with nothing for sandcell to say about it;
    return its exit status. None for anything else."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if not sep or not lines[0].startswith(b"HTTP/1.1 200 "):
        return None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if b"transfer-encoding" in headers or headers.get(b"content-length") != b"%d" % len(body):
        return None
    reply = _json_load(body)
    result = reply.get("result") if isinstance(reply, dict) else None
    if not isinstance(result, dict):
        return None
    outcome, exit_code = result.get("outcome"), result.get("exit_code")
    out, err = result.get("stdout"), result.get("stderr")
    if outcome == "ok":
        status = 0
    elif outcome == "error" and (exit_code is None or type(exit_code) is int):
        status = exit_code or 1
    else:
        return None
    validation = result.get("validation")
    said = (
        (validation is not None and (not isinstance(validation, dict) or validation.get("errors")))
        or result.get("leaks") != []
        or result.get("rejected_exports") != []
        or result.get("network") is not None
        or result.get("tools") is not None
    )
    if said or not isinstance(out, str) or not isinstance(err, str):
        return None
    if as_json:
        # The service's JSON form of the result is result_to_dict's, which the full report
        # prints again after a round trip through RunResult: the same value, in json.dumps'
        # own format (a test holds the two to the same bytes).
        dumped = _json_dump(result)
        if dumped is None:
            return None
        out, err = dumped + "\n", ""
    elif (out and not _tty_plain(out, sys.stdout)) or (err and not _tty_plain(err, sys.stderr)):
        return None
    try:
        sys.stdout.write(out)
        sys.stdout.flush()
        sys.stderr.write(err)
    except BrokenPipeError:
        return 0
    return status


def _tty_plain(text: str, stream: object) -> bool:
    """Whether ``text`` prints as it is on ``stream``: always on a file or pipe; on a terminal
    when it is ASCII without control characters (tab, newline and CRLF aside), which
    :func:`sandcell.validation.neutralise` keeps as it is. Other text on a terminal is the
    full report's to neutralise."""
    isatty = getattr(stream, "isatty", None)
    if isatty is None or not isatty():
        return True
    plain = text.replace("\r\n", "").replace("\n", "").replace("\t", "")
    return plain.isascii() and plain.isprintable()


def _json_dump(value: object) -> str | None:
    """``json.dumps(value, ensure_ascii=False)`` for a JSON value, with the encoder ``json``
    itself uses (None without it)."""
    try:
        from _json import encode_basestring, make_encoder
    except ImportError:
        return None

    def refuse(o: object) -> object:
        raise TypeError(f"not JSON: {type(o).__name__}")

    encoder = make_encoder({}, refuse, encode_basestring, None, ": ", ", ", False, False, True)
    return "".join(encoder(value, 0))


def _json_quote() -> Callable[[str], str]:
    try:
        from _json import encode_basestring
    except ImportError:  # an interpreter without CPython's accelerator
        from json.encoder import py_encode_basestring as encode_basestring
    return encode_basestring


class _Decoding:
    """The settings ``_json.make_scanner`` reads: those of ``json.loads`` without hooks."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        return float(name)


def _json_load(body: bytes) -> object:
    """``json.loads(body)``, with the interpreter's C scanner (the ``json`` package imports
    ``re``, which costs more than a run); None for anything that is not one JSON value."""
    try:
        text = body.decode("utf-8")
        from _json import make_scanner

        value, end = make_scanner(_Decoding)(text, 0)  # type: ignore[arg-type]  # a duck type
    except (ImportError, ValueError, StopIteration, RecursionError):
        return None
    return value if not text[end:].strip(" \t\r\n") else None
