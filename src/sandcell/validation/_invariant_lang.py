"""The textual invariant language: the whitelist check and the interpreter.

Private to :mod:`sandcell.validation.invariants`, whose docstring describes the language.
:func:`check` runs once, when an invariant is parsed, and refuses every node outside the
language; :class:`Interpreter` then only ever meets nodes that passed it.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable, Iterator, Mapping, Sequence

from sandcell.errors import ConfigError

MAX_STEPS = 1_000_000
"""Most expression nodes one invariant may evaluate: a nested comprehension over a large
result would otherwise run for hours."""

MAX_SOURCE_CHARS = 4096

_CHARS_PER_STEP = 64
"""Joining strings or lists costs one step per this many elements of the result."""

_FUNCTIONS = ("abs", "all", "any", "isinstance", "len", "max", "min", "sum")
_TYPES: Mapping[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (float,),
    "str": (str,),
    "list": (list,),
    "dict": (dict,),
    "bool": (bool,),
}
_RESERVED = frozenset({"result", *_FUNCTIONS, *_TYPES})

_BINOPS: Mapping[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
}
_CMPOPS: Mapping[type[ast.cmpop], str] = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
}

# How a refused node is named in the error, so the caller sees what to change.
_CONSTRUCTS: Mapping[type[ast.AST], str] = {
    ast.Attribute: "attribute access",
    ast.Lambda: "lambda",
    ast.NamedExpr: "assignment expression (:=)",
    ast.JoinedStr: "f-string",
    ast.FormattedValue: "f-string",
    ast.IfExp: "conditional expression (x if c else y)",
    ast.Dict: "dict literal",
    ast.Set: "set literal",
    ast.DictComp: "dict comprehension",
    ast.SetComp: "set comprehension",
    ast.Starred: "star expression (*x)",
    ast.Await: "await",
    ast.Yield: "yield",
    ast.YieldFrom: "yield",
    ast.Slice: "slice",
}


class Failure(Exception):
    """An invariant cannot be evaluated on this value (a type error the language itself finds)."""


def _refuse(source: str, what: str, hint: str = "") -> ConfigError:
    text = f"invariant {source!r}: {what} is not allowed"
    return ConfigError(f"{text}; {hint}" if hint else text)


def _check_key(node: ast.expr, source: str) -> None:
    """Subscript keys are constants (a string, an integer, a negative integer) or slices."""
    if isinstance(node, ast.Slice):
        for bound in (node.lower, node.upper, node.step):
            if bound is not None:
                _check_key(bound, source)
        return
    negative = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
    if isinstance(node, ast.UnaryOp) and negative:
        node = node.operand
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | str)
        and not isinstance(node.value, bool)
        and not (negative and isinstance(node.value, str))
    ):
        return
    raise _refuse(
        source,
        f"subscript with a computed key ({ast.unparse(node)})",
        'keys and indices must be constants, as in result["rows"][0]',
    )


def _check_target(node: ast.expr, source: str, bound: set[str]) -> None:
    if isinstance(node, ast.Name):
        if node.id in _RESERVED or node.id.startswith("_"):
            raise _refuse(source, f"the loop variable name {node.id!r}", "choose another name")
        bound.add(node.id)
        return
    if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Name) for e in node.elts):
        for element in node.elts:
            _check_target(element, source, bound)
        return
    raise _refuse(
        source, f"the loop target {ast.unparse(node)!r}", "use a name or a tuple of names"
    )


def check(node: ast.expr, source: str, names: frozenset[str]) -> None:
    """Refuse, with the construct's name, any node outside the language."""
    match node:
        case ast.Constant(value=value):
            if value is not None and not isinstance(value, bool | int | float | str):
                raise _refuse(source, f"a constant of type {type(value).__name__}")
        case ast.Name(id=name):
            if name != "result" and name not in names:
                if name in _FUNCTIONS or name in _TYPES:
                    raise _refuse(source, f"{name!r} used as a value", "call it instead")
                raise _refuse(
                    source,
                    f"the name {name!r}",
                    "an invariant can only refer to 'result' and its loop variables",
                )
        case ast.Attribute(attr=attr):
            raise _refuse(
                source,
                f"attribute access ('.{attr}')",
                'use subscripts, as in result["field"]',
            )
        case ast.BoolOp(values=values):
            for value_node in values:
                check(value_node, source, names)
        case ast.UnaryOp(op=op, operand=operand):
            if not isinstance(op, ast.Not | ast.USub | ast.UAdd):
                raise _refuse(source, "the operator '~'")
            check(operand, source, names)
        case ast.BinOp(left=left, op=op, right=right):
            if type(op) not in _BINOPS:
                symbol = {ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|"}
                shown = symbol.get(type(op), type(op).__name__)
                raise _refuse(source, f"the operator {shown!r}")
            check(left, source, names)
            check(right, source, names)
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            check(left, source, names)
            for cmp_op, right in zip(ops, comparators, strict=True):
                if isinstance(cmp_op, ast.Is | ast.IsNot) and not (
                    isinstance(right, ast.Constant) and right.value in (None, True, False)
                ):
                    raise _refuse(
                        source,
                        "'is' with anything but None, True or False",
                        "use == to compare values",
                    )
                check(right, source, names)
        case ast.Subscript(value=value, slice=key):
            check(value, source, names)
            _check_key(key, source)
        case ast.List(elts=elts) | ast.Tuple(elts=elts):
            for element in elts:
                check(element, source, names)
        case ast.Call():
            _check_call(node, source, names)
        case (
            ast.GeneratorExp(elt=elt, generators=generators)
            | ast.ListComp(elt=elt, generators=generators)
        ):
            inner = set(names)
            for comp in generators:
                if comp.is_async:
                    raise _refuse(source, "async comprehension")
                # The iterable is checked in the scope before this clause's target is bound.
                check(comp.iter, source, frozenset(inner))
                _check_target(comp.target, source, inner)
                for condition in comp.ifs:
                    check(condition, source, frozenset(inner))
            check(elt, source, frozenset(inner))
        case _:
            what = _CONSTRUCTS.get(type(node), f"the construct {type(node).__name__}")
            raise _refuse(source, what)


def _check_call(node: ast.Call, source: str, names: frozenset[str]) -> None:
    func, args, keywords = node.func, node.args, node.keywords
    allowed = ", ".join(_FUNCTIONS)
    if not isinstance(func, ast.Name):
        if isinstance(func, ast.Attribute):
            raise _refuse(
                source, f"calling a method ('.{func.attr}(...)')", f"allowed calls: {allowed}"
            )
        check(func, source, names)  # name what is wrong inside first (a lambda...)
        raise _refuse(source, f"the call {ast.unparse(node)!r}", f"allowed calls: {allowed}")
    if func.id not in _FUNCTIONS:
        raise _refuse(source, f"a call to {func.id!r}", f"allowed calls: {allowed}")
    if keywords or any(isinstance(a, ast.Starred) for a in args):
        raise _refuse(source, f"keyword or star arguments to {func.id}()")
    if not args:
        raise _refuse(source, f"{func.id}() without arguments")
    if func.id == "isinstance":
        if len(args) != 2:
            raise _refuse(source, "isinstance() without exactly two arguments")
        check(args[0], source, names)
        kinds = args[1].elts if isinstance(args[1], ast.Tuple) else [args[1]]
        for kind in kinds:
            if not (isinstance(kind, ast.Name) and kind.id in _TYPES):
                raise _refuse(
                    source,
                    f"isinstance() with {ast.unparse(kind)!r}",
                    f"use one of {', '.join(_TYPES)}",
                )
        return
    limits = {"len": 1, "abs": 1, "all": 1, "any": 1, "sum": 2}
    if func.id in limits and len(args) > limits[func.id]:
        raise _refuse(source, f"{func.id}() with {len(args)} arguments")
    for arg in args:
        check(arg, source, names)


# --------------------------------------------------------------------------------------------
# Evaluation


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _isinstance(value: object, kinds: tuple[type, ...]) -> bool:
    # JSON has booleans and numbers apart: True is not an integer here.
    if isinstance(value, bool) and bool not in kinds:
        return False
    return isinstance(value, kinds)


class Interpreter:
    """Walks a checked tree. Only node types :func:`_check` accepted can reach it."""

    def __init__(self, result: object) -> None:
        self.result = result
        self.steps = 0

    def _tick(self, steps: int = 1) -> None:
        self.steps += steps
        if self.steps > MAX_STEPS:
            raise Failure(f"it took more than {MAX_STEPS} evaluation steps")

    def eval(self, node: ast.expr, scope: Mapping[str, object]) -> object:
        self._tick()
        match node:
            case ast.Constant(value=value):
                return value
            case ast.Name(id="result"):
                return self.result
            case ast.Name(id=name):
                return scope[name]
            case ast.BoolOp(op=bool_op, values=values):
                last: object = None
                for value_node in values:
                    last = self.eval(value_node, scope)
                    if isinstance(bool_op, ast.And) and not last:
                        return last
                    if isinstance(bool_op, ast.Or) and last:
                        return last
                return last
            case ast.UnaryOp(op=unary_op, operand=operand):
                operand_value = self.eval(operand, scope)
                if isinstance(unary_op, ast.Not):
                    return not operand_value
                if not _is_number(operand_value):
                    raise Failure(f"unary minus or plus on {type(operand_value).__name__}")
                if isinstance(unary_op, ast.USub):
                    return -operand_value  # type: ignore[operator]
                return operand_value
            case ast.BinOp(left=left, op=bin_op, right=right_node):
                return self._binop(bin_op, self.eval(left, scope), self.eval(right_node, scope))
            case ast.Compare(left=left, ops=ops, comparators=comparators):
                current = self.eval(left, scope)
                for cmp_op, right_node in zip(ops, comparators, strict=True):
                    right_value = self.eval(right_node, scope)
                    if not _compare(cmp_op, current, right_value):
                        return False
                    current = right_value
                return True
            case ast.Subscript(value=value_node, slice=key_node):
                return self._subscript(self.eval(value_node, scope), key_node)
            case ast.List(elts=elts):
                return [self.eval(e, scope) for e in elts]
            case ast.Tuple(elts=elts):
                return tuple(self.eval(e, scope) for e in elts)
            case ast.Call(func=ast.Name(id=name), args=args):
                return self._call(name, args, scope)
            case ast.GeneratorExp(elt=elt, generators=generators):
                return self._comprehension(elt, generators, 0, dict(scope))
            case ast.ListComp(elt=elt, generators=generators):
                return list(self._comprehension(elt, generators, 0, dict(scope)))
        raise AssertionError(f"unchecked node {type(node).__name__}")  # pragma: no cover

    def _binop(self, op: ast.operator, left: object, right: object) -> object:
        symbol = _BINOPS[type(op)]
        if symbol in {"*", "%", "/", "//"} and not (_is_number(left) and _is_number(right)):
            # No string or list repetition ("x" * 10**9) and no %-formatting.
            raise Failure(
                f"{symbol!r} needs two numbers, got {type(left).__name__} and "
                f"{type(right).__name__}"
            )
        if symbol in {"+", "-"} and not (
            (_is_number(left) and _is_number(right))
            or (symbol == "+" and type(left) is type(right) and isinstance(left, str | list))
        ):
            raise Failure(f"{symbol!r} on {type(left).__name__} and {type(right).__name__}")
        a, b = left, right
        match symbol:
            case "+":
                joined: object = a + b  # type: ignore[operator]
                if isinstance(joined, str | list):
                    # Joining copies: charge for the size, so that a comprehension cannot
                    # build gigabytes out of a large result within the step budget.
                    self._tick(len(joined) // _CHARS_PER_STEP)
                return joined
            case "-":
                return a - b  # type: ignore[operator]
            case "*":
                return a * b  # type: ignore[operator]
            case "/":
                return a / b  # type: ignore[operator]
            case "//":
                return a // b  # type: ignore[operator]
            case _:
                return a % b  # type: ignore[operator]

    def _subscript(self, container: object, key_node: ast.expr) -> object:
        if not isinstance(container, dict | list | str | tuple):
            raise Failure(f"cannot subscript {type(container).__name__}")
        key = _constant_key(key_node)
        if isinstance(key, slice):
            if isinstance(container, dict):
                raise Failure("cannot slice an object")
            return container[key]
        if isinstance(container, dict):
            if key not in container:
                raise Failure(f"key {key!r} is missing")
            return container[key]
        if not isinstance(key, int):
            raise Failure(f"index {key!r} into a {type(container).__name__}, not an integer")
        if not -len(container) <= key < len(container):
            raise Failure(f"index {key} is out of range (length {len(container)})")
        return container[key]

    def _call(self, name: str, args: list[ast.expr], scope: Mapping[str, object]) -> object:
        if name == "isinstance":
            kind_node = args[1]
            kinds = kind_node.elts if isinstance(kind_node, ast.Tuple) else [kind_node]
            wanted = tuple(t for k in kinds if isinstance(k, ast.Name) for t in _TYPES[k.id])
            return _isinstance(self.eval(args[0], scope), wanted)
        values = [self.eval(a, scope) for a in args]
        for value in values:
            if not isinstance(value, int | float | str | list | dict | tuple | Iterator):
                raise Failure(f"{name}() of {type(value).__name__}")
        if name == "sum" and len(values) == 2 and not _is_number(values[1]):
            # sum(lists, []) concatenates in quadratic time.
            raise Failure("sum() starts from a number only")
        function: Callable[..., object] = getattr(builtins, name)
        return function(*values)

    def _comprehension(
        self,
        elt: ast.expr,
        generators: Sequence[ast.comprehension],
        index: int,
        scope: dict[str, object],
    ) -> Iterator[object]:
        if index == len(generators):
            yield self.eval(elt, scope)
            return
        comp = generators[index]
        iterable = self.eval(comp.iter, scope)
        if not isinstance(iterable, list | dict | str | tuple | Iterator):
            raise Failure(f"cannot iterate over {type(iterable).__name__}")
        for item in iterable:
            self._tick()
            inner = dict(scope)
            _bind(comp.target, item, inner)
            if all(self.eval(cond, inner) for cond in comp.ifs):
                yield from self._comprehension(elt, generators, index + 1, inner)


def _constant_key(node: ast.expr) -> object:
    if isinstance(node, ast.Slice):
        bounds = [
            None if b is None else _constant_key(b) for b in (node.lower, node.upper, node.step)
        ]
        if any(b is not None and not isinstance(b, int) for b in bounds):
            raise Failure("slice bounds must be integers")
        return slice(*bounds)
    if isinstance(node, ast.UnaryOp):
        return -_constant_key(node.operand)  # type: ignore[operator]
    assert isinstance(node, ast.Constant)
    return node.value


def _bind(target: ast.expr, item: object, scope: dict[str, object]) -> None:
    if isinstance(target, ast.Name):
        scope[target.id] = item
        return
    assert isinstance(target, ast.Tuple)
    if not isinstance(item, list | tuple) or len(item) != len(target.elts):
        raise Failure(f"cannot unpack {type(item).__name__} into {len(target.elts)} names")
    for name_node, part in zip(target.elts, item, strict=True):
        _bind(name_node, part, scope)


def _compare(op: ast.cmpop, left: object, right: object) -> bool:
    match _CMPOPS[type(op)]:
        case "==":
            return bool(left == right)
        case "!=":
            return bool(left != right)
        case "<":
            return bool(left < right)  # type: ignore[operator]
        case "<=":
            return bool(left <= right)  # type: ignore[operator]
        case ">":
            return bool(left > right)  # type: ignore[operator]
        case ">=":
            return bool(left >= right)  # type: ignore[operator]
        case "in":
            return bool(left in right)  # type: ignore[operator]
        case "not in":
            return bool(left not in right)  # type: ignore[operator]
        case "is":
            return left is right
        case _:
            return left is not right
