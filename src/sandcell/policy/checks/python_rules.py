"""Python checks on the syntax tree: what the code imports, calls and reaches for.

Names are resolved before rules match them (see :mod:`._python_names`), so the rules see
through aliases, ``getattr`` with constant names, ``__import__("o" + "s")``, ``sys.modules``,
``vars(m)`` and ``m.__dict__``. The parser NFKC-normalises identifiers (``ｅｘｅｃ`` is
``exec``), and strings handed to ``exec`` are checked in turn.

What they cannot see: values that flow through containers, function returns or files, and code
that only exists at run time. That is why a computed ``exec``, ``eval`` or import is a finding
of its own, and why the sandbox, not this module, is the boundary.
"""

from __future__ import annotations

import ast
import posixpath
import re
from collections.abc import Collection, Sequence

from sandcell.policy.checks._python_names import (
    CATEGORIES,
    EXEC_BUILTINS,
    GLOBALS,
    IMPORT_FUNCS,
    NETWORK_CATEGORY,
    SAFE_STDLIB,
    Resolver,
    call_rule,
    norm,
    prefix_in,
)
from sandcell.policy.checks.findings import Finding, Severity, outside_roots, snippet_of

__all__ = ["SAFE_STDLIB", "check_python"]

_MESSAGES: dict[str, tuple[str, Severity, str]] = {
    "import": ("py.import", "warning",
               "{how} of {module} is outside this profile's import allowlist; use the standard "
               "library or the allowed packages, or run with a profile that allows {top}"),
    "import-value": ("py.dynamic-code", "warning",
                     "{name} used as a value hides which module is imported; use import"),
    "import-computed": ("py.dynamic-code", "warning",
                        "{fn}() with a computed module name cannot be checked against the "
                        "profile; import the module by name"),
    "import-built": ("py.dynamic-code", "warning",
                     "{fn}() of a module name built from pieces ({name!r}) is a common way to "
                     "hide an import; write import {name}"),
    "exec-indirect": ("py.dynamic-code", "deny",
                      "{fn} is used indirectly, so the code it runs cannot be checked; write "
                      "the code out directly"),
    "exec-computed": ("py.dynamic-code", "deny",
                      "{fn}() of a computed string runs code that cannot be checked (decoded, "
                      "downloaded or built at run time); write the code out directly"),
    "exec-literal": ("py.dynamic-code", "warning",
                     "{fn}() of a constant string; write the code out directly (the string "
                     "was checked too)"),
    "exec-deep": ("py.dynamic-code", "deny",
                  "{fn}() of code that nests {fn}() too deep to check; write the code out"),
    "getattr-value": ("py.reflection", "warning",
                      "getattr passed as a value hides which attributes are read; access them "
                      "directly"),
    "getattr-computed": ("py.reflection", "warning",
                         "getattr() on {target} with a computed name can reach any of its "
                         "functions (os.system, exec); name the attribute directly"),
    "getattr-built": ("py.reflection", "warning",
                      "getattr() with a name built from pieces ({name!r}) is a common way to "
                      "hide what is reached; name the attribute directly"),
    "builtins": ("py.reflection", "warning",
                 "__builtins__ reaches every builtin by name, a common way around the checks; "
                 "call builtins directly"),
    "setattr-module": ("py.reflection", "warning",
                       "{fn}() on module {target} patches it; define your own function instead"),
    "internals": ("py.reflection", "warning",
                  "{attr} walks the interpreter's internals, a known sandbox-escape route; "
                  "data analysis never needs it"),
    "module-dict": ("py.reflection", "warning",
                    "{base}.__dict__ reaches the module's members by computed name; use them "
                    "directly"),
    "module-patch": ("py.reflection", "warning",
                     "assigning {base}.{attr} patches a module; define your own function "
                     "instead"),
    "namespace-computed": ("py.reflection", "warning",
                           "a computed key into sys.modules or globals() hides what is "
                           "reached; use names directly"),
    "namespace-write": ("py.reflection", "warning",
                        "writing into globals()/vars() rebinds names behind the code's back; "
                        "assign variables normally"),
    "allow-pickle": ("py.deserialize", "deny",
                     "allow_pickle lets a data file run code when it is loaded; keep arrays in "
                     "formats without pickles (numeric .npy, CSV, Parquet)"),
    "url": ("py.network", "warning",
            "{fn}() of {text!r} fetches over the network, which this profile does not give; "
            "put the data in the run's inputs"),
    "path": ("py.path", "warning",
             "{fn}() of {text!r} is outside the workspace and inputs ({roots}); host files are "
             "not visible in the sandbox: read inputs from /inputs, write to the working "
             "directory"),
}  # fmt: skip

_REFLECT_ATTRS = frozenset(
    [
        *("__subclasses__", "__globals__", "__builtins__", "__code__", "__closure__"),
        *("__mro__", "__bases__", "__base__", "__getattribute__", "__loader__", "__spec__"),
        *("f_globals", "f_locals", "f_builtins", "f_back", "gi_frame", "cr_frame", "tb_frame"),
    ]
)
"""Attributes that lead from any object to the interpreter's internals (the classic
``().__class__.__base__.__subclasses__()`` walk, frames, function globals)."""
_REFLECT_STRINGS = tuple(sorted((a for a in _REFLECT_ATTRS if a.startswith("__")), key=len))
_MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__"})
_PATH_FUNCS = frozenset(
    [
        *("open", "Path", "PurePath", "PosixPath", "listdir", "scandir", "walk", "stat"),
        *("lstat", "readlink", "chdir", "exists", "isfile", "isdir", "islink", "getsize"),
        *("copy", "copy2", "copyfile", "copytree", "rmtree", "move", "glob", "iglob", "remove"),
        *("unlink", "rmdir", "mkdir", "makedirs", "rename", "load", "loadtxt", "genfromtxt"),
        *("fromfile", "savetxt", "save", "savefig", "imread", "imsave", "connect", "ZipFile"),
        *("TarFile", "getline"),
    ]
)
"""Functions whose string arguments are paths (plus every ``read_*``/``to_*``, as in pandas)."""
_PATH_KEYWORDS = frozenset({"path", "file", "filepath_or_buffer", "fname", "filename", "io"})
_BENIGN_PATHS = frozenset({"/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr"})
_URL = re.compile(r"^(https?|ftp|sftp|s3|gs|gcs|az|abfs|hdfs|wss?)://", re.IGNORECASE)
_MAX_DEPTH = 4
"""How deep strings given to ``exec`` are checked in turn; deeper nesting is a finding."""


def check_python(
    code: str,
    *,
    allowed_imports: Collection[str] | None,
    network: bool,
    readable_roots: Sequence[str] = ("/sandbox", "/home/user", "/inputs", "/tmp"),
) -> list[Finding]:
    """Check Python source; return the findings in source order.

    ``allowed_imports`` lists the top-level modules a profile allows besides
    :data:`SAFE_STDLIB`; ``None`` allows any import. ``network`` says whether the profile gives
    the run a network (if not, network modules and URLs are findings). Path literals outside
    ``readable_roots`` (absolute, ``~``, or climbing out with ``..``) are findings too.
    """
    allowed = None if allowed_imports is None else SAFE_STDLIB | set(allowed_imports)
    roots = tuple(posixpath.normpath(r) for r in readable_roots)
    return _Checker(code, allowed=allowed, network=network, roots=roots, depth=0).run()


class _Checker(Resolver):
    """One pass over one piece of source; see :func:`check_python`."""

    def __init__(
        self,
        code: str,
        *,
        allowed: frozenset[str] | None,
        network: bool,
        roots: tuple[str, ...],
        depth: int,
    ) -> None:
        super().__init__()
        self.code = code
        self.lines = re.split(r"\r\n|\r|\n", code)
        self.allowed = allowed
        self.network = network
        self.roots = roots
        self.depth = depth
        self.findings: list[Finding] = []
        self.reported_modules: set[str] = set()
        self.category_sites: set[tuple[str, int]] = set()
        self.parents: dict[ast.AST, ast.AST] = {}

    def report(self, node: ast.AST, key: str, **values: object) -> None:
        rule, severity, template = _MESSAGES[key]
        self.add(node, rule, severity, template.format(**values))

    def add(self, node: ast.AST, rule: str, severity: Severity, message: str) -> None:
        line = getattr(node, "lineno", 1)
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        # ast columns are UTF-8 byte offsets; people count characters.
        offset = getattr(node, "col_offset", 0)
        column = len(text.encode()[:offset].decode(errors="replace")) + 1
        self.findings.append(Finding(rule, severity, line, column, message, snippet_of(text)))

    def run(self) -> list[Finding]:
        try:
            tree = ast.parse(self.code)
        except SyntaxError as exc:
            line, col = exc.lineno or 1, exc.offset or 1
            text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
            msg = f"the code does not parse ({exc.msg}); it cannot run, so fix the syntax first"
            return [Finding("py.syntax", "deny", line, col, msg, snippet_of(text))]
        except (ValueError, RecursionError, MemoryError) as exc:
            msg = f"the code cannot be parsed ({exc}); it cannot run as it is"
            return [Finding("py.syntax", "deny", 1, 1, msg, snippet_of(self.lines[0]))]
        try:
            self._analyse(tree)
        except RecursionError:
            msg = "the code is nested too deeply to check; flatten the expressions"
            self.findings.append(Finding("py.syntax", "deny", 1, 1, msg, ""))
        return sorted(self.findings, key=lambda f: (f.line, f.column, f.rule_id))

    def _analyse(self, tree: ast.Module) -> None:
        # One walk of the tree, in ast.walk's order, keeps its nodes for the passes below:
        # walking it again for each pass was most of the checks' CPU on a run's path.
        nodes: list[ast.AST] = [tree]
        docstrings: set[ast.AST] = set()
        i = 0
        while i < len(nodes):
            node = nodes[i]
            i += 1
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
                nodes.append(child)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                docstrings.add(node.value)
        self.collect(nodes)
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                self._on_import_stmt(node)
            elif isinstance(node, ast.Constant) and node not in docstrings:
                self._on_string(node)
            elif isinstance(node, ast.Attribute):
                self._on_attribute(node)
            elif isinstance(node, ast.Call):
                self._on_call(node)
            elif isinstance(node, ast.Subscript):
                self._on_subscript(node)
            stored = isinstance(getattr(node, "ctx", None), ast.Store | ast.Del)
            if isinstance(node, ast.Name | ast.Attribute | ast.Subscript | ast.Call) and not stored:
                resolved = self.resolve(node)
                if resolved is not None:
                    self._on_reference(node, resolved)

    # -- imports ------------------------------------------------------------------------------

    def _on_import_stmt(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                self.on_import(node, norm(a.name), "import")
        elif node.module and not node.level:
            module = norm(node.module)
            self.on_import(node, module, "import")
            for a in node.names:
                if a.name != "*":
                    self._on_reference(node, f"{module}.{norm(a.name)}")

    def on_import(self, node: ast.AST, module: str, how: str) -> None:
        """An import of ``module`` by any means: the allowlist, then the module's kind."""
        self.modules.add(module)
        top = module.split(".", maxsplit=1)[0]
        if self.allowed is not None and top not in self.allowed and module not in self.allowed:
            self.report(node, "import", how=how, module=module, top=top)
        self._module_category(node, module, how)

    def _module_category(self, node: ast.AST, name: str, how: str) -> None:
        categories = CATEGORIES if self.network else (*CATEGORIES, NETWORK_CATEGORY)
        for modules, rule, severity, why, advice in categories:
            m = prefix_in(name, modules)
            if m is not None:
                # One finding per module and line: __import__("ctypes").CDLL is one use.
                site = (m, getattr(node, "lineno", 0))
                if site not in self.category_sites:
                    self.category_sites.add(site)
                    self.add(node, rule, severity, f"{how} of {m} {why}; {advice}")
                self.reported_modules.add(m)
                return

    def _on_import_call(self, call: ast.Call, fn: str) -> None:
        short = fn.removeprefix("builtins.")
        if not call.args:
            return
        name = self.fold(call.args[0])
        if name is None:
            self.report(call, "import-computed", fn=short)
            return
        if not isinstance(call.args[0], ast.Constant):
            self.report(call, "import-built", fn=short, name=name)
        self.on_import(call, norm(name), short + "()")

    # -- names --------------------------------------------------------------------------------

    def _on_reference(self, node: ast.AST, name: str) -> None:
        """Any mention of a resolved name: calls, values, defaults and ``from`` imports."""
        parent = self.parents.get(node)
        call = parent if isinstance(parent, ast.Call) and parent.func is node else None
        if name in EXEC_BUILTINS:
            self._on_exec(node, name.removeprefix("builtins."), call)
        elif name in IMPORT_FUNCS:
            if call is not None:
                self._on_import_call(call, name)
            else:
                self.report(node, "import-value", name=name)
        elif isinstance(node, ast.Name) and norm(node.id) == "__builtins__":
            self.report(node, "builtins")
        elif name == "builtins.getattr" and call is None:
            self.report(node, "getattr-value")
        elif (rule := call_rule(name)) is not None:
            self.add(node, *rule)
        else:
            # A risky module reached without an import statement of its own (``import urllib``
            # then ``urllib.request.urlopen``) is reported once, where it is first used.
            m = prefix_in(name, tuple(m for c in (*CATEGORIES, NETWORK_CATEGORY) for m in c[0]))
            if m is not None and m not in self.reported_modules:
                self._module_category(node, m, "use")

    def _on_exec(self, node: ast.AST, fn: str, call: ast.Call | None) -> None:
        if call is None or not call.args:
            self.report(node, "exec-indirect", fn=fn)
            return
        literal = self.fold(call.args[0])
        if literal is None:
            self.report(node, "exec-computed", fn=fn)
            return
        self.report(node, "exec-literal", fn=fn)
        if self.depth >= _MAX_DEPTH:
            self.report(node, "exec-deep", fn=fn)
            return
        inner = _Checker(
            literal, allowed=self.allowed, network=self.network, roots=self.roots,
            depth=self.depth + 1,
        )  # fmt: skip
        for f in inner.run():
            if f.rule_id != "py.syntax":  # a literal that does not parse fails harmlessly
                self.add(node, f.rule_id, f.severity, f"in the string given to {fn}(): {f.message}")

    def _on_attribute(self, node: ast.Attribute) -> None:
        attr = norm(node.attr)
        if attr in _REFLECT_ATTRS:
            self.report(node, "internals", attr="." + attr)
            return
        base = self.resolve(node.value)
        if base is None or not self.is_module(base):
            return
        if attr == "__dict__":
            self.report(node, "module-dict", base=base)
        elif isinstance(node.ctx, ast.Store | ast.Del):
            self.report(node, "module-patch", base=base, attr=attr)

    def _on_subscript(self, node: ast.Subscript) -> None:
        base, key = self.resolve(node.value), self.fold(node.slice)
        if base in {"sys.modules", GLOBALS} and key is None:
            self.report(node, "namespace-computed")
        elif base == "sys.modules" and key is not None:
            self.on_import(node, norm(key), "sys.modules lookup")
        if base == GLOBALS and isinstance(node.ctx, ast.Store | ast.Del):
            self.report(node, "namespace-write")

    def _on_string(self, node: ast.Constant) -> None:
        # Catches getattr(x, "__subclasses__"), "{0.__globals__}".format(f) and the like.
        if isinstance(node.value, str) and len(node.value) <= 4096:
            hit = next((a for a in _REFLECT_STRINGS if a in node.value), None)
            if hit is not None:
                self.report(node, "internals", attr=f"the string {hit!r}")

    # -- calls --------------------------------------------------------------------------------

    def _on_call(self, node: ast.Call) -> None:
        func, args = self.resolve(node.func), node.args
        if func in {"builtins.getattr", "builtins.setattr", "builtins.delattr"} and args:
            target = self.resolve(args[0])
            if target is not None and self.is_module(target):
                if func != "builtins.getattr":
                    self.report(node, "setattr-module", fn=func[9:], target=target)
                elif len(args) >= 2 and self.fold(args[1]) is None:
                    self.report(node, "getattr-computed", target=target)
        if func == "builtins.getattr" and len(args) >= 2 and not isinstance(args[1], ast.Constant):
            name = self.fold(args[1])
            if name is not None:
                self.report(node, "getattr-built", name=name)
        target = self.resolve(args[0]) if func == "builtins.vars" and args else None
        if target is not None and self.is_module(target):
            self.report(node, "module-dict", base=target)
        attr = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if attr in _MUTATORS and self.resolve(getattr(node.func, "value", node.func)) == GLOBALS:
            self.report(node, "namespace-write")
        for k in node.keywords:
            if k.arg == "allow_pickle" and not (
                isinstance(k.value, ast.Constant) and k.value.value is False
            ):
                self.report(node, "allow-pickle")
        self._on_paths(node, func)

    def _on_paths(self, node: ast.Call, func: str | None) -> None:
        name = func.rsplit(".", 1)[-1] if func else None
        if name is None and isinstance(node.func, ast.Attribute):
            name = node.func.attr  # a method of an unknown object: df.to_csv(...)
        if name is None or not (name in _PATH_FUNCS or name.startswith(("read_", "to_"))):
            return
        values = [*node.args, *(k.value for k in node.keywords if k.arg in _PATH_KEYWORDS)]
        for arg in values:
            text = self.fold(arg)
            if not text:
                continue
            if _URL.match(text):
                if not self.network:
                    self.report(arg, "url", fn=name, text=text[:60])
            elif self._outside(text):
                self.report(arg, "path", fn=name, text=text[:60], roots=", ".join(self.roots))

    def _outside(self, path: str) -> bool:
        """Whether a path literal points outside the readable roots."""
        return outside_roots(path, self.roots, benign=_BENIGN_PATHS)
