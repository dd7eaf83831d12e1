"""JavaScript and TypeScript checks on a real parse (tree-sitter): what the program loads and runs.

Every way of loading a module counts: ``import``, ``export ... from``, ``import()``,
``require()`` (also as ``module.require``, ``require.call``/``apply``, ``createRequire(...)``),
TypeScript's ``import x = require()``, with or without the ``node:`` prefix. Names are resolved
first (see :mod:`._js_names`), so the rules see through aliases, destructuring, strings built
from literals and computed keys that fold to a constant (``globalThis["req" + "uire"]``);
strings given to ``eval``, ``Function`` and ``vm`` are checked in turn.

What they cannot see: values that flow through containers, function returns or callbacks, and
code that only exists at run time. That is why a computed ``eval`` or import is a finding of
its own, and why the sandbox (and Node's permission model, :mod:`sandcell.runtimes.node.flags`)
is the boundary, not this module.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Collection, Sequence

import tree_sitter_javascript
import tree_sitter_typescript
from tree_sitter import Language, Node, Parser

from sandcell.policy.checks._js_names import (
    CATEGORIES,
    EXEC_FUNCS,
    GLOBAL_OBJECT,
    IMPORT_FUNCS,
    NETWORK_CATEGORY,
    NODE_SAFE_BUILTINS,
    SENSITIVE,
    TIMERS,
    Names,
    module_name,
    text,
    top_of,
    unwrap,
    walk,
)
from sandcell.policy.checks.findings import Finding, Severity, outside_roots, snippet_of

__all__ = ["NODE_SAFE_BUILTINS", "check_javascript"]

_JS = Language(tree_sitter_javascript.language())
_TS = Language(tree_sitter_typescript.language_typescript())
_MAX_DEPTH = 4
"""How deep strings given to ``eval`` are checked in turn; deeper nesting is a finding."""

_MESSAGES: dict[str, tuple[str, Severity, str]] = {
    "syntax": ("js.syntax", "deny",
               "the code does not parse near {near!r}; it cannot run, so fix the syntax first"),
    "missing": ("js.syntax", "deny",
                "the code does not parse: {near!r} is missing; it cannot run, so fix the "
                "syntax first"),
    "deep-nesting": ("js.syntax", "deny",
                     "the code is nested too deeply to check; flatten the expressions"),
    "import": ("js.import", "warning",
               "{how} of {module!r} is outside this profile's import allowlist; use Node's "
               "built-in modules or the runtime's packages, or run with a profile that allows "
               "{top!r}"),
    "import-value": ("js.dynamic-code", "warning",
                     "{name} used as a value hides which module is loaded; call it with the "
                     "module's name, or use import"),
    "import-computed": ("js.dynamic-code", "warning",
                        "{how} with a computed module name cannot be checked against the "
                        "profile; load the module by name"),
    "import-built": ("js.dynamic-code", "warning",
                     "{how} of a module name built from pieces ({name!r}) is a common way to "
                     "hide an import; write the name out"),
    "import-code": ("js.dynamic-code", "deny",
                    "{how} of {spec!r} runs code from a URL, which cannot be checked; write "
                    "the code out directly"),
    "native-module": ("js.native", "deny",
                      "{how} of {spec!r} loads native code that bypasses JavaScript and its "
                      "checks; use pure JavaScript or an allowed package"),
    "native": ("js.native", "deny",
               "{name} loads native code or reaches Node's internal bindings, a known "
               "sandbox-escape route; use pure JavaScript"),
    "inspector-use": ("js.inspector", "deny",
                      "{name} starts or reaches the debugger, which runs whatever it is sent; "
                      "remove it"),
    "inspector-flag": ("js.inspector", "warning",
                       "the string {flag!r} asks for Node's debugger, which runs whatever it is "
                       "sent; remove it"),
    "exec-indirect": ("js.dynamic-code", "deny",
                      "{fn} is used indirectly, so the code it runs cannot be checked; write "
                      "the code out directly"),
    "exec-computed": ("js.dynamic-code", "deny",
                      "{fn}() of a computed string runs code that cannot be checked (decoded, "
                      "downloaded or built at run time); write the code out directly"),
    "exec-literal": ("js.dynamic-code", "warning",
                     "{fn}() of a constant string; write the code out directly (the string "
                     "was checked too)"),
    "exec-deep": ("js.dynamic-code", "deny",
                  "{fn}() of code that nests {fn}() too deep to check; write the code out"),
    "constructor": ("js.dynamic-code", "deny",
                    "{what} reaches the Function constructor, which runs strings as code; "
                    "write the code out directly"),
    "reflect-computed": ("js.reflection", "warning",
                         "a computed key into {target} can reach any of its members (require, "
                         "process.binding); name the member directly"),
    "reflect-built": ("js.reflection", "warning",
                      "a key into {target} built from pieces ({name!r}) is a common way to "
                      "hide what is reached; name the member directly"),
    "reflect-api": ("js.reflection", "warning",
                    "{fn} on {target} reaches its members without naming them; use them "
                    "directly"),
    "network-global": ("js.network", "warning",
                       "{name} is for network access, which this profile does not give; put the "
                       "data in the run's inputs, or use a profile with network access"),
    "url": ("js.network", "warning",
            "{fn}() of {text!r} fetches over the network, which this profile does not give; "
            "put the data in the run's inputs"),
    "path": ("js.path", "warning",
             "{fn}() of {text!r} is outside the workspace and inputs ({roots}); host files are "
             "not visible in the sandbox: read inputs from /inputs, write to the working "
             "directory"),
    "import-path": ("js.path", "warning",
                    "{how} of {text!r} is outside the workspace and inputs ({roots}); load "
                    "modules from the working directory or the runtime's packages"),
}  # fmt: skip

_NATIVE_NAMES = (
    "process.dlopen",
    "process.binding",
    "process._linkedBinding",
    "module:module._extensions",
)
_INSPECTOR_NAMES = (
    "process._debugProcess",
    "process._debugEnd",
    "process._startProfilerIdleNotifier",
)
_NETWORK_GLOBALS = frozenset({"fetch", "WebSocket", "EventSource", "XMLHttpRequest"})
_REFLECT_FUNCS = frozenset(
    [
        *("Reflect.get", "Reflect.apply", "Reflect.construct", "Reflect.ownKeys"),
        *("Reflect.getOwnPropertyDescriptor", "Object.getOwnPropertyDescriptor"),
        *("Object.getOwnPropertyDescriptors", "Object.getOwnPropertyNames", "Object.entries"),
        *("Object.values",),
    ]
)
_FUNCTION_LITERALS = frozenset(
    {"function_expression", "arrow_function", "generator_function", "class", "function"}
)
_PATH_FUNCS = frozenset(
    [
        *("readFile", "readFileSync", "writeFile", "writeFileSync", "appendFile"),
        *("appendFileSync", "createReadStream", "createWriteStream", "open", "openSync"),
        *("readdir", "readdirSync", "opendir", "opendirSync", "stat", "statSync", "lstat"),
        *("lstatSync", "access", "accessSync", "existsSync", "unlink", "unlinkSync", "rm"),
        *("rmSync", "rmdir", "rmdirSync", "mkdir", "mkdirSync", "copyFile", "copyFileSync"),
        *("cp", "cpSync", "rename", "renameSync", "readlink", "readlinkSync", "realpath"),
        *("realpathSync", "chmod", "chmodSync", "symlink", "symlinkSync", "watch", "truncate"),
        *("truncateSync", "chdir", "glob", "globSync", "parseFile"),
    ]
)
"""Functions whose string arguments are paths (fs and its promise API, ``process.chdir``)."""
_STRINGISH = frozenset({"string", "template_string", "binary_expression"})
"""A timer's first argument of these kinds is a string of code, not a function."""
_BENIGN_PATHS = frozenset({"/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr"})
_URL = re.compile(r"^(https?|ftp|wss?)://", re.IGNORECASE)
_INSPECT_FLAG = re.compile(r"--inspect(-brk|-port|-wait|-publish-uid)?\b")
_NOT_REFERENCES = frozenset(
    [
        *("import_statement", "import_specifier", "export_specifier", "formal_parameters"),
        *("required_parameter", "optional_parameter", "labeled_statement"),
        *("break_statement", "continue_statement", "pair_pattern", "object_pattern"),
        *("array_pattern", "rest_pattern", "catch_clause"),
    ]
)
"""Parents under which an identifier names a binding or a label, not a value read."""


def check_javascript(
    code: str,
    *,
    typescript: bool,
    allowed_imports: Collection[str] | None,
    network: bool,
    readable_roots: Sequence[str] = ("/sandbox", "/home/user", "/tmp", "/inputs", "/dev/shm"),
) -> list[Finding]:
    """Check JavaScript (or, with ``typescript``, TypeScript) source; findings in source order.

    ``allowed_imports`` lists the packages a profile allows besides :data:`NODE_SAFE_BUILTINS`
    (the runtime's locked packages, say); ``None`` allows any import. ``network`` says whether
    the profile gives the run a network (if not, network modules, ``fetch`` and URLs are
    findings). Path literals outside ``readable_roots`` are findings too.
    """
    allowed = None if allowed_imports is None else NODE_SAFE_BUILTINS | set(allowed_imports)
    roots = tuple(posixpath.normpath(r) for r in readable_roots)
    checker = _Checker(code, typescript=typescript, allowed=allowed, network=network, roots=roots)
    return checker.run(depth=0)


class _Checker:
    """One pass over one program; see :func:`check_javascript`."""

    def __init__(
        self,
        code: str,
        *,
        typescript: bool,
        allowed: frozenset[str] | None,
        network: bool,
        roots: tuple[str, ...],
    ) -> None:
        self.code = code
        self.src = code.encode()
        self.lines = self.src.split(b"\n")
        self.typescript = typescript
        self.allowed = allowed
        self.network = network
        self.roots = roots
        self.findings: list[Finding] = []
        self.category_sites: set[tuple[str, int]] = set()
        self.reported_modules: set[str] = set()
        self.depth = 0

    # -- reporting ------------------------------------------------------------------------

    def report(self, node: Node, key: str, **values: object) -> None:
        rule, severity, template = _MESSAGES[key]
        self.add(node, rule, severity, template.format(**values))

    def add(self, node: Node, rule: str, severity: Severity, message: str) -> None:
        row, col = node.start_point
        # tree-sitter columns are byte offsets; people count characters.
        raw = self.lines[row] if row < len(self.lines) else b""
        column = len(raw[:col].decode(errors="replace")) + 1
        line = raw.decode(errors="replace").rstrip("\r")
        self.findings.append(Finding(rule, severity, row + 1, column, message, snippet_of(line)))

    # -- the walk -------------------------------------------------------------------------

    def run(self, depth: int) -> list[Finding]:
        self.depth = depth
        root = Parser(_TS if self.typescript else _JS).parse(self.src).root_node
        try:
            if self._syntax(root):
                return self.findings
            self.names = Names(root)
            for node in self.names.nodes:
                self._visit(node)
        except RecursionError:
            self.findings = []
            self.report(root, "deep-nesting")
        return sorted(self.findings, key=lambda f: (f.line, f.column, f.rule_id))

    def _syntax(self, root: Node) -> bool:
        if not root.has_error:
            return False
        for node in walk(root):
            if node.is_missing:
                self.report(node.parent or node, "missing", near=node.type)
                return True
            if node.type == "ERROR":
                self.report(node, "syntax", near=text(node).split("\n")[0][:40])
                return True
        self.report(root, "syntax", near=text(root).split("\n")[0][:40])
        return True

    def _visit(self, node: Node) -> None:
        kind = node.type
        if kind == "import_statement":
            self._on_import_statement(node)
        elif kind == "export_statement":
            source = node.child_by_field_name("source")
            if source is not None:
                self._on_specifier(node, source, "re-export")
        elif kind in {"call_expression", "new_expression"}:
            self._on_call(node)
            if kind == "call_expression" and self.names.callee(node)[0] == "Reflect.get":
                reached = self.names.resolve(node)  # Reflect.get(process, "binding")
                if reached is not None:
                    self._on_reference(node, reached)
        elif kind == "subscript_expression":
            self._on_subscript(node)
        elif kind in {"string", "template_string"}:
            self._on_string(node)
        elif kind == "with_statement":
            target = self.names.resolve(node.child_by_field_name("object"))
            if target is not None and _sensitive(target):
                self.report(node, "reflect-api", fn="with", target=_label(target))
        if kind in {"member_expression", "subscript_expression"}:
            self._on_constructor_chain(node)
        references = {
            "identifier", "shorthand_property_identifier", "member_expression",
            "subscript_expression",
        }  # fmt: skip
        if kind in references and self._is_reference(node):
            name = self.names.resolve(node)
            if name is not None:
                self._on_reference(node, name)

    def _is_reference(self, node: Node) -> bool:
        parent = self.names.parent(node)
        if parent is None or parent.type in _NOT_REFERENCES:
            return False
        if (
            parent.type in {"member_expression", "subscript_expression"}
            and parent.child_by_field_name("object") == node
        ):
            # The object of a member is part of the member, which is checked as a whole, unless
            # the member cannot be resolved (a computed key): then the object is what is known.
            return self.names.resolve(parent) is None
        if parent.type == "variable_declarator" and parent.child_by_field_name("name") == node:
            return False
        if parent.type == "assignment_pattern" and parent.child_by_field_name("left") == node:
            return False
        if parent.type in {"assignment_expression", "augmented_assignment_expression"}:
            return parent.child_by_field_name("left") != node
        if parent.type in {"unary_expression", "binary_expression"}:
            op = parent.child_by_field_name("operator")
            return op is None or op.type not in {"typeof", "instanceof"}
        return node.type != "identifier" or parent.type not in {
            "function_declaration", "class_declaration", "method_definition",
            "generator_function_declaration", "shorthand_property_identifier_pattern",
        }  # fmt: skip

    # -- imports --------------------------------------------------------------------------

    def _on_import_statement(self, node: Node) -> None:
        if any(c.type == "type" for c in node.children):
            return  # `import type`: erased before the program runs, nothing is loaded
        source = node.child_by_field_name("source")
        if source is not None:
            self._on_specifier(node, source, "import")
        for child in node.named_children:
            if child.type == "import_require_clause":
                lit = next((c for c in child.named_children if c.type == "string"), None)
                if lit is not None:
                    self._on_specifier(node, lit, "import = require()")

    def _on_specifier(self, node: Node, spec_node: Node, how: str) -> None:
        spec = self.names.fold(spec_node)
        if spec is None:
            self.report(node, "import-computed", how=how)
            return
        if not _literal(spec_node) and how in {"require()", "import()"}:
            self.report(node, "import-built", how=how, name=spec)
        self.on_import(node, spec, how)

    def on_import(self, node: Node, spec: str, how: str) -> None:
        """A load of ``spec`` by any means: what kind of thing it is, then the allowlist."""
        lowered = spec.lower()
        if lowered.startswith(("data:", "http:", "https:", "blob:")):
            self.report(node, "import-code", how=how, spec=spec[:60])
            return
        if lowered.split("?")[0].endswith(".node"):
            self.report(node, "native-module", how=how, spec=spec[:60])
            return
        if spec.startswith(("/", ".", "file:", "~")):
            path = spec.removeprefix("file://")
            if outside_roots(path, self.roots, benign=_BENIGN_PATHS):
                self.report(
                    node, "import-path", how=how, text=spec[:60], roots=", ".join(self.roots)
                )
            return
        name = module_name(spec)
        top = top_of(name)
        if self.allowed is not None and top not in self.allowed and name not in self.allowed:
            self.report(node, "import", how=how, module=spec, top=top)
        self._module_category(node, top, how)

    def _module_category(self, node: Node, top: str, how: str) -> bool:
        categories = CATEGORIES if self.network else (*CATEGORIES, NETWORK_CATEGORY)
        for modules, rule, severity, why, advice in categories:
            if top in modules:
                # One finding per module and line: require("child_process").execSync is one use.
                site = (top, node.start_point[0])
                if site not in self.category_sites:
                    self.category_sites.add(site)
                    self.add(node, rule, severity, f"{how} of {top} {why}; {advice}")
                self.reported_modules.add(top)
                return True
        return False

    # -- calls ----------------------------------------------------------------------------

    def _on_call(self, node: Node) -> None:
        spec = self.names.import_spec(node) if node.type == "call_expression" else None
        if spec is not None:
            fn_node = node.child_by_field_name("function")
            how = "import()" if fn_node is not None and fn_node.type == "import" else "require()"
            self._on_specifier(node, spec[0], how)
            return
        fn_node = node.child_by_field_name("function") or node.child_by_field_name("constructor")
        fn, args = self.names.callee(node)
        if fn is None:
            self._on_paths(node, fn_node, args, None)
            return
        if fn in EXEC_FUNCS:
            self._on_exec(node, fn, args)
        elif (
            fn in TIMERS
            and args
            and (self.names.fold(args[0]) is not None or unwrap(args[0]).type in _STRINGISH)
        ):
            self._on_exec(node, fn, args[:1])
        elif fn in _REFLECT_FUNCS or fn == "Proxy":
            target = self.names.resolve(args[0]) if args else None
            if target is not None and _sensitive(target):
                self.report(node, "reflect-api", fn=fn, target=_label(target))
        self._on_paths(node, fn_node, args, fn)

    def _on_exec(self, node: Node, fn: str, args: list[Node]) -> None:
        short = fn.removeprefix("module:")
        if not args:
            return
        if fn == "Function":
            parts = [self.names.fold(a) for a in args]
            if None in parts:
                self.report(node, "exec-computed", fn=short)
                return
            body = parts[-1] or ""
            code = f"(function ({', '.join(p or '' for p in parts[:-1])}) {{\n{body}\n}})"
        else:
            folded = self.names.fold(args[0])
            if folded is None:
                self.report(node, "exec-computed", fn=short)
                return
            code = folded
        self.report(node, "exec-literal", fn=short)
        if self.depth >= _MAX_DEPTH:
            self.report(node, "exec-deep", fn=short)
            return
        inner = _Checker(
            code, typescript=False, allowed=self.allowed, network=self.network, roots=self.roots
        )
        for f in inner.run(self.depth + 1):
            if f.rule_id != "js.syntax":  # a literal that does not parse fails harmlessly
                self.add(
                    node, f.rule_id, f.severity, f"in the string given to {short}(): {f.message}"
                )

    def _on_paths(self, node: Node, fn_node: Node | None, args: list[Node], fn: str | None) -> None:
        name = fn.rsplit(".", 1)[-1] if fn else None
        if name is None and fn_node is not None:
            fn_node = unwrap(fn_node)
            if fn_node.type == "member_expression":
                name = text(fn_node.child_by_field_name("property") or fn_node)
            elif fn_node.type == "identifier":
                name = text(fn_node)
        if name is None or name not in _PATH_FUNCS:
            return
        for arg in args[:2]:
            value = self.names.fold(arg)
            if not value:
                continue
            if _URL.match(value):
                if not self.network:
                    self.report(arg, "url", fn=name, text=value[:60])
            elif outside_roots(value, self.roots, benign=_BENIGN_PATHS):
                self.report(arg, "path", fn=name, text=value[:60], roots=", ".join(self.roots))

    # -- names ----------------------------------------------------------------------------

    def _on_reference(self, node: Node, name: str) -> None:
        """Any read of a resolved name: calls, values, arguments, members."""
        parent = self.names.parent(node)
        called = (
            parent is not None
            and parent.type in {"call_expression", "new_expression"}
            and (
                parent.child_by_field_name("function") == node
                or parent.child_by_field_name("constructor") == node
            )
        )
        member_of = parent is not None and parent.type == "member_expression"
        head, _, last = name.rpartition(".")
        via = last if head and last in {"call", "apply", "bind"} else None
        base = head if via else name
        # eval.call(null, s) is a call of eval (checked as one); eval.bind, or eval.call
        # passed around, hides the code it will run.
        hidden = via == "bind" or (not called and (via is not None or not member_of))
        if base in EXEC_FUNCS:
            if hidden:
                self.report(node, "exec-indirect", fn=base.removeprefix("module:"))
        elif base in IMPORT_FUNCS:
            if hidden:
                self.report(node, "import-value", name=base.removeprefix("module:"))
        elif _under(name, _NATIVE_NAMES):
            self.report(node, "native", name=name.removeprefix("module:"))
        elif _under(name, _INSPECTOR_NAMES):
            self.report(node, "inspector-use", name=name)
        elif name in _NETWORK_GLOBALS and not self.network:
            self.report(node, "network-global", name=name)
        elif name.startswith("module:"):
            # A module reached without a load the checks saw (an alias of an alias) is
            # reported once, where it is first used.
            top = top_of(name[7:].split(".", maxsplit=1)[0])
            if top not in self.reported_modules:
                self._module_category(node, top, "use")

    def _on_subscript(self, node: Node) -> None:
        base = self.names.resolve(node.child_by_field_name("object"))
        if base is None or not _sensitive(base):
            return
        index = node.child_by_field_name("index")
        key = self.names.fold(index)
        if key is None:
            self.report(node, "reflect-computed", target=_label(base))
        elif index is not None and unwrap(index).type != "string":
            self.report(node, "reflect-built", target=_label(base), name=key)

    def _on_constructor_chain(self, node: Node) -> None:
        """``x.constructor.constructor`` and ``(() => {}).constructor`` are ``Function``."""
        if self._member_key(node) != "constructor":
            return
        obj = node.child_by_field_name("object")
        inner = unwrap(obj) if obj is not None else None
        if inner is None:
            return
        if inner.type in {"member_expression", "subscript_expression"} and (
            self._member_key(inner) == "constructor"
        ):
            self.report(node, "constructor", what="`.constructor.constructor`")
        elif inner.type in _FUNCTION_LITERALS or (
            inner.type == "call_expression"
            and self.names.resolve(inner.child_by_field_name("function"))
            in {"Object.getPrototypeOf", "Reflect.getPrototypeOf"}
        ):
            self.report(node, "constructor", what="the constructor of a function")

    def _member_key(self, node: Node) -> str | None:
        if node.type == "member_expression":
            prop = node.child_by_field_name("property")
            return text(prop) if prop is not None else None
        if node.type == "subscript_expression":
            return self.names.fold(node.child_by_field_name("index"))
        return None

    def _on_string(self, node: Node) -> None:
        parent = self.names.parent(node)
        if parent is not None and parent.type in {"string", "template_string"}:
            return
        raw = text(node)
        if len(raw) <= 4096 and (m := _INSPECT_FLAG.search(raw)) is not None:
            self.report(node, "inspector-flag", flag=m.group(0))


def _literal(node: Node) -> bool:
    """A string literal, or a template literal without substitutions."""
    node = unwrap(node)
    return node.type == "string" or (
        node.type == "template_string"
        and not any(c.type == "template_substitution" for c in node.named_children)
    )


def _under(name: str, prefixes: Sequence[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _sensitive(name: str) -> bool:
    return name in SENSITIVE or (name.startswith("module:") and "." not in name[7:])


def _label(name: str) -> str:
    return "the global object" if name == GLOBAL_OBJECT else name.removeprefix("module:")
