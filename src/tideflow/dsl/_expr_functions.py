"""The functions an expression may call, the operators' value rules, and their helpers.

The lists are closed on purpose: a definition can only compute with these, so
what an expression can do to a value is readable from this one file. Each function checks
its argument types itself and raises ``TypeError``/``ValueError`` with a
message in the user's vocabulary (string, list, mapping), which the call site
turns into an evaluation error naming the expression.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

Scope = Mapping[str, Any]
Evaluator = Callable[[Scope], Any]

NOW_KEY = "__now__"
_MAX_ROUND_DIGITS = 100
_MAX_SHOWN = 60


class EvalFailure(Exception):
    """Raised by compiled closures; ``missing`` marks what ``default()`` may replace.

    ``expr.py`` turns it into ``ExpressionEvaluationError`` naming the whole
    expression, which only it knows.
    """

    def __init__(self, detail: str, *, missing: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.missing = missing


def kind(value: Any) -> str:
    """The user's name for a value's type: JSON words, not Python class names."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, Sequence):
        return "list"
    return type(value).__name__


def a_kind(value: Any) -> str:
    """``kind`` with its article, for messages: "an integer", "a list", "null"."""
    word = kind(value)
    if value is None:
        return word
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def shown(value: Any) -> str:
    """A value for an error message, cut short: messages are stored in the run history."""
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _json_default(value: Any) -> Any:
    """Lets orjson serialise the engine's lazy Mapping/Sequence views."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return list(value)
    raise TypeError(f"{a_kind(value)} has no JSON form")


def to_text(value: Any) -> str:
    """How a value reads inside text: JSON words for null and booleans, compact JSON for
    lists and mappings, so ``"n={{ x }}"`` and ``str(x)`` agree."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return str(value)
    try:
        return orjson.dumps(value, default=_json_default).decode()
    except TypeError as exc:
        raise EvalFailure(f"cannot turn {a_kind(value)} into text: {exc}") from None


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float))


def _need(check: Callable[[Any], bool], value: Any, expected: str) -> None:
    if not check(value):
        raise TypeError(f"expects {expected}, got {a_kind(value)}")


def _len(value: Any) -> int:
    _need(lambda v: isinstance(v, (Sequence, Mapping)), value, "a string, list or mapping")
    return len(value)


def _lower(value: Any) -> str:
    _need(lambda v: isinstance(v, str), value, "a string")
    return str(value).lower()


def _upper(value: Any) -> str:
    _need(lambda v: isinstance(v, str), value, "a string")
    return str(value).upper()


def _int(value: Any) -> int:
    _need(lambda v: isinstance(v, (int, float, str)), value, "a number or string")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"cannot convert {shown(value)} to an integer") from None


def _float(value: Any) -> float:
    _need(lambda v: isinstance(v, (int, float, str)), value, "a number or string")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"cannot convert {shown(value)} to a number") from None


def _round(value: Any, digits: Any = None) -> Any:
    _need(is_number, value, "a number")
    if digits is None:
        return round(value)
    if isinstance(digits, bool) or not isinstance(digits, int) or abs(digits) > _MAX_ROUND_DIGITS:
        raise ValueError(f"digits must be an integer between -100 and 100, got {shown(digits)}")
    return round(value, digits)


def _values_of(args: tuple[Any, ...]) -> Sequence[Any]:
    """``min(list)`` or ``min(a, b, ...)``, as in Python."""
    if len(args) > 1:
        return args
    _need(_is_list, args[0], "a list or several values")
    if not args[0]:
        raise ValueError("needs at least one value, got an empty list")
    return list(args[0])


def _min(*args: Any) -> Any:
    return min(_values_of(args))


def _max(*args: Any) -> Any:
    return max(_values_of(args))


def _sum(values: Any) -> Any:
    _need(_is_list, values, "a list of numbers")
    if not all(is_number(v) for v in values):
        raise TypeError(f"expects a list of numbers, got {shown(list(values))}")
    return sum(values)


def _any(values: Any) -> bool:
    _need(_is_list, values, "a list")
    return any(values)


def _all(values: Any) -> bool:
    _need(_is_list, values, "a list")
    return all(values)


def _keys(value: Any) -> list[Any]:
    _need(lambda v: isinstance(v, Mapping), value, "a mapping")
    return list(value.keys())


def _values(value: Any) -> list[Any]:
    _need(lambda v: isinstance(v, Mapping), value, "a mapping")
    return list(value.values())


def now(scope: Scope) -> str:
    """The run's clock as ISO-8601 UTC; read from the scope so replays stay deterministic."""
    try:
        seconds = scope[NOW_KEY]
    except KeyError:
        raise EvalFailure(
            f"now() needs the current time, but the scope has no {NOW_KEY!r}"
        ) from None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise EvalFailure(f"now() needs {NOW_KEY!r} in epoch seconds, got {a_kind(seconds)}")
    try:
        return datetime.fromtimestamp(seconds, UTC).isoformat()
    except (OverflowError, ValueError, OSError) as exc:
        raise EvalFailure(f"now(): {NOW_KEY!r} is not a valid time: {exc}") from None


def call_default(value: Evaluator, fallback: Evaluator) -> Evaluator:
    """``default(x, fallback)``: ``x`` is evaluated inside a try, ``fallback`` only if needed.

    Only a missing name, key or index (or a null) is replaced; a type error or a
    division by zero is a real bug and still fails the expression.
    """

    def evaluate(scope: Scope) -> Any:
        try:
            result = value(scope)
        except EvalFailure as exc:
            if not exc.missing:
                raise
            return fallback(scope)
        return fallback(scope) if result is None else result

    return evaluate


# --- operators ----------------------------------------------------------------------------

MAX_SIZE = 1_000_000


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_size(size: int) -> None:
    """Refuses results that could exhaust memory before they are built."""
    if size > MAX_SIZE:
        raise ValueError(f"the result would have {size:,} items; the limit is {MAX_SIZE:,}")


def add(a: Any, b: Any) -> Any:
    if is_number(a) and is_number(b):
        return a + b
    if isinstance(a, str) and isinstance(b, str):
        _check_size(len(a) + len(b))
        return a + b
    if _is_list(a) and _is_list(b):
        _check_size(len(a) + len(b))
        return [*a, *b]
    raise TypeError


def _repeat(sequence: Any, count: int) -> Any:
    # Repetition shares references, so [[0] * 10**6] * 10**6 is cheap to build but
    # would make str() or == walk 10**12 items: count nested items, not just len().
    _check_size(_weight(sequence) * max(count, 0))
    return sequence * count if isinstance(sequence, str) else list(sequence) * count


def _weight(value: Any) -> int:
    """Characters or items in ``value``, nested ones included; stops just past the limit."""
    if isinstance(value, str):
        return len(value)
    children = value.values() if isinstance(value, Mapping) else value
    total = len(value)
    for child in children:
        if total > MAX_SIZE:
            break
        if isinstance(child, (str, Mapping)) or _is_list(child):
            total += _weight(child)
    return total


def multiply(a: Any, b: Any) -> Any:
    if is_number(a) and is_number(b):
        return a * b
    if _is_count(b) and (isinstance(a, str) or _is_list(a)):
        return _repeat(a, b)
    if _is_count(a) and (isinstance(b, str) or _is_list(b)):
        return _repeat(b, a)
    raise TypeError


def numeric(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``op`` restricted to numbers (so ``%`` is never string formatting)."""

    def apply(a: Any, b: Any) -> Any:
        if is_number(a) and is_number(b):
            return op(a, b)
        raise TypeError

    return apply


@dataclass(frozen=True, slots=True)
class Function:
    """A callable function: its implementation and how many arguments it takes."""

    function: Callable[..., Any]
    arity: tuple[int, int | None]


def _scope_only(_: Any = None) -> Any:
    """Placeholder for functions compiled specially (they need the scope or laziness)."""
    raise AssertionError("compiled specially")


FUNCTIONS: dict[str, Function] = {
    "len": Function(_len, (1, 1)),
    "lower": Function(_lower, (1, 1)),
    "upper": Function(_upper, (1, 1)),
    "int": Function(_int, (1, 1)),
    "float": Function(_float, (1, 1)),
    "str": Function(to_text, (1, 1)),
    "round": Function(_round, (1, 2)),
    "min": Function(_min, (1, None)),
    "max": Function(_max, (1, None)),
    "sum": Function(_sum, (1, 1)),
    "any": Function(_any, (1, 1)),
    "all": Function(_all, (1, 1)),
    "keys": Function(_keys, (1, 1)),
    "values": Function(_values, (1, 1)),
    "now": Function(_scope_only, (0, 0)),
    "default": Function(_scope_only, (2, 2)),
    "uuid": Function(_scope_only, (0, 0)),
    "random": Function(_scope_only, (0, 0)),
    "random_int": Function(_scope_only, (2, 2)),
}
