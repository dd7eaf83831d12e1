"""Static values of shell words on the tree-sitter-bash parse, and the command tables.

:class:`Words` evaluates what a word would be when the shell runs it, where that is knowable
without running anything: quoting and backslashes removed (``c\\url``, ``"cu""rl"``), ANSI-C
strings decoded (``$'\\x63url'``), variables assigned a constant once in the script expanded
(``a=cu; $a"rl"``), ``$IFS`` taken as the space it is by default, and ``$(echo curl)`` or
``$(printf 'cu\\x72l')`` folded. Anything else (positional parameters, the environment, the
output of real commands) is unknown: ``None``.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator

from tree_sitter import Node

NETWORK_TOOLS = frozenset(
    [
        *("curl", "wget", "nc", "ncat", "netcat", "socat", "ssh", "scp", "sftp", "telnet"),
        *("ftp", "tftp", "ping", "ping6", "traceroute", "dig", "nslookup", "host", "whois"),
        *("aria2c", "lynx", "links", "elinks", "w3m", "http", "https", "xh", "fetch"),
    ]
)
"""Commands whose job is the network (``rsync``, ``git`` and ``openssl`` depend on arguments)."""
FETCH_TOOLS = frozenset({"curl", "wget", "nc", "ncat", "netcat", "socat", "aria2c", "fetch"})
"""Network tools that print what they download, so their output can be piped into a shell."""
DECODERS = frozenset({"base64", "base32", "xxd", "uudecode", "openssl", "gzip", "zcat", "rev"})
"""Commands that turn an encoded payload back into code."""
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "busybox"})
INTERPRETERS = frozenset({"perl", "ruby", "node", "php", "lua", "Rscript"})
PYTHON = re.compile(r"python[0-9.]*|pypy[0-9.]*")
GIT_NETWORK = frozenset({"clone", "fetch", "pull", "push", "ls-remote", "submodule", "remote"})

PACKAGE_MANAGERS: dict[str, frozenset[str] | None] = {
    # name → subcommands that install (None: every use except asking for help or a version)
    "pip": frozenset({"install", "download", "uninstall", "wheel"}),
    "pipx": None, "uv": None, "poetry": frozenset({"add", "install", "update", "lock"}),
    "pdm": None, "conda": None, "mamba": None, "micromamba": None, "easy_install": None,
    "apt": None, "apt-get": None, "aptitude": None, "dpkg": frozenset({"-i", "--install"}),
    "yum": None, "dnf": None, "rpm": frozenset({"-i", "-U", "--install", "--upgrade"}),
    "apk": None, "pacman": None, "zypper": None, "brew": None, "snap": None, "flatpak": None,
    "nix-env": None, "npm": frozenset({"install", "i", "add", "ci", "update", "exec", "x"}),
    "npx": None, "pnpm": frozenset({"install", "i", "add", "update", "dlx"}),
    "yarn": frozenset({"add", "install", "global", "dlx"}), "bun": frozenset({"add", "install"}),
    "gem": frozenset({"install", "update"}), "cargo": frozenset({"install", "add"}),
    "go": frozenset({"install", "get"}), "composer": None, "cpan": None, "cpanm": None,
}  # fmt: skip
WRAPPERS = frozenset(
    [
        *("sudo", "doas", "env", "nohup", "setsid", "nice", "ionice", "timeout", "stdbuf"),
        *("time", "command", "builtin", "exec", "xargs", "chroot", "taskset", "daemon"),
    ]
)
"""Commands that run their arguments as a command; the inner command is checked too."""
BACKGROUND = frozenset({"nohup", "setsid", "disown", "daemon", "screen", "tmux", "at", "batch"})
WRITERS = frozenset(
    [
        *("touch", "mkdir", "rm", "rmdir", "chmod", "chown", "chgrp", "truncate", "shred"),
        *("unlink", "tee"),
    ]
)
"""Commands that write (or remove) every path they are given."""
COPIERS = frozenset({"cp", "mv", "install", "ln", "rsync"})
"""Commands that write to their last path argument, or to ``-t DIR``."""

_ANSI = re.compile(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}|.)")
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "f": "\f"}


def text(node: Node) -> str:
    """The node's source text."""
    return (node.text or b"").decode(errors="replace")


def decode_escapes(raw: str) -> str:
    """Bash's ``$'...'`` and ``printf`` backslash escapes (``\\x63``, ``\\143``, ``\\u0063``)."""

    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] in "xuU" and len(e) > 1:
            return chr(min(int(e[1:], 16), 0x10FFFF))
        if e[0].isdigit():
            return chr(int(e, 8))
        return _SIMPLE.get(e, e)

    return _ANSI.sub(one, raw)


def walk(node: Node) -> Iterator[Node]:
    """Every node under ``node`` (itself included), depth first, without recursion."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


class Words:
    """Static values of words in one script; variables come from its constant assignments."""

    def __init__(self, root: Node) -> None:
        self.variables: dict[str, str | None] = {"IFS": " "}
        assignments = [n for n in walk(root) if n.type == "variable_assignment"]
        # Two rounds let b=$a pick up a=... written later in the file, as a loop would.
        for _ in range(2):
            seen: dict[str, str | None] = {}
            for a in assignments:
                name_node, value_node = (
                    a.child_by_field_name("name"),
                    a.child_by_field_name("value"),
                )
                if name_node is None:
                    continue
                value = "" if value_node is None else self.value(value_node)
                name = text(name_node)
                # A variable given two different values is unknown: which one wins is dynamic.
                seen[name] = value if seen.get(name, value) == value else None
            self.variables.update(seen)

    def value(self, node: Node) -> str | None:
        """What the word ``node`` expands to, or ``None`` when that depends on the run."""
        kind = node.type
        if kind in {"word", "command_name"} and node.named_child_count == 0:
            return re.sub(r"\\(.)", r"\1", text(node).replace("\\\n", ""))
        if kind == "number":
            return text(node)
        if kind == "raw_string":
            return text(node)[1:-1]
        if kind == "ansi_c_string":
            return decode_escapes(text(node)[2:-1])
        if kind == "string_content":
            return re.sub(r'\\([\\"$`])', r"\1", text(node).replace("\\\n", ""))
        if kind in {"string", "concatenation", "command_name"}:
            parts = [self.value(c) for c in node.children if c.type not in {'"', "$"}]
            return None if None in parts else "".join(p or "" for p in parts)
        if kind == "simple_expansion" or (kind == "expansion" and node.named_child_count == 1):
            var = next((c for c in node.named_children if c.type == "variable_name"), None)
            return None if var is None else self.variables.get(text(var))
        if kind == "command_substitution":
            return self._substitute(node)
        return None

    def _substitute(self, node: Node) -> str | None:
        commands = [c for c in node.named_children]
        if len(commands) != 1 or commands[0].type != "command":
            return None
        argv = self.argv(commands[0])
        if argv is None or None in argv:
            return None
        words = [w for w in argv if w is not None]
        if words[0] == "echo":
            return " ".join(w for w in words[1:] if w not in {"-n", "-e", "-E"})
        if words[0] == "printf" and len(words) == 2 and "%" not in words[1]:
            return decode_escapes(words[1])
        return None

    def argv(self, command: Node) -> list[str | None] | None:
        """The command's words as it would run them; ``None`` if its name is not knowable.

        A name containing spaces (from ``$IFS`` or a variable) is split as the shell splits it.
        """
        name_node = command.child_by_field_name("name")
        if name_node is None:
            return None
        name = self.value(name_node)
        # An empty name, or one the shell would glob (``/usr/bin/cu?l``), is not knowable.
        if not name or not name.split() or any(c in text(name_node) for c in "*?["):
            return None
        args = [self.value(a) for a in command.children_by_field_name("argument")]
        return [*name.split(), *args]


WRAPPER_OPTIONS: dict[str, frozenset[str]] = {
    # Options of wrappers that take a value as the next word (``sudo -u root curl``).
    "sudo": frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U"}),
    "doas": frozenset({"-u", "-C"}),
    "env": frozenset({"-u", "-C", "-S", "--unset", "--chdir"}),
    "nice": frozenset({"-n"}),
    "ionice": frozenset({"-c", "-n", "-p"}),
    "timeout": frozenset({"-s", "-k", "--signal", "--kill-after"}),
    "stdbuf": frozenset({"-i", "-o", "-e"}),
    "xargs": frozenset({"-I", "-n", "-P", "-d", "-L", "-s", "-E", "-a"}),
}


def inside_error(node: Node) -> bool:
    while node is not None:
        if node.type == "ERROR":
            return True
        if node.parent is None:
            return False
        node = node.parent
    return False


def is_root(path: str) -> bool:
    """Whether ``path`` is ``/`` or everything in it (``/*``), however it is spelled."""
    if not path.startswith("/"):
        return False
    norm = "/" + posixpath.normpath(path).lstrip("/")
    return norm in {"/", "/*"}


def destroys(words: list[str]) -> bool:
    """``rm -r`` of ``/`` or ``/*``, or any ``rm --no-preserve-root``."""
    if "--no-preserve-root" in words:
        return True
    recursive = any(
        w == "--recursive"
        or (
            (w.startswith("-") and not w.startswith("--") and w.strip("-fvi"))
            and ("r" in w or "R" in w)
        )
        for w in words
    )
    return recursive and any(is_root(w) for w in words if not w.startswith("-"))


def command_names(words: Words, node: Node) -> list[str]:
    """Base names of the commands anywhere under ``node`` whose names are knowable."""
    out: list[str] = []
    for n in walk(node):
        argv = words.argv(n) if n.type == "command" else None
        if argv and argv[0]:
            out.append(posixpath.basename(argv[0]))
    return out


def fetches(words: Words, node: Node) -> bool:
    return any(n in FETCH_TOOLS for n in command_names(words, node))


def decodes(words: Words, node: Node) -> bool:
    return any(n in DECODERS for n in command_names(words, node))


def stdin_runner(words: Words, stage: Node) -> str | None:
    """The interpreter a pipeline stage is, when it runs the code on its stdin."""
    if stage.type == "redirected_statement":
        stage = stage.child_by_field_name("body") or stage
    if stage.type != "command":
        return None
    argv = words.argv(stage)
    if not argv or argv[0] is None:
        return None
    name = posixpath.basename(argv[0])
    if name in WRAPPERS and (inner := inner_command(name, argv[1:])) and inner[0]:
        name, argv = posixpath.basename(inner[0]), inner
    if not (name in SHELLS or name in INTERPRETERS or PYTHON.fullmatch(name)):
        return None
    # With a script file or -c/-e code, stdin is data, not code (unless -s says otherwise).
    if "-s" in argv[1:]:
        return name
    script = [w for w in argv[1:] if w is None or not w.startswith("-") or w in {"-c", "-e"}]
    return name if not script or script == ["-"] else None


def static_output(words: Words, stage: Node) -> str | None:
    """What an ``echo``/``printf`` stage or a heredoc prints, when that is static."""
    if stage.type == "heredoc_body":
        return text(stage)
    if stage.type != "command":
        return None
    argv = words.argv(stage)
    if not argv or None in argv or argv[0] not in {"echo", "printf"}:
        return None
    return " ".join(w for w in argv[1:] if w is not None and w not in {"-n", "-e"})


def inner_command(base: str, rest: list[str | None]) -> list[str | None] | None:
    """The command a wrapper runs (``sudo -u x curl ...`` → ``curl ...``), if it is visible."""
    if base == "find":
        for flag in ("-exec", "-execdir", "-ok", "-okdir"):
            if flag in rest:
                i = rest.index(flag) + 1
                end = next((j for j in range(i, len(rest)) if rest[j] in {";", "+"}), len(rest))
                return rest[i:end] or None
        return None
    takes_value = WRAPPER_OPTIONS.get(base, frozenset())
    i, skip_positional = 0, 1 if base in {"timeout", "chroot", "taskset"} else 0
    while i < len(rest):
        w = rest[i]
        if w is None:
            return None
        if w == "--":
            i += 1
            break
        if w.startswith("-"):
            i += 2 if w in takes_value else 1
        elif base == "env" and "=" in w:
            i += 1
        elif skip_positional:
            skip_positional -= 1
            i += 1
        else:
            break
    return rest[i:] or None
