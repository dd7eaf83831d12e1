"""Shell checks on a real parse (tree-sitter-bash): what the script runs, writes and fetches.

Every command is checked wherever it sits: in pipelines, lists, subshells, command and process
substitutions, functions, loops, and inside the strings given to ``bash -c``, ``eval`` and
heredocs fed to a shell or to Python (those are parsed and checked in turn; Python through
:func:`~sandcell.policy.checks.python_rules.check_python`). Wrappers such as ``sudo``, ``env``,
``nohup``, ``timeout``, ``xargs`` and ``find -exec`` are looked through. Words are evaluated
statically where that is knowable (see :mod:`._shell_words`); a command name that is not is
itself a finding, since the checks cannot say what it runs.

What they cannot see: code inside other interpreters (``awk``, ``perl -e``), scripts written
at run time and then run, and values that come from the environment or from real commands.
The sandbox, not this module, is the boundary.
"""

from __future__ import annotations

import itertools
import posixpath
from collections.abc import Sequence

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from sandcell.policy.checks import _shell_words as t
from sandcell.policy.checks._shell_words import (
    Words,
    decodes,
    destroys,
    fetches,
    inner_command,
    inside_error,
    is_root,
    static_output,
    stdin_runner,
    text,
    walk,
)
from sandcell.policy.checks.findings import Finding, Severity, outside_roots, snippet_of
from sandcell.policy.checks.python_rules import check_python

__all__ = ["check_shell"]

_BASH = Language(tree_sitter_bash.language())
_MAX_DEPTH = 4
"""How deep ``bash -c`` strings inside ``bash -c`` strings are checked; deeper is a finding."""
_WRITE_OPS = frozenset({">", ">>", "&>", "&>>", ">|", "<>", ">&"})
_QUOTED = frozenset({"string", "raw_string", "ansi_c_string"})
_BENIGN = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"})

_MESSAGES: dict[str, tuple[str, Severity, str]] = {
    "syntax": ("sh.syntax", "deny",
               "the script does not parse near {near!r}; it cannot run as written, so fix the "
               "syntax first"),
    "missing": ("sh.syntax", "deny",
                "the script does not parse: {near!r} is missing in the statement that starts "
                "here; it cannot run as written, so fix the syntax first"),
    "network": ("sh.network", "warning",
                "{what} needs the network, which this profile does not give; put the data in "
                "the run's inputs, or use a profile with network access"),
    "package": ("sh.package", "warning",
                "{what} installs packages at run time; use the packages in the runtime image, "
                "or a profile whose runtime image has what the code needs"),
    "pipe-to-shell": ("sh.pipe-to-shell", "deny",
                      "{what} runs code fetched from the network without anyone reading it; "
                      "download the file as an input and review it instead"),
    "write-outside": ("sh.write-outside", "warning",
                      "{what} writes {path!r}, outside the writable workspace ({roots}); write "
                      "results under the working directory"),
    "destroy": ("sh.destroy", "deny",
                "{what} would wipe far more than the workspace; remove only files under the "
                "working directory"),
    "fork-bomb": ("sh.destroy", "deny",
                  "{what} is a fork bomb: it spawns processes until none are left; remove it"),
    "background": ("sh.background", "warning",
                   "{what} starts a process that outlives the command (it is killed when the "
                   "run ends, and its output is lost); run it in the foreground, or `wait`"),
    "background-waited": ("sh.background", "info",
                          "{what} runs in the background, and the script waits for it"),
    "eval": ("sh.eval", "warning",
             "{what} runs code that is only known at run time, so the checks cannot see it; "
             "write the commands out directly"),
    "eval-decoded": ("sh.eval", "deny",
                     "{what} runs a decoded payload, a common way to hide commands; write the "
                     "commands out directly"),
    "deep": ("sh.eval", "deny", "{what} nests shells too deep to check; write it out directly"),
}  # fmt: skip


def check_shell(
    code: str, *, network: bool, writable_roots: Sequence[str] = ("/sandbox", "/home/user", "/tmp")
) -> list[Finding]:
    """Check a bash script; return the findings in source order.

    ``network`` says whether the profile gives the run a network (if not, network tools and
    ``/dev/tcp`` redirections are findings); writes to paths outside ``writable_roots``
    (absolute, ``~``, or climbing out with ``..``) are findings too.
    """
    roots = tuple(posixpath.normpath(r) for r in writable_roots)
    try:
        return _ShellChecker(code, network=network, roots=roots, depth=0).run()
    except RecursionError:
        # Code nested deeper than the checks can follow is denied rather than waved through.
        msg = "the script is nested too deeply to check; flatten it"
        return [Finding("sh.syntax", "deny", 1, 1, msg, "")]


class _ShellChecker:
    """One pass over one script; see :func:`check_shell`."""

    def __init__(self, code: str, *, network: bool, roots: tuple[str, ...], depth: int) -> None:
        self.code = code
        self.src = code.encode()
        self.lines = self.src.split(b"\n")
        self.network = network
        self.roots = roots
        self.depth = depth
        self.findings: list[Finding] = []

    def run(self) -> list[Finding]:
        root = Parser(_BASH).parse(self.src).root_node
        self.words = Words(root)
        self.waits = [n.start_byte for n in walk(root) if n.type == "command" and self._is_wait(n)]
        syntax_reported = False
        for node in walk(root):
            if node.type == "ERROR" or node.is_missing:
                # Only the first error: the ones after it are usually its echoes.
                if syntax_reported or (node.parent and inside_error(node.parent)):
                    continue
                if node.is_missing:
                    # Point at the statement left open, not at the end of the file.
                    opened = node.parent if node.parent and node.parent.parent else node
                    self.report(opened, "missing", near=node.type)
                    syntax_reported = True
                elif not self._rw_redirect(node):
                    self.report(node, "syntax", near=text(node).split("\n")[0][:40])
                    syntax_reported = True
            elif node.type == "command":
                self._on_command(node)
            elif node.type == "file_redirect":
                self._on_redirect(node)
            elif node.type in {"heredoc_body", "herestring_redirect"}:
                self._on_fed_text(node)
            elif node.type == "pipeline":
                self._on_pipeline(node)
            elif node.type == "&":
                self._on_ampersand(node)
            elif node.type == "function_definition":
                self._on_function(node)
        return sorted(self.findings, key=lambda f: (f.line, f.column, f.rule_id))

    def _is_wait(self, command: Node) -> bool:
        argv = self.words.argv(command)
        return bool(argv) and argv is not None and argv[0] == "wait"

    def _rw_redirect(self, node: Node) -> bool:
        """tree-sitter-bash 0.25 does not know the valid ``<>`` operator; it is not an error."""
        around = self.src[max(node.start_byte - 1, 0) : node.end_byte + 1]
        return node.type == "ERROR" and text(node) in {"<", ">"} and b"<>" in around

    # -- reporting ------------------------------------------------------------------------

    def report(self, node: Node, key: str, **values: object) -> None:
        rule, severity, template = _MESSAGES[key]
        self.add(node.start_point, rule, severity, template.format(**values))

    def add(self, point: tuple[int, int], rule: str, severity: Severity, message: str) -> None:
        row, col = point
        # tree-sitter columns are byte offsets; people count characters.
        prefix = self.lines[row][:col] if row < len(self.lines) else b""
        self.add_at(row, len(prefix.decode(errors="replace")), rule, severity, message)

    def add_at(self, row: int, column: int, rule: str, severity: Severity, message: str) -> None:
        """Add a finding at 0-based ``row`` and 0-based character ``column``."""
        line = self.lines[row].decode(errors="replace") if row < len(self.lines) else ""
        self.findings.append(
            Finding(rule, severity, row + 1, column + 1, message, snippet_of(line))
        )

    def nested(self, node: Node, code: str, language: str, what: str) -> None:
        """Check ``code`` found inside ``node`` (a ``bash -c`` string, a heredoc) in turn.

        Findings inside point into the string: exact for heredocs, approximate for quoted
        strings whose escapes the shell removed.
        """
        if self.depth >= _MAX_DEPTH:
            self.report(node, "deep", what=what)
            return
        if language == "python":
            inner = check_python(code, allowed_imports=None, network=self.network)
        else:
            inner = _ShellChecker(
                code, network=self.network, roots=self.roots, depth=self.depth + 1
            ).run()
        row, col = node.start_point
        prefix = self.lines[row][:col] if row < len(self.lines) else b""
        start = len(prefix.decode(errors="replace")) + (1 if node.type in _QUOTED else 0)
        for f in inner:
            if f.rule_id in {"py.syntax", "sh.syntax"}:
                continue  # a string that does not parse fails at run time, harmlessly
            column = start + f.column - 1 if f.line == 1 else f.column - 1
            self.add_at(row + f.line - 1, column, f.rule_id, f.severity, f"in {what}: {f.message}")

    # -- commands -------------------------------------------------------------------------

    def _on_command(self, node: Node) -> None:
        argv = self.words.argv(node)
        if argv is None:
            self.report(node, "eval", what="a command whose name is computed")
            return
        args = node.children_by_field_name("argument")
        # Words that came from splitting the name (``curl${IFS}x``) have no node of their own.
        nodes: list[Node | None] = [node.child_by_field_name("name")]
        nodes += [None] * (len(argv) - 1 - len(args)) + list(args)
        self._on_argv(node, argv, nodes)

    def _on_argv(self, node: Node, argv: list[str | None], nodes: list[Node | None]) -> None:
        name = argv[0]
        if name is None:
            self.report(node, "eval", what="a command whose name is computed")
            return
        base = posixpath.basename(name)
        rest = argv[1:]
        what = f"`{base}`"
        if base in t.BACKGROUND:
            self.report(node, "background", what=what)
        if base in t.WRAPPERS or base == "find":
            inner = inner_command(base, rest)
            if inner is not None:
                start = len(argv) - len(inner)
                self._on_argv(node, inner, nodes[start:])
            if base == "find" and "-delete" in rest and is_root(rest[0] or ""):
                self.report(node, "destroy", what="`find / -delete`")
            return
        if base in t.SHELLS or base == "eval" or base in {"source", "."}:
            self._on_shell(node, base, rest, nodes[1:])
        elif t.PYTHON.fullmatch(base):
            self._on_python(node, rest, nodes[1:])
        self._on_network(node, base, rest)
        self._on_package(node, base, rest)
        self._on_writes(node, base, rest)

    def _on_shell(
        self, node: Node, base: str, rest: list[str | None], nodes: list[Node | None]
    ) -> None:
        if any(n is not None and fetches(self.words, n) for n in nodes):
            self.report(node, "pipe-to-shell", what=f"`{base}` of downloaded code")
            return
        if any(n is not None and decodes(self.words, n) for n in nodes):
            self.report(node, "eval-decoded", what=f"`{base}`")
            return
        if base == "eval":
            if rest and None not in rest:
                self.nested(node, " ".join(w for w in rest if w is not None), "bash", "eval")
            elif rest:
                self.report(node, "eval", what="eval of a computed string")
            return
        if base in {"source", "."}:
            if rest and rest[0] is None:
                self.report(node, "eval", what=f"`{base}` of a computed file")
            return
        if "-c" in rest:
            i = rest.index("-c") + 1
            code, where = (rest[i], nodes[i] or node) if i < len(rest) else (None, node)
            if code is not None:
                self.nested(where, code, "bash", f"the `{base} -c` string")
            elif i < len(rest):
                self.report(node, "eval", what=f"`{base} -c` of a computed string")

    def _on_python(self, node: Node, rest: list[str | None], nodes: list[Node | None]) -> None:
        if "-c" in rest:
            i = rest.index("-c") + 1
            code, where = (rest[i], nodes[i] or node) if i < len(rest) else (None, node)
            if code is not None:
                self.nested(where, code, "python", "the `python -c` string")
            elif i < len(rest):
                self.report(node, "eval", what="`python -c` of a computed string")
        if rest[:2] in (["-m", "pip"], ["-m", "ensurepip"]) or "-mpip" in rest:
            self.report(node, "package", what="`python -m pip`")

    def _on_network(self, node: Node, base: str, rest: list[str | None]) -> None:
        if self.network:
            return
        sub = rest[0] if rest else None
        remote = base == "rsync" and any(w and (":" in w.split("/")[0]) for w in rest)
        if (
            base in t.NETWORK_TOOLS
            or remote
            or (base == "git" and sub in t.GIT_NETWORK)
            or (base == "openssl" and sub == "s_client")
        ):
            self.report(node, "network", what=f"`{base}`")

    def _on_package(self, node: Node, base: str, rest: list[str | None]) -> None:
        key = "pip" if base.startswith("pip") and base[3:].replace(".", "").isdigit() else base
        if key not in t.PACKAGE_MANAGERS:
            return
        subcommands = t.PACKAGE_MANAGERS[key]
        words = [w for w in rest if w is not None]
        if subcommands is None:
            hit = not words or words[0] not in {"--version", "-V", "--help", "-h", "help"}
        else:
            hit = any(w in subcommands for w in words[:3])
        if hit:
            self.report(node, "package", what="`" + " ".join([base, *words[:2]]) + "`")

    def _on_writes(self, node: Node, base: str, rest: list[str | None]) -> None:
        words = [w for w in rest if w is not None]
        paths = [w for w in words if not w.startswith("-")]
        if base == "rm" and destroys(words):
            self.report(node, "destroy", what="`rm " + " ".join(words) + "`")
            return
        if base.startswith("mkfs") or (
            base == "dd" and any(w.startswith("of=/dev/") and w != "of=/dev/null" for w in words)
        ):
            self.report(node, "destroy", what=f"`{base}` on a device")
            return
        if base in t.WRITERS:
            targets = paths
        elif base in t.COPIERS:
            pairs = itertools.pairwise(words)
            t_dir = [b for a, b in pairs if a in {"-t", "--target-directory"}]
            targets = t_dir or (paths[-1:] if len(paths) >= 2 else [])
        elif base == "dd":
            targets = [w[3:] for w in paths if w.startswith("of=")]
        else:
            return
        roots = ", ".join(self.roots)
        for p in targets:
            if self._outside(p):
                self.report(node, "write-outside", what=f"`{base}`", path=p, roots=roots)

    def _outside(self, path: str) -> bool:
        # /dev/fd/N is a descriptor the script already holds, not a place on disk.
        if path.startswith("/") and ("/" + posixpath.normpath(path).lstrip("/")).startswith(
            "/dev/fd/"
        ):
            return False
        return outside_roots(path, self.roots, benign=_BENIGN)

    # -- redirections, pipelines, background ----------------------------------------------

    def _on_redirect(self, node: Node) -> None:
        ops = {c.type for c in node.children if not c.is_named}
        if any(c.type == "ERROR" and self._rw_redirect(c) for c in node.children):
            ops.add("<>")
        for dest in node.children_by_field_name("destination"):
            path = self.words.value(dest)
            if path is None or dest.type == "number":
                continue
            if path.startswith(("/dev/tcp/", "/dev/udp/")):
                if not self.network:
                    self.report(node, "network", what=f"a redirection to {path}")
            elif ops & _WRITE_OPS and self._outside(path):
                roots = ", ".join(self.roots)
                self.report(node, "write-outside", what="a redirection", path=path, roots=roots)

    def _on_fed_text(self, node: Node) -> None:
        """A heredoc or here-string: checked as code when it is fed to a shell or to Python."""
        if node.type == "herestring_redirect":
            command = node.parent
            where = next(iter(node.named_children), None)
            code = self.words.value(where) if where is not None else None
        else:  # heredoc_body, under heredoc_redirect, under the redirected statement
            statement = node.parent.parent if node.parent is not None else None
            command = statement.child_by_field_name("body") if statement is not None else None
            where, code = node, text(node)
        if command is None or command.type != "command" or where is None or code is None:
            return
        argv = self.words.argv(command)
        name = posixpath.basename(argv[0]) if argv and argv[0] else ""
        if name in t.SHELLS:
            self.nested(where, code, "bash", f"the script fed to `{name}`")
        elif t.PYTHON.fullmatch(name):
            self.nested(where, code, "python", f"the code fed to `{name}`")

    def _on_pipeline(self, node: Node) -> None:
        stages = [c for c in node.named_children if c.type != "comment"]
        if node.parent is not None and node.parent.type == "heredoc_redirect":
            # `cat <<EOF | sh`: the heredoc is the first stage's input.
            statement = node.parent.parent
            body = statement.child_by_field_name("body") if statement is not None else None
            heredoc = next((c for c in node.parent.children if c.type == "heredoc_body"), None)
            stages = [s for s in (body, heredoc) if s is not None] + stages
        for i, stage in enumerate(stages[1:], start=1):
            runner = stdin_runner(self.words, stage)
            if runner is None:
                continue
            upstream = stages[:i]
            what = f"piping into `{runner}`"
            if any(fetches(self.words, u) for u in upstream):
                self.report(stage, "pipe-to-shell", what=what)
            elif any(decodes(self.words, u) for u in upstream):
                self.report(stage, "eval-decoded", what=what)
            else:
                fed = static_output(self.words, upstream[-1])
                if fed is not None and runner in t.SHELLS:
                    self.nested(upstream[-1], fed, "bash", f"the text piped into `{runner}`")
                else:
                    self.report(stage, "eval", what=what)

    def _on_ampersand(self, node: Node) -> None:
        """``job &``: a background job, which outlives the script unless it is waited for."""
        job = node.prev_named_sibling
        if job is None:
            return
        # Waited for if a `wait` follows in this shell: before the end of the enclosing
        # subshell (whose jobs its parent shell cannot wait for), or of the script.
        scope = node.parent
        while scope is not None and scope.type != "subshell" and scope.parent is not None:
            scope = scope.parent
        end = scope.end_byte if scope is not None else len(self.src)
        waited = any(node.end_byte <= w < end for w in self.waits)
        label = f"`{text(job).splitlines()[0][:40]} &`"
        self.report(job, "background-waited" if waited else "background", what=label)

    def _on_function(self, node: Node) -> None:
        name_node, body = node.child_by_field_name("name"), node.child_by_field_name("body")
        if name_node is None or body is None:
            return
        name = text(name_node)
        calls = [n for n in walk(body) if n.type == "command" and self.words.argv(n) == [name]]
        if len(calls) >= 2 and any(n.type == "&" for n in walk(body)):
            self.report(node, "fork-bomb", what=f"the self-spawning function `{name}`")
