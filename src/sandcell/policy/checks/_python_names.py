"""Name resolution for the Python checks: what an expression stands for, before rules match it.

:class:`Resolver` turns expressions into dotted names (``o.system`` after ``import os as o`` is
``os.system``; ``getattr(__builtins__, "ex" + "ec")`` is ``builtins.exec``) and folds strings
built only from literals. It follows aliases, ``getattr``/``operator.attrgetter`` with constant
names, ``__import__``/``importlib.import_module``, ``sys.modules[...]``, ``globals()[...]``,
``vars(m)[...]`` and ``m.__dict__[...]``. It does not follow values through containers,
function returns, loops or files: those stay unresolved, and the rules flag the computed forms.
"""

from __future__ import annotations

import ast
import builtins
import posixpath
import re
import unicodedata
from collections.abc import Sequence

from sandcell.policy.checks.findings import Severity

SAFE_STDLIB: frozenset[str] = frozenset(
    [
        *("__future__", "abc", "argparse", "array", "base64", "binascii", "bisect", "bz2"),
        *("calendar", "cmath", "collections", "colorsys", "contextlib", "copy", "csv"),
        *("dataclasses", "datetime", "decimal", "difflib", "enum", "fnmatch", "fractions"),
        *("functools", "glob", "graphlib", "gzip", "hashlib", "heapq", "html", "io"),
        *("itertools", "json", "logging", "lzma", "math", "numbers", "operator", "os"),
        *("pathlib", "pprint", "queue", "random", "re", "secrets", "shutil", "statistics"),
        *("string", "struct", "sys", "tempfile", "textwrap", "time", "tomllib", "types"),
        *("typing", "unicodedata", "uuid", "warnings", "weakref", "zipfile", "zlib", "zoneinfo"),
        *("codecs", "http", "importlib", "platform", "sqlite3", "traceback", "urllib", "xml"),
    ]
)
"""Standard-library modules allowed whenever a profile has an import allowlist. ``os`` and
``sys`` are in: their dangerous parts (``os.system``, ``os.exec*``, ``sys.modules[...]``) are
findings of their own, and ``os.path`` is what most analysis scripts need."""

Category = tuple[tuple[str, ...], str, Severity, str, str]
"""Modules of one kind, their rule, its severity, what they allow and what to do instead."""
CATEGORIES: tuple[Category, ...] = (
    (("subprocess", "pty", "pexpect", "plumbum"), "py.process", "warning",
     "lets the code start processes",
     "compute in Python; if a tool is really needed use a profile that allows it"),
    (("ctypes", "_ctypes", "cffi"), "py.native", "deny",
     "loads native code that bypasses Python and its checks",
     "use pure Python or an allowed package that wraps the library"),
    (("pickle", "_pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle"),
     "py.deserialize", "warning", "can turn bytes into running code",
     "exchange data as JSON, CSV or Parquet instead"),
)  # fmt: skip
NETWORK_CATEGORY: Category = (
    (
        *("socket", "ssl", "http.client", "http.server", "http.cookiejar", "urllib.request"),
        *("urllib3", "requests", "httpx", "aiohttp", "ftplib", "smtplib", "poplib", "imaplib"),
        *("nntplib", "telnetlib", "xmlrpc", "socketserver", "asyncore", "websocket"),
        *("websockets", "paramiko", "pycurl", "grpc"),
    ),
    "py.network", "warning", "is for network access, which this profile does not give",
    "put the data in the run's inputs, or use a profile with network access",
)  # fmt: skip
CATEGORY_MODULES: tuple[str, ...] = tuple(m for c in (*CATEGORIES, NETWORK_CATEGORY) for m in c[0])
KNOWN_MODULES = SAFE_STDLIB | set(CATEGORY_MODULES) | {"builtins", "importlib", "os.path"}

_CALL_RULES: tuple[tuple[re.Pattern[str], str, Severity, str], ...] = (
    (re.compile(
        r"os\.(system|popen|fork|forkpty|posix_spawnp?|startfile|exec\w*|spawn\w*)"
        r"|subprocess\.(?!(PIPE|DEVNULL|STDOUT|CalledProcessError|TimeoutExpired"
        r"|CompletedProcess|SubprocessError)$)\w+|pty\.(spawn|fork)|asyncio\.create_subprocess_\w+"),
     "py.process", "warning",
     "{name} starts a process; sandboxed code should compute in Python; if a tool is really "
     "needed use a profile that allows it"),
    (re.compile(
        r"(pickle|_pickle|dill|cloudpickle)\.(loads?|Unpickler)|marshal\.loads?|shelve\.open"
        r"|joblib\.load|pandas\.read_pickle"),
     "py.deserialize", "deny",
     "{name} can run arbitrary code hidden in the data it loads; exchange data as JSON, CSV "
     "or Parquet instead"),
    (re.compile(
        r"importlib\.(reload|util\.spec_from_\w+|util\.module_from_spec|machinery\.\w+Loader)"
        r"|types\.(FunctionType|CodeType|LambdaType)|code\.(interact|Interactive\w+)"
        r"|codeop\.\w+|runpy\.run_\w+|pdb\.(set_trace|run\w*)|builtins\.breakpoint"),
     "py.dynamic-code", "warning",
     "{name} builds or runs code at run time, out of the checks' sight; write the code out "
     "directly"),
    (re.compile(
        r"sys\._getframe|inspect\.(currentframe|stack|getouterframes)"
        r"|gc\.get_(objects|referrers)"),
     "py.reflection", "warning",
     "{name} inspects the interpreter's frames or objects, a known escape route; data "
     "analysis never needs it"),
)  # fmt: skip

EXEC_BUILTINS = frozenset({"builtins.exec", "builtins.eval", "builtins.compile"})
IMPORT_FUNCS = frozenset({"builtins.__import__", "importlib.__import__", "importlib.import_module"})
NAMESPACE_FUNCS = frozenset({"builtins.globals", "builtins.locals", "builtins.vars"})
GLOBALS = "<globals>"
"""What ``globals()``, ``locals()`` and ``vars()`` resolve to: subscripts of it are names."""
_BUILTIN_NAMES = frozenset(dir(builtins))


def _int(node: ast.AST) -> int | None:
    """The value of an integer literal, negative ones included."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def call_rule(name: str) -> tuple[str, Severity, str] | None:
    """The rule, severity and message for a use of the fully resolved ``name``, if any."""
    for pattern, rule, severity, message in _CALL_RULES:
        if pattern.fullmatch(name):
            return rule, severity, message.format(name=name.removeprefix("builtins."))
    return None


def prefix_in(name: str, modules: Sequence[str]) -> str | None:
    """The module of ``modules`` that ``name`` is or lies inside, if any."""
    for m in modules:
        if name == m or name.startswith(m + "."):
            return m
    return None


def norm(name: str) -> str:
    """NFKC-normalise a name, as the parser does with identifiers (``ｅｘｅｃ`` is ``exec``)."""
    return unicodedata.normalize("NFKC", name)


class Resolver:
    """Dotted names for expressions of one module; call :meth:`collect` before resolving."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        """Local name → dotted name, from imports and simple assignments."""
        self.star_modules: list[str] = []
        """Modules imported with ``from m import *``: their risky names resolve bare."""
        self.modules: set[str] = {"builtins"}
        """Modules imported by name anywhere in the code."""

    def collect(self, nodes: Sequence[ast.AST]) -> None:
        """Learn aliases from every node of a tree (``nodes``, as :func:`ast.walk` yields them);
        a few rounds settle chains written in any order (``b = a; a = os``)."""
        for _ in range(3):
            for node in nodes:
                if isinstance(node, ast.Import):
                    for a in node.names:
                        name = norm(a.name)
                        self.modules.add(name)
                        top = name.split(".", maxsplit=1)[0]
                        self.aliases[norm(a.asname) if a.asname else top] = (
                            name if a.asname else top
                        )
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    module = norm(node.module)
                    self.modules.add(module)
                    for a in node.names:
                        if a.name == "*" and module not in self.star_modules:
                            self.star_modules.append(module)
                        elif a.name != "*":
                            self.aliases[norm(a.asname or a.name)] = f"{module}.{norm(a.name)}"
                elif isinstance(node, ast.Assign | ast.NamedExpr | ast.AnnAssign) and node.value:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    resolved = self.resolve(node.value)
                    for t in targets:
                        if isinstance(t, ast.Name) and resolved is not None:
                            self.aliases[norm(t.id)] = resolved

    def is_module(self, name: str) -> bool:
        """Whether ``name`` is a module (imported here, or one the rules know)."""
        return name in self.modules or name in KNOWN_MODULES

    def fold(self, node: ast.AST) -> str | None:
        """The string an expression built only from literals evaluates to, else ``None``."""
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.fold(node.left), self.fold(node.right)
            return None if left is None or right is None else left + right
        if isinstance(node, ast.JoinedStr):
            parts = [
                self.fold(v.value if isinstance(v, ast.FormattedValue) else v) for v in node.values
            ]
            return None if None in parts else "".join(p or "" for p in parts)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            base = self.fold(node.value)
            bounds = [node.slice.lower, node.slice.upper, node.slice.step]
            ints = [None if b is None else _int(b) for b in bounds]
            pairs = zip(bounds, ints, strict=True)
            if base is None or any(b is not None and v is None for b, v in pairs):
                return None
            lo, hi, step = ints
            return base[lo:hi:step] if step != 0 else None
        if isinstance(node, ast.Call):
            return self._fold_call(node)
        return None

    def _fold_call(self, node: ast.Call) -> str | None:
        func, args = node.func, node.args
        if node.keywords:
            return None
        if isinstance(func, ast.Attribute):
            if func.attr == "join" and len(args) == 1 and isinstance(args[0], ast.List | ast.Tuple):
                sep, parts = self.fold(func.value), [self.fold(e) for e in args[0].elts]
                if sep is not None and None not in parts:
                    return sep.join(p for p in parts if p is not None)
            raw = func.value
            if func.attr == "decode" and isinstance(raw, ast.Constant):
                return raw.value.decode(errors="replace") if isinstance(raw.value, bytes) else None
        resolved = self.resolve(func)
        if resolved == "builtins.chr" and len(args) == 1 and isinstance(args[0], ast.Constant):
            code = args[0].value
            return chr(code) if isinstance(code, int) and 0 <= code < 0x110000 else None
        folded = [self.fold(a) for a in args]
        strs = [f for f in folded if f is not None]
        if len(strs) != len(folded):
            return None
        if resolved in {"os.path.join", "posixpath.join"} and strs:
            return posixpath.join(*strs)
        if resolved == "builtins.str" and len(strs) == 1:
            return strs[0]
        if isinstance(func, ast.Attribute) and func.attr in {"lower", "upper", "strip", "replace"}:
            base = self.fold(func.value)
            try:
                return None if base is None else str(getattr(base, func.attr)(*strs))
            except TypeError:
                return None
        return None

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted name an expression stands for (``os.system``, ``builtins.exec``)."""
        if isinstance(node, ast.Name):
            return self._resolve_name(norm(node.id))
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{norm(node.attr)}" if base and base != GLOBALS else None
        if isinstance(node, ast.Subscript):
            key, base = self.fold(node.slice), self.resolve(node.value)
            return None if key is None or base is None else self._lookup(base, key)
        if isinstance(node, ast.Call):
            return self._resolve_call(node)
        return None

    def _resolve_name(self, name: str) -> str | None:
        if name in self.aliases:
            return self.aliases[name]
        if name == "__builtins__":
            return "builtins"
        if name in _BUILTIN_NAMES:
            return f"builtins.{name}"
        for m in self.star_modules:
            if call_rule(f"{m}.{name}") is not None:
                return f"{m}.{name}"
        return None

    def _lookup(self, base: str, key: str) -> str | None:
        """What ``base[key]`` names, for the namespaces that map names to objects."""
        key = norm(key)
        if base == "sys.modules":
            return key
        if base == GLOBALS:
            return self._resolve_name(key)
        if base.endswith(".__dict__"):
            return f"{base.removesuffix('.__dict__')}.{key}"
        if base == "builtins":  # __builtins__ is a dict outside __main__
            return f"builtins.{key}"
        return None

    def _resolve_call(self, node: ast.Call) -> str | None:
        func, args = self.resolve(node.func), node.args
        if func == "builtins.getattr" and len(args) >= 2:
            base, attr = self.resolve(args[0]), self.fold(args[1])
            return f"{base}.{norm(attr)}" if base and attr and base != GLOBALS else None
        if func in IMPORT_FUNCS and args:
            name = self.fold(args[0])
            if name is None:
                return None
            # __import__("a.b") returns a, unless a fromlist asks for a.b itself.
            whole = func == "importlib.import_module" or len(args) >= 4
            whole = whole or any(k.arg == "fromlist" for k in node.keywords)
            return norm(name) if whole else norm(name).split(".", maxsplit=1)[0]
        if func in NAMESPACE_FUNCS:
            if not args:
                return GLOBALS
            target = self.resolve(args[0])
            return f"{target}.__dict__" if target else None
        if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and args:
            key, base = self.fold(args[0]), self.resolve(node.func.value)
            return self._lookup(base, key) if key and base else None
        if isinstance(node.func, ast.Call) and node.func.args and args:
            # operator.attrgetter("system")(os)
            inner, attr = self.resolve(node.func.func), self.fold(node.func.args[0])
            base = self.resolve(args[0])
            if inner == "operator.attrgetter" and attr and base:
                return f"{base}.{norm(attr)}"
        return None
