"""The textual invariant language: the whitelist check and the interpreter.

Private to :mod:`sandcell.validation.invariants`, whose docstring describes the language.
:func:`check` runs once, when an invariant is parsed, and refuses every node outside the
language; :class:`Interpreter` then only ever meets nodes that passed it.
"""

from __future__ import annotations

import ast
import builtins
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from sandcell.errors import ConfigError, SandcellError

MAX_STEPS = 1_000_000
"""Most expression nodes one invariant may evaluate: a nested comprehension over a large
result would otherwise run for hours."""

MAX_CPU_SECONDS = 2.0
"""Most CPU time (of the evaluating thread) one invariant may take. Steps bound how many
operations run; this bounds what they cost together, whatever an operation the step count
undercharges (a deep comparison of nested lists) costs. CPU time, not wall time, so that a
loaded host does not fail an invariant that would hold."""

MAX_INT_BITS = 16_384
"""Largest integer the language builds: bigger than any integer JSON can carry here (Python
parses at most 4,300 digits, about 14,300 bits), small enough that arithmetic on it stays in
microseconds. Without it, a chain of squarings triples its time with every step."""

MAX_BUILT_LENGTH = 1 << 22
"""Longest string or list the language builds by joining (characters or elements)."""

MAX_SOURCE_CHARS = 4096

_CHARS_PER_STEP = 64
"""Joining strings costs one step per this many characters of the result; scanning or copying
a list costs one per :data:`_ITEMS_PER_STEP` of its elements (an element is compared, not
copied, and costs more)."""
_ITEMS_PER_STEP = 16

_CLOCK_EVERY = 1024
"""Steps between two reads of the CPU clock: a read costs about what a step costs."""

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


class Failure(SandcellError):
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
        self._cpu_deadline = time.thread_time() + MAX_CPU_SECONDS
        self._next_clock = _CLOCK_EVERY

    def _tick(self, steps: int = 1) -> None:
        self.steps += steps
        if self.steps > MAX_STEPS:
            raise Failure(f"it took more than {MAX_STEPS} evaluation steps")
        if self.steps >= self._next_clock:
            self._next_clock = self.steps + _CLOCK_EVERY
            if time.thread_time() > self._cpu_deadline:
                raise Failure(f"it took more than {MAX_CPU_SECONDS:g} s of CPU time")

    def _charge_scan(self, value: object) -> None:
        """Charge for an operation that walks ``value`` once (a scan, a copy, a comparison)."""
        if isinstance(value, str):
            self._tick(len(value) // _CHARS_PER_STEP)
        elif isinstance(value, list | tuple | dict):
            self._tick(len(value) // _ITEMS_PER_STEP)

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
                    self._charge_scan(right_value)
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
        if isinstance(left, str | list):
            return self._join(left, right)  # type: ignore[arg-type]  # same type, checked above
        a, b = left, right
        match symbol:
            case "+":
                return _bounded(a + b)  # type: ignore[operator]
            case "-":
                return _bounded(a - b)  # type: ignore[operator]
            case "*":
                if isinstance(a, int) and isinstance(b, int):
                    # Checked before multiplying: the product of two large integers is what
                    # takes the time.
                    _bounded_bits(a.bit_length() + b.bit_length() - 1)
                return _bounded(a * b)  # type: ignore[operator]
            case "/":
                return a / b  # type: ignore[operator]
            case "//":
                return a // b  # type: ignore[operator]
            case _:
                return a % b  # type: ignore[operator]

    def _join(self, left: str | list[object], right: str | list[object]) -> object:
        """``left + right`` for two strings or two lists, refused before it is built when it
        would be too long, and charged for the copy."""
        length = len(left) + len(right)
        if length > MAX_BUILT_LENGTH:
            raise Failure(
                f"'+' would build a {type(left).__name__} of {length} items, over "
                f"{MAX_BUILT_LENGTH} allowed"
            )
        per_step = _CHARS_PER_STEP if isinstance(left, str) else _ITEMS_PER_STEP
        self._tick(length // per_step)
        return left + right  # type: ignore[operator]

    def _subscript(self, container: object, key_node: ast.expr) -> object:
        if not isinstance(container, dict | list | str | tuple):
            raise Failure(f"cannot subscript {type(container).__name__}")
        key = _constant_key(key_node)
        if isinstance(key, slice):
            if isinstance(container, dict):
                raise Failure("cannot slice an object")
            sliced = container[key]
            self._charge_scan(sliced)
            return sliced
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
        for value in values:
            self._charge_scan(value)
        function: Callable[..., object] = getattr(builtins, name)
        return _bounded(function(*values))

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


def _bounded_bits(bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise Failure(f"it would build an integer of {bits} bits, over {MAX_INT_BITS} bits")


def _bounded(value: object) -> object:
    """``value``, if it is not an integer larger than :data:`MAX_INT_BITS` (a sum or a
    difference is at most one bit longer than its operands, so checking after is cheap)."""
    if isinstance(value, int) and not isinstance(value, bool):
        _bounded_bits(value.bit_length())
    return value


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
