"""Name resolution for the JavaScript checks: what an expression stands for, before rules match.

:class:`Names` turns expressions into dotted names (``cp.execSync`` after
``const cp = require("node:child_process")`` is ``module:child_process.execSync``;
``globalThis["req" + "uire"]`` is ``require``) and folds strings built only from literals
(``+``, template literals, ``[...].join("")``, ``.split("").reverse()``, ``String.fromCharCode``,
``.concat``). It follows aliases (``const r = require``, ``const {execSync: e} = ...``,
``import {execSync as e}``), ``require.call``/``apply``/``bind``, ``createRequire``,
``module.require``, ``Reflect.get`` with a constant key, ``(0, eval)`` and ``await import(...)``.

It reads the file as one scope: a name bound anywhere to something it can resolve stands for
that everywhere (a shadowing local never hides a global, so it cannot be used to hide one), and
a string variable is folded only when it is written exactly once. Values that flow through
containers, function returns, callbacks (``import(x).then(m => ...)``) or files are not followed:
those stay unresolved, and the rules flag the computed forms instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from tree_sitter import Node

from sandcell.policy.checks.findings import Severity

NODE_SAFE_BUILTINS: frozenset[str] = frozenset(
    [
        *("assert", "buffer", "console", "constants", "crypto", "diagnostics_channel"),
        *(
            "events",
            "fs",
            "module",
            "os",
            "path",
            "perf_hooks",
            "process",
            "punycode",
            "querystring",
        ),
        *("readline", "stream", "string_decoder", "timers", "url", "util", "zlib", "test"),
        *("async_hooks",),
    ]
)
"""Node built-in modules allowed whenever a profile has an import allowlist (with their
submodules: ``fs/promises``, ``path/posix``, ``stream/web``...). ``fs`` and ``process`` are in:
their dangerous parts (``process.binding``, ``process.dlopen``) are findings of their own, and
reading input files is what most programs need; ``module`` is in for ``createRequire``, its
``_load`` and ``_extensions`` being findings. Processes, networking, ``vm``, ``inspector``,
``wasi`` and ``v8`` are not: they are findings, and outside the allowlist too."""

Category = tuple[tuple[str, ...], str, Severity, str, str]
"""Modules of one kind, their rule, its severity, what they allow and what to do instead."""
CATEGORIES: tuple[Category, ...] = (
    (("child_process", "cluster", "worker_threads"), "js.process", "warning",
     "lets the code start processes or threads",
     "compute in JavaScript; if a tool is really needed use a profile that allows it"),
    (("wasi",), "js.native", "deny", "runs WebAssembly with system access",
     "use pure JavaScript or an allowed package"),
    (("v8",), "js.native", "warning", "changes the engine's flags and reads its heap",
     "data processing never needs it; remove it"),
    (("vm", "repl"), "js.dynamic-code", "warning", "runs strings as code",
     "write the code out directly"),
    (("inspector",), "js.inspector", "deny",
     "attaches a debugger that runs whatever it is sent, a known sandbox-escape route",
     "remove it; debug outside the sandbox"),
)  # fmt: skip
NETWORK_CATEGORY: Category = (
    (
        *("net", "http", "https", "http2", "dgram", "dns", "tls", "undici", "ws", "axios"),
        *("node-fetch", "got", "superagent", "socket.io-client", "request"),
    ),
    "js.network", "warning", "is for network access, which this profile does not give",
    "put the data in the run's inputs, or use a profile with network access",
)  # fmt: skip

GLOBAL_OBJECT = "globalThis"
_GLOBAL_ROOTS = frozenset({"globalThis", "global", "window", "self"})
_GLOBALS = frozenset(
    [
        *("require", "process", "module", "eval", "Function", "Reflect", "Proxy", "Object"),
        *("fetch", "WebSocket", "EventSource", "XMLHttpRequest", "setTimeout", "setInterval"),
        *("setImmediate", "String", "Array", "Buffer"),
    ]
)
IMPORT_FUNCS = frozenset({"require", "module:module._load"})
"""Functions that load a module named by their first argument."""
EXEC_FUNCS = frozenset(
    [
        *("eval", "Function", "module:vm.runInContext", "module:vm.runInNewContext"),
        *("module:vm.runInThisContext", "module:vm.Script", "module:vm.compileFunction"),
        *("module:vm.SourceTextModule",),
    ]
)
"""Functions that run a string (their code argument) as code."""
TIMERS = frozenset({"setTimeout", "setInterval", "setImmediate"})
"""Functions that run their first argument as code when it is a string."""
SENSITIVE = frozenset({GLOBAL_OBJECT, "process", "module", "require", "module:module"})
"""Objects whose members are reached by computed key only to hide which one is reached."""
_CANONICAL = {
    "module:process": "process",
    "module:timers.setTimeout": "setTimeout",
    "module:timers.setInterval": "setInterval",
    "module:timers.setImmediate": "setImmediate",
    "process.mainModule": "module",
    "require.main": "module",
    "module.require": "require",
    "module.constructor": "module:module",
    "module:module.Module": "module:module",
    "module:module.prototype.require": "require",
    "Function.prototype.constructor": "Function",
}
"""Different spellings of one thing, by prefix: ``process.mainModule.require`` is ``require``."""
_WRAPPERS = frozenset(
    {"parenthesized_expression", "as_expression", "non_null_expression", "satisfies_expression"}
)
"""Expressions (TypeScript's among them) that stand for their first named child."""
_PATTERN_PARENTS = frozenset(
    [
        *("formal_parameters", "required_parameter", "optional_parameter", "rest_pattern"),
        *("catch_clause", "for_in_statement", "array_pattern", "arrow_function"),
    ]
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "0": "\0"}
_ESCAPE = re.compile(r"\\(u\{[0-9a-fA-F]+\}|u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|\r?\n|.)", re.S)
_MAX_DEPTH = 40
_MAX_TEXT = 1 << 16
_T = TypeVar("_T")


def text(node: Node | None) -> str:
    return "" if node is None else (node.text or b"").decode(errors="replace")


def walk(root: Node) -> Iterator[Node]:
    """Every node under ``root``, in source order, without recursion."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


def unwrap(node: Node) -> Node:
    while node.type in _WRAPPERS and node.named_children:
        node = node.named_children[0]
    return node


def arguments(call: Node) -> list[Node]:
    """The arguments of a call or ``new`` expression (comments left out)."""
    args = call.child_by_field_name("arguments")
    if args is None or args.type != "arguments":
        return []
    return [a for a in args.named_children if a.type != "comment"]


def module_name(spec: str) -> str:
    """A module specifier as the rules compare it: without Node's ``node:`` prefix."""
    return spec.removeprefix("node:")


def top_of(name: str) -> str:
    """The package a specifier loads: ``lodash`` of ``lodash/fp``, ``@scope/x`` of
    ``@scope/x/y``, ``fs`` of ``fs/promises``."""
    parts = name.split("/")
    return "/".join(parts[:2]) if name.startswith("@") else parts[0]


def canonical(name: str) -> str:
    for _ in range(8):
        for prefix, to in _CANONICAL.items():
            if name == prefix or name.startswith(prefix + "."):
                name = to + name[len(prefix) :]
                break
        else:
            return name
    return name


def _unescape(raw: str) -> str:
    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if e.startswith("u{"):
            return chr(min(int(e[2:-1], 16), 0x10FFFF))
        if e[0] in "ux" and len(e) > 1:
            return chr(int(e[1:], 16))
        if e in {"\n", "\r\n"}:
            return ""  # a line continuation
        return _ESCAPES.get(e, e)

    return _ESCAPE.sub(one, raw)


@dataclass(frozen=True, slots=True)
class Binding:
    """What a name was bound to: an expression, a member of one, or a known name."""

    value: Node | None
    attr: str | None = None
    name: str | None = None


class Names:
    """Bindings of one program, and the folding and resolution that read them."""

    def __init__(self, root: Node) -> None:
        self.bindings: dict[str, list[Binding]] = {}
        self.writes: dict[str, int] = {}
        self._busy: set[int] = set()
        # Results by node: a chain of bindings that each use the one before twice
        # (``b = a + a; c = b + b``) is folded in linear time, not exponential.
        self._folded: dict[int, str | None] = {}
        self._resolved: dict[int, str | None] = {}
        # A name stands for the same thing everywhere (one scope), so it is resolved once.
        self._by_name: dict[str, str | None] = {}
        self._busy_names: set[str] = set()
        # Parents by node id: tree-sitter finds a node's parent by walking down from the root,
        # which made a large program's check quadratic.
        self.parents: dict[int, Node] = {}
        self.nodes: list[Node] = []
        """Every named node, in source order."""
        stack = [root]
        while stack:
            node = stack.pop()
            if node.is_named:  # punctuation and keywords carry no rule
                self.nodes.append(node)
            children = node.children
            for child in children:
                self.parents[child.id] = node
            stack.extend(reversed(children))
        for node in self.nodes:
            self._collect(node)
        # Folds made while collecting saw only the bindings before them.
        self._folded.clear()
        self._resolved.clear()
        self._by_name.clear()

    def parent(self, node: Node) -> Node | None:
        return self.parents.get(node.id)

    # -- bindings -------------------------------------------------------------------------

    def _bind(self, name: str, binding: Binding) -> None:
        self.bindings.setdefault(name, []).append(binding)
        self.writes[name] = self.writes.get(name, 0) + 1

    def _bind_pattern(self, pattern: Node, value: Node | None) -> None:
        if pattern.type == "identifier":
            self._bind(text(pattern), Binding(value))
        elif pattern.type == "object_pattern":
            for p in pattern.named_children:
                if p.type == "shorthand_property_identifier_pattern":
                    self._bind(text(p), Binding(value, attr=text(p)))
                elif p.type == "pair_pattern":
                    key, local = p.child_by_field_name("key"), p.child_by_field_name("value")
                    attr = self.fold(key) if key is not None else None
                    if local is not None and local.type == "assignment_pattern":
                        local = local.child_by_field_name("left")
                    if local is not None and local.type == "identifier" and attr is not None:
                        self._bind(text(local), Binding(value, attr=attr))
                    elif local is not None:
                        self._bind_pattern(local, None)
                elif p.type == "object_assignment_pattern":
                    left = p.child_by_field_name("left")
                    if left is not None:
                        self._bind(text(left), Binding(value, attr=text(left)))
        else:
            for ident in walk(pattern):
                if ident.type in {"identifier", "shorthand_property_identifier_pattern"}:
                    self._bind(text(ident), Binding(None))

    def _collect(self, node: Node) -> None:
        kind = node.type
        if kind == "variable_declarator":
            name, value = node.child_by_field_name("name"), node.child_by_field_name("value")
            if name is not None:
                self._bind_pattern(name, value)
        elif kind == "assignment_expression":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            if left is not None and left.type in {"identifier", "object_pattern"}:
                self._bind_pattern(left, right)
        elif kind in {"augmented_assignment_expression", "update_expression"}:
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            if target is not None and target.type == "identifier":
                self._bind(text(target), Binding(None))
        elif kind == "identifier":
            parent = self.parent(node)
            if parent is not None and _is_parameter(node, parent):
                self._bind(text(node), Binding(None))
        elif kind == "import_statement":
            self._collect_import(node)

    def _collect_import(self, node: Node) -> None:
        source = node.child_by_field_name("source")
        spec = self.fold(source) if source is not None else None
        for child in node.named_children:
            if child.type == "import_require_clause":  # TypeScript: import cp = require("x")
                ident = child.named_children[0] if child.named_children else None
                lit = child.child_by_field_name("source") or next(
                    (c for c in child.named_children if c.type == "string"), None
                )
                found = self.fold(lit) if lit is not None else None
                if ident is not None and found is not None:
                    self._bind(text(ident), Binding(None, name="module:" + module_name(found)))
            if child.type != "import_clause" or spec is None:
                continue
            base = "module:" + module_name(spec)
            for part in walk(child):
                if part.type == "import_specifier":
                    orig, alias = (
                        part.child_by_field_name("name"),
                        part.child_by_field_name("alias"),
                    )
                    local = alias or orig
                    if orig is not None and local is not None:
                        attr = self.fold(orig) if orig.type == "string" else text(orig)
                        if attr is not None:
                            self._bind(text(local), Binding(None, name=f"{base}.{attr}"))
                elif part.type == "namespace_import":
                    ident = next((c for c in part.named_children if c.type == "identifier"), None)
                    if ident is not None:
                        self._bind(text(ident), Binding(None, name=base))
                elif part.type == "identifier" and self.parents.get(part.id, part).id == child.id:
                    self._bind(text(part), Binding(None, name=base))  # the default import

    # -- folding --------------------------------------------------------------------------

    def fold(self, node: Node | None, depth: int = 0) -> str | None:
        """The string ``node`` always evaluates to, if it is built from literals only."""
        if node is None or depth > _MAX_DEPTH:
            return None
        if node.id not in self._folded:
            self._folded[node.id] = self._fold(unwrap(node), depth)
        return self._folded[node.id]

    def _fold(self, node: Node, depth: int) -> str | None:
        kind = node.type
        if kind in {"string", "template_string"}:
            parts: list[str] = []
            for c in node.named_children:
                if c.type == "string_fragment":
                    parts.append(text(c))
                elif c.type == "escape_sequence":
                    parts.append(_unescape(text(c)))
                elif c.type == "template_substitution":
                    inner = self.fold(c.named_children[0] if c.named_children else None, depth + 1)
                    if inner is None:
                        return None
                    parts.append(inner)
            return "".join(parts)
        if kind in {"property_identifier", "private_property_identifier"}:
            return text(node)
        if kind == "number":
            raw = text(node)
            return raw if raw.isdigit() else None
        if kind == "binary_expression":
            op = node.child_by_field_name("operator")
            if op is None or op.type != "+":
                return None
            left = self.fold(node.child_by_field_name("left"), depth + 1)
            right = self.fold(node.child_by_field_name("right"), depth + 1)
            return None if left is None or right is None else _cap(left + right)
        if kind == "identifier":
            name = text(node)
            bound = self.bindings.get(name, [])
            if self.writes.get(name) != 1 or len(bound) != 1 or bound[0].attr is not None:
                return None
            return self._guarded(node, lambda: self.fold(bound[0].value, depth + 1))
        if kind == "call_expression":
            return self._fold_call(node, depth)
        return None

    def _fold_call(self, node: Node, depth: int) -> str | None:
        fn, args = node.child_by_field_name("function"), arguments(node)
        if fn is None:
            return None
        if self.resolve(fn, depth + 1) == "String.fromCharCode":
            codes = [self.fold(a, depth + 1) for a in args]
            if all(c is not None and c.isdigit() and int(c) < 0x110000 for c in codes):
                return "".join(chr(int(c or 0)) for c in codes)
            return None
        if self.resolve(fn, depth + 1) == "String" and len(args) == 1:
            return self.fold(args[0], depth + 1)
        if fn.type != "member_expression":
            return None
        obj, method = fn.child_by_field_name("object"), text(fn.child_by_field_name("property"))
        folded = [self.fold(a, depth + 1) for a in args]
        if None in folded:
            return None
        values = [f or "" for f in folded]
        if method == "join":
            items = self.fold_list(obj, depth + 1)
            return None if items is None else _cap((values[0] if values else ",").join(items))
        base = self.fold(obj, depth + 1)
        if base is None:
            return None
        if method == "concat":
            return _cap(base + "".join(values))
        if method in {"toLowerCase", "toUpperCase", "trim", "toString", "valueOf"} and not args:
            return {"toLowerCase": base.lower(), "toUpperCase": base.upper()}.get(
                method, base.strip() if method == "trim" else base
            )
        return None

    def fold_list(self, node: Node | None, depth: int = 0) -> list[str] | None:
        """The strings of an array built from literals: ``["a", "b"]``, ``"ab".split("")``."""
        if node is None or depth > _MAX_DEPTH:
            return None
        node = unwrap(node)
        if node.type == "array":
            items: list[str] = []
            for e in node.named_children:
                if e.type == "spread_element":
                    inner = self.fold(e.named_children[0] if e.named_children else None, depth + 1)
                    if inner is None:
                        return None
                    items.extend(inner)
                    continue
                value = self.fold(e, depth + 1)
                if value is None:
                    return None
                items.append(value)
            return items
        if node.type == "identifier":
            bound = self.bindings.get(text(node), [])
            if self.writes.get(text(node)) == 1 and len(bound) == 1 and bound[0].attr is None:
                return self._guarded(node, lambda: self.fold_list(bound[0].value, depth + 1))
            return None
        if node.type != "call_expression":
            return None
        fn, args = node.child_by_field_name("function"), arguments(node)
        if fn is None or fn.type != "member_expression":
            return None
        obj, method = fn.child_by_field_name("object"), text(fn.child_by_field_name("property"))
        if method == "split" and len(args) == 1:
            base, sep = self.fold(obj, depth + 1), self.fold(args[0], depth + 1)
            if base is None or sep is None:
                return None
            return list(base) if sep == "" else base.split(sep)
        if method == "reverse" and not args:
            items_ = self.fold_list(obj, depth + 1)
            return None if items_ is None else items_[::-1]
        if method == "from" and self.resolve(obj, depth + 1) == "Array" and len(args) == 1:
            base = self.fold(args[0], depth + 1)
            return None if base is None else list(base)
        return None

    # -- resolution -----------------------------------------------------------------------

    def resolve(self, node: Node | None, depth: int = 0) -> str | None:
        """The dotted name ``node`` stands for (``module:fs.readFileSync``, ``process.binding``,
        ``eval``), or None when it cannot be known statically."""
        if node is None or depth > _MAX_DEPTH:
            return None
        if node.id not in self._resolved:
            name = self._resolve(unwrap(node), depth)
            self._resolved[node.id] = None if name is None else canonical(name)
        return self._resolved[node.id]

    def _resolve(self, node: Node, depth: int) -> str | None:
        kind = node.type
        if kind in {"identifier", "shorthand_property_identifier"}:
            name = text(node)
            found = self._name(name, depth)
            if found is not None:
                return found
            if name in _GLOBAL_ROOTS:
                return GLOBAL_OBJECT
            return name if name in _GLOBALS else None
        if kind in {"member_expression", "subscript_expression"}:
            obj = node.child_by_field_name("object")
            key = node.child_by_field_name("property" if kind == "member_expression" else "index")
            base = self.resolve(obj, depth + 1)
            attr = self.fold(key, depth + 1) if key is not None else None
            return None if base is None or attr is None else self.member(base, attr)
        if kind == "await_expression":
            return self.resolve(node.named_children[0] if node.named_children else None, depth + 1)
        if kind == "sequence_expression":  # (0, eval) is eval
            last = node.named_children[-1] if node.named_children else None
            return self.resolve(last, depth + 1)
        if kind == "assignment_expression":
            return self.resolve(node.child_by_field_name("right"), depth + 1)
        if kind == "call_expression":
            return self._resolve_call(node, depth)
        return None

    def _name(self, name: str, depth: int) -> str | None:
        if name not in self._by_name:
            if name in self._busy_names:
                return None  # a binding that refers to itself: let a = a.b
            self._busy_names.add(name)
            try:
                results = (self._binding(b, depth) for b in self.bindings.get(name, []))
                self._by_name[name] = next((r for r in results if r is not None), None)
            finally:
                self._busy_names.discard(name)
        return self._by_name[name]

    def _binding(self, b: Binding, depth: int) -> str | None:
        if b.name is not None:
            return b.name
        base = self.resolve(b.value, depth + 1)
        if base is None or b.attr is None:
            return base
        return self.member(base, b.attr)

    @staticmethod
    def member(base: str, attr: str) -> str:
        if base == GLOBAL_OBJECT:
            return GLOBAL_OBJECT if attr in _GLOBAL_ROOTS else attr
        if attr == "default" and base.startswith("module:") and "." not in base[7:]:
            return base  # the default export of a CommonJS module is the module
        return f"{base}.{attr}"

    def _resolve_call(self, node: Node, depth: int) -> str | None:
        spec = self.import_spec(node, depth)
        if spec is not None:
            return None if spec[1] is None else "module:" + module_name(spec[1])
        fn, args = self.callee(node, depth)
        if fn == "module:module.createRequire":
            return "require"
        head, _, last = (fn or "").rpartition(".")
        if head and last == "bind":
            return head  # f.bind(...) runs f when it is called
        if fn == "Reflect.get" and len(args) >= 2:
            base, attr = self.resolve(args[0], depth + 1), self.fold(args[1], depth + 1)
            return None if base is None or attr is None else self.member(base, attr)
        return None

    def callee(self, call: Node, depth: int = 0) -> tuple[str | None, list[Node]]:
        """The function a call runs and the arguments it gets, through ``.call`` and
        ``.apply`` (with a literal array): ``require.call(null, "x")`` runs ``require("x")``."""
        fn_node = call.child_by_field_name("function") or call.child_by_field_name("constructor")
        args = arguments(call)
        fn = self.resolve(fn_node, depth + 1)
        if fn is None or fn_node is None:
            return None, args
        head, _, last = fn.rpartition(".")
        if head and last == "call":
            return head, args[1:]
        if head and last == "apply":
            array = unwrap(args[1]) if len(args) > 1 else None
            return head, (
                array.named_children if array is not None and array.type == "array" else []
            )
        return fn, args

    def import_spec(self, call: Node, depth: int = 0) -> tuple[Node, str | None] | None:
        """For a call that loads a module (``require``, ``import()``, ``module.require``,
        ``createRequire(...)(...)``...): its specifier's node and folded value (None when
        computed). None for any other call."""
        fn_node = call.child_by_field_name("function")
        if fn_node is not None and fn_node.type == "import":
            args = arguments(call)
        else:
            fn, args = self.callee(call, depth)
            if fn not in IMPORT_FUNCS:
                return None
        if not args:
            return None
        return args[0], self.fold(args[0], depth + 1)

    def _guarded(self, node: Node, compute: Callable[[], _T | None]) -> _T | None:
        # A binding that refers to itself (``let a = a + "x"``) is not folded forever.
        key = node.id
        if key in self._busy:
            return None
        self._busy.add(key)
        try:
            return compute()
        finally:
            self._busy.discard(key)


def _is_parameter(node: Node, parent: Node) -> bool:
    """Whether an identifier is bound by a parameter list, a pattern or a loop head."""
    if parent.type == "arrow_function":
        return parent.child_by_field_name("parameter") == node
    if parent.type == "for_in_statement":
        return parent.child_by_field_name("left") == node
    return parent.type in _PATTERN_PARENTS


def _cap(value: str) -> str | None:
    return value if len(value) <= _MAX_TEXT else None
