"""Turns one expression's syntax tree into nested closures.

Python's parser reads the text (``ast.parse(..., mode="eval")``) because it is
exact, fast and already handles literals, precedence and comparison chains;
nothing here calls ``eval``, ``exec`` or ``compile``. Each node type of the
language becomes one small closure, so evaluating is a walk over pre-built
functions: no parsing and no dispatch on node types at run time. Every other
node type, every name starting with ``_`` and every call of anything but the
listed functions is refused with :class:`Rejected`, which ``expr.py`` turns
into an ``ExpressionError``. Values are only ever read with ``mapping[key]``
and ``sequence[int]``, never with ``getattr``, so no Python object internals
are reachable.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tideflow.dsl._expr_functions import (
    FUNCTIONS,
    EvalFailure,
    a_kind,
    add,
    call_default,
    is_number,
    kind,
    multiply,
    now,
    numeric,
)
from tideflow.dsl._expr_random import literal_bounds_problem, random, random_int, uuid
from tideflow.model.storable import integer_problem

Scope = Mapping[str, Any]
Evaluator = Callable[[Scope], Any]

GO_PREFIX = "inputs"
KEYWORDS = frozenset({"and", "or", "not", "in", "if", "else", "is", "lambda"})
_LITERAL_NAMES: dict[str, Any] = {"true": True, "false": False, "null": None}
_CONSTANT_TYPES = (int, float, str, bool, type(None))
_MAX_LISTED = 10


class Rejected(Exception):
    """A construct outside the language; ``byte_offset`` locates it in the parsed text."""

    def __init__(self, message: str, hint: str, node: ast.AST, at: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.byte_offset: int = getattr(node, "col_offset", 0) if at is None else at


def compile_node(node: ast.AST) -> Evaluator:
    """The closure that evaluates ``node``, or :class:`Rejected` if it is not in the language."""
    handler = _HANDLERS.get(type(node))
    if handler is None:
        message, hint = _REFUSALS.get(type(node), _NOT_IN_LANGUAGE)
        raise Rejected(message.format(text=ast.unparse(node)), hint, node)
    return handler(node)


def _text(node: ast.AST) -> str:
    """The (normalised) source of a node, computed only when an error message needs it."""
    return ast.unparse(node)


def _listing(names: list[str]) -> str:
    """At most ten names, sorted, so error messages stay short for big mappings."""
    names = sorted(names)
    shown = ", ".join(names[:_MAX_LISTED]) or "(none)"
    extra = len(names) - _MAX_LISTED
    return f"{shown} and {extra} more" if extra > 0 else shown


# --- Go-style dots ------------------------------------------------------------------------


def original_column(column: int, inserts: tuple[int, ...]) -> int:
    """Maps a column of the translated text back to the text the user wrote."""
    shift = 0
    for insert in inserts:
        at = insert + shift
        if column < at:
            break
        if column < at + len(GO_PREFIX):
            return insert
        shift += len(GO_PREFIX)
    return column - shift


def translate_go_dots(text: str) -> tuple[str, tuple[int, ...]]:
    """``.name`` → ``inputs.name`` where a value starts (not after a name, not in strings).

    Returns the new text and the offsets (in ``text``) where ``inputs`` went in.
    """
    out: list[str] = []
    inserts: list[int] = []
    after_value, i = False, 0
    while i < len(text):
        char = text[i]
        if char in "'\"":
            end = _string_end(text, i)
        elif char.isalnum() or char == "_":
            end = _word_end(text, i)
        else:
            end = i + 1
            nxt = text[i + 1 : i + 2]
            if char == "." and not after_value and (nxt.isalpha() or nxt == "_"):
                inserts.append(i)
                out.append(GO_PREFIX)
        chunk = text[i:end]
        if not chunk.isspace():
            after_value = chunk not in KEYWORDS and chunk[-1] not in "([{,:+-*/%<>=!.~&|^@"
        out.append(chunk)
        i = end
    return "".join(out), tuple(inserts)


def _word_end(text: str, i: int) -> int:
    while i < len(text) and (text[i].isalnum() or text[i] == "_"):
        i += 1
    return i


def _string_end(text: str, i: int) -> int:
    quote = text[i]
    if text.startswith(quote * 3, i):
        end = text.find(quote * 3, i + 3)
        return len(text) if end < 0 else end + 3
    i += 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == quote:
            return i + 1
        else:
            i += 1
    return len(text)


# --- names and lookups --------------------------------------------------------------------


def _check_identifier(name: str, node: ast.AST, at: int | None = None) -> None:
    if name.startswith("_"):
        raise Rejected(
            f"names starting with '_' are not allowed: '{name}'",
            "such names could reach Python internals; use ['key'] for a mapping key "
            "that starts with '_'",
            node,
            at,
        )


def _name(node: ast.Name) -> Evaluator:
    name = node.id
    if name in _LITERAL_NAMES:
        value = _LITERAL_NAMES[name]
        return lambda _scope: value
    _check_identifier(name, node)
    if name in FUNCTIONS:
        raise Rejected(f"'{name}' is a function", f"call it: {name}(...)", node)

    def lookup(scope: Scope) -> Any:
        try:
            return scope[name]
        except KeyError:
            visible = _listing([str(k) for k in scope if not str(k).startswith("_")])
            message = f"unknown name '{name}'; names in scope: {visible}"
            raise EvalFailure(message, missing=True) from None

    return lookup


def _get_key(container: Any, key: Any, node: ast.Attribute | ast.Subscript) -> Any:
    """``container[key]`` for a mapping; any other container is an evaluation error."""
    if isinstance(container, Mapping):
        try:
            return container[key]
        except KeyError:
            keys = _listing([str(k) for k in container])
            message = f"`{_text(node.value)}` has no key {key!r}; its keys are: {keys}"
            raise EvalFailure(message, missing=True) from None
        except TypeError:
            raise EvalFailure(f"{a_kind(key)} cannot be a mapping key in `{_text(node)}`") from None
    if container is None:
        message = f"cannot read {key!r} of null: `{_text(node.value)}` is null"
        raise EvalFailure(message, missing=True)
    expected = "a mapping" if isinstance(node, ast.Attribute) else "a mapping or a list"
    message = f"cannot read {key!r}: `{_text(node.value)}` is {a_kind(container)}, not {expected}"
    raise EvalFailure(message)


def _get_item(container: Any, index: Any, node: ast.Subscript) -> Any:
    """``container[index]``: a key of a mapping or a position in a list or string."""
    if isinstance(container, Sequence) and not isinstance(container, Mapping):
        if isinstance(index, bool) or not isinstance(index, int):
            message = f"a {kind(container)} index must be an integer, got {a_kind(index)}"
            raise EvalFailure(f"{message} in `{_text(node)}`")
        try:
            return container[index]
        except IndexError:
            message = (
                f"index {index} is out of range: `{_text(node.value)}` has length "
                f"{len(container)} in `{_text(node)}`"
            )
            raise EvalFailure(message, missing=True) from None
    return _get_key(container, index, node)


_LITERAL_NODES = (ast.Constant, ast.List, ast.JoinedStr)


def _attribute(node: ast.Attribute) -> Evaluator:
    key = node.attr
    attr_at = (node.end_col_offset or 0) - len(key.encode())
    _check_identifier(key, node, attr_at)
    base_node = node.value
    if isinstance(base_node, _LITERAL_NODES) or (
        isinstance(base_node, ast.Name) and base_node.id in _LITERAL_NAMES
    ):
        raise Rejected(
            f"'.{key}' reads a mapping key, but `{_text(base_node)}` is not a mapping",
            "values have no methods or attributes; use the functions instead, e.g. upper(x)",
            node,
            attr_at,
        )
    base = compile_node(base_node)
    return lambda scope: _get_key(base(scope), key, node)


def _subscript(node: ast.Subscript) -> Evaluator:
    base, index = compile_node(node.value), compile_node(node.slice)
    return lambda scope: _get_item(base(scope), index(scope), node)


# --- literals -----------------------------------------------------------------------------


def _constant(node: ast.Constant) -> Evaluator:
    value = node.value
    if type(value) not in _CONSTANT_TYPES:
        message = f"`{_text(node)}` is not a supported literal"
        raise Rejected(message, "literals are numbers, strings, true, false and null", node)
    found = integer_problem(value)
    if found is not None:  # the rule of every edge (model/storable.py)
        raise Rejected(found[1], 'write it as a string: "12345678901234567890123"', node)
    return lambda _scope: value


def _list(node: ast.List) -> Evaluator:
    items = [compile_node(element) for element in node.elts]
    return lambda scope: [item(scope) for item in items]


def _dict(node: ast.Dict) -> Evaluator:
    if any(key is None for key in node.keys):
        raise Rejected("'**' unpacking is not allowed", "write the keys out: {'k': v}", node)
    pairs = [
        (compile_node(key), compile_node(value))
        for key, value in zip(node.keys, node.values, strict=True)
        if key is not None
    ]

    def build(scope: Scope) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        for key_of, value_of in pairs:
            key, value = key_of(scope), value_of(scope)
            if isinstance(key, (list, Mapping)):
                message = f"{a_kind(key)} cannot be a mapping key in `{_text(node)}`"
                raise EvalFailure(message)
            result[key] = value
        return result

    return build


# --- operators ----------------------------------------------------------------------------

_BINARY: dict[type[ast.operator], tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Add: ("+", add),
    ast.Sub: ("-", numeric(operator.sub)),
    ast.Mult: ("*", multiply),
    ast.Div: ("/", numeric(operator.truediv)),
    ast.Mod: ("%", numeric(operator.mod)),
}
_UNSUPPORTED_OPERATORS = {
    ast.Pow: "**",
    ast.FloorDiv: "//",
    ast.MatMult: "@",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.BitAnd: "&",
}


def _binary(node: ast.BinOp) -> Evaluator:
    entry = _BINARY.get(type(node.op))
    if entry is None:
        symbol = _UNSUPPORTED_OPERATORS.get(type(node.op), "?")
        at = node.left.end_col_offset
        raise Rejected(f"operator '{symbol}' is not supported", "use + - * / %", node, at)
    symbol, apply = entry
    left, right = compile_node(node.left), compile_node(node.right)

    def evaluate(scope: Scope) -> Any:
        a, b = left(scope), right(scope)
        try:
            return apply(a, b)
        except TypeError:
            message = f"'{symbol}' cannot combine {a_kind(a)} and {a_kind(b)}"
        except ZeroDivisionError:
            message = "division by zero"
        except (ValueError, ArithmeticError) as exc:
            message = str(exc)
        raise EvalFailure(f"{message} in `{_text(node)}`")

    return evaluate


def _unary(node: ast.UnaryOp) -> Evaluator:
    operand = compile_node(node.operand)
    if isinstance(node.op, ast.Not):
        return lambda scope: not operand(scope)
    if not isinstance(node.op, ast.USub):
        symbol = "+" if isinstance(node.op, ast.UAdd) else "~"
        raise Rejected(f"unary '{symbol}' is not supported", "only unary '-' and 'not' exist", node)

    def negate(scope: Scope) -> Any:
        value = operand(scope)
        if is_number(value):
            return -value
        raise EvalFailure(f"cannot negate {a_kind(value)} in `{_text(node)}`")

    return negate


def _boolean(node: ast.BoolOp) -> Evaluator:
    """``and``/``or`` as in Python: short-circuit, and the result is the deciding operand."""
    operands = [compile_node(value) for value in node.values]
    stop_when = isinstance(node.op, ast.Or)  # 'or' stops at a truthy value, 'and' at a falsy one

    def evaluate(scope: Scope) -> Any:
        result: Any = None
        for operand in operands:
            result = operand(scope)
            if bool(result) is stop_when:
                return result
        return result

    return evaluate


def _if(node: ast.IfExp) -> Evaluator:
    test, body, orelse = compile_node(node.test), compile_node(node.body), compile_node(node.orelse)
    return lambda scope: body(scope) if test(scope) else orelse(scope)


# --- comparisons --------------------------------------------------------------------------

_COMPARISONS: dict[type[ast.cmpop], tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Eq: ("==", operator.eq),
    ast.NotEq: ("!=", operator.ne),
    ast.Lt: ("<", operator.lt),
    ast.LtE: ("<=", operator.le),
    ast.Gt: (">", operator.gt),
    ast.GtE: (">=", operator.ge),
    ast.In: ("in", lambda a, b: a in b),
    ast.NotIn: ("not in", lambda a, b: a not in b),
}

Test = Callable[[Any, Any], Any]


def _comparison(op: ast.cmpop, node: ast.Compare) -> Test:
    entry = _COMPARISONS.get(type(op))
    if entry is None:
        raise Rejected("'is' and 'is not' are not supported", "use == and != instead", node)
    symbol, compare = entry

    def test(a: Any, b: Any) -> Any:
        try:
            return compare(a, b)
        except TypeError:
            message = (
                f"cannot compare {a_kind(a)} and {a_kind(b)} with '{symbol}' in `{_text(node)}`"
            )
            raise EvalFailure(message) from None

    return test


def _compare(node: ast.Compare) -> Evaluator:
    left = compile_node(node.left)
    links = [
        (_comparison(op, node), compile_node(right))
        for op, right in zip(node.ops, node.comparators, strict=True)
    ]
    if len(links) == 1:
        ((test, right),) = links
        return lambda scope: test(left(scope), right(scope))

    def chain(scope: Scope) -> Any:
        a = left(scope)
        for test, right in links:
            b = right(scope)
            if not test(a, b):
                return False
            a = b
        return True

    return chain


# --- function calls -----------------------------------------------------------------------


def _function_name(node: ast.Call) -> str:
    func = node.func
    if not isinstance(func, ast.Name) or func.id not in FUNCTIONS:
        raise Rejected(
            f"`{_text(func)}` cannot be called; the functions are: {', '.join(FUNCTIONS)}",
            "values have no methods: write upper(x), not x.upper()",
            node,
        )
    if node.keywords:
        raise Rejected("keyword arguments are not supported", "pass arguments by position", node)
    low, high = FUNCTIONS[func.id].arity
    if not low <= len(node.args) <= (high if high is not None else len(node.args)):
        expected = f"at least {low}" if high is None else f"{low} to {high}"
        expected = f"{low}" if low == high else expected
        message = f"{func.id}() takes {expected} argument(s), got {len(node.args)}"
        raise Rejected(message, f"see docs/expressions.md for {func.id}()", node)
    return func.id


_SCOPE_FUNCTIONS: dict[str, Evaluator] = {"now": now, "uuid": uuid, "random": random}


def _call(node: ast.Call) -> Evaluator:
    name = _function_name(node)
    args = [compile_node(arg) for arg in node.args]
    if name == "default":
        return call_default(args[0], args[1])
    if name in _SCOPE_FUNCTIONS:
        return _SCOPE_FUNCTIONS[name]
    if name == "random_int":
        problem = literal_bounds_problem(node, _LITERAL_NAMES)
        if problem is not None:
            raise Rejected(*problem, node)
        return random_int(args[0], args[1], lambda: _text(node))
    function = FUNCTIONS[name].function

    def call(scope: Scope) -> Any:
        values = [arg(scope) for arg in args]
        try:
            return function(*values)
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise EvalFailure(f"{name}(): {exc} in `{_text(node)}`") from None

    return call


# --- dispatch -----------------------------------------------------------------------------

_HANDLERS: dict[type[ast.AST], Callable[[Any], Evaluator]] = {
    ast.Constant: _constant,
    ast.Name: _name,
    ast.Attribute: _attribute,
    ast.Subscript: _subscript,
    ast.List: _list,
    ast.Dict: _dict,
    ast.BinOp: _binary,
    ast.UnaryOp: _unary,
    ast.BoolOp: _boolean,
    ast.Compare: _compare,
    ast.IfExp: _if,
    ast.Call: _call,
}

_COMPREHENSION = ("comprehensions are not allowed", "transform lists with a map step")
_NOT_IN_LANGUAGE = (
    "`{text}` is not part of the expression language",
    "see docs/expressions.md for what an expression may contain",
)
_REFUSALS: dict[type[ast.AST], tuple[str, str]] = {
    ast.Lambda: ("lambda is not allowed", "expressions cannot define functions"),
    ast.ListComp: _COMPREHENSION,
    ast.SetComp: _COMPREHENSION,
    ast.DictComp: _COMPREHENSION,
    ast.GeneratorExp: _COMPREHENSION,
    ast.JoinedStr: (
        "f-strings are not allowed",
        "use a template: 'id-{{ x }}', or 'id-' + str(x)",
    ),
    ast.Starred: ("'*' unpacking is not allowed", "pass the list itself"),
    ast.NamedExpr: ("':=' is not allowed", "expressions cannot assign"),
    ast.Tuple: ("tuples are not supported: `{text}`", "use a list: [a, b]"),
    ast.Set: ("sets are not supported: `{text}`", "use a list: [a, b]"),
    ast.Slice: ("slicing is not supported: `{text}`", "index single elements: x[0]"),
    ast.Await: ("'await' is not allowed", "expressions cannot wait"),
}
