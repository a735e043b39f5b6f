"""Replay-safe randomness: ``uuid()``, ``random()`` and ``random_int(a, b)``.

The core has no randomness: these functions take their bytes from the ``Draws`` the
engine puts in the scope (a hash of the run id, the step instance and a per-call
counter, see ``tideflow.model.expressions``), so replaying or resuming a run computes
the same values. Bounds of ``random_int`` written as literals are checked when the
definition compiles; others when the expression runs.
"""

from __future__ import annotations

import ast
import uuid as _uuid
from collections.abc import Callable, Mapping
from typing import Any

from tideflow.dsl._expr_functions import EvalFailure, Evaluator, Scope, a_kind, is_number, shown
from tideflow.model.expressions import DRAWS_KEY, Draws

RANDOM_INT_LIMIT = 2**63
"""``random_int`` bounds lie in [-2**63, 2**63 - 1] (the range of a 64-bit integer)."""


def _draw(scope: Scope, name: str) -> bytes:
    draws = scope.get(DRAWS_KEY)
    if not isinstance(draws, Draws):
        raise EvalFailure(f"{name}() is only available while a run evaluates the expression")
    return draws.next()


def uuid(scope: Scope) -> str:
    """A version-4 UUID drawn from the run's replay-safe stream (see ``Draws``)."""
    return str(_uuid.UUID(bytes=_draw(scope, "uuid")[:16], version=4))


def random(scope: Scope) -> float:
    """A float in [0, 1) from 53 random bits of the run's replay-safe stream."""
    return (int.from_bytes(_draw(scope, "random")[:8], "big") >> 11) / 2**53


def check_random_int_bounds(low: Any, high: Any) -> str | None:
    """Why ``random_int(low, high)`` cannot draw, or None when it can."""
    for bound in (low, high):
        if isinstance(bound, bool) or not isinstance(bound, int):
            value = "" if bound is None or isinstance(bound, bool) else f" ({shown(bound)})"
            return f"random_int() takes two integers, got {a_kind(bound)}{value}"
        if not -RANDOM_INT_LIMIT <= bound < RANDOM_INT_LIMIT:
            return f"random_int() bounds must lie between -2**63 and 2**63 - 1, got {bound}"
    if low > high:
        return f"random_int({low}, {high}): the low bound is above the high bound"
    return None


def random_int(low: Evaluator, high: Evaluator, where: Callable[[], str]) -> Evaluator:
    """``random_int(a, b)``: an integer with a <= n <= b (both included)."""

    def evaluate(scope: Scope) -> int:
        a, b = low(scope), high(scope)
        problem = check_random_int_bounds(a, b)
        if problem is not None:
            raise EvalFailure(f"{problem} in `{where()}`")
        # 256 random bits over a span of at most 2**64 values: the bias is below 2**-190
        return int(a + int.from_bytes(_draw(scope, "random_int"), "big") % (b - a + 1))

    return evaluate


_UNKNOWN = object()


def _literal(node: ast.expr, names: Mapping[str, Any]) -> Any:
    """The value of a literal argument (``5``, ``-5``, ``'x'``, ``true``), else ``_UNKNOWN``."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _literal(node.operand, names)
        if is_number(value):
            return -value
    return _UNKNOWN


def literal_bounds_problem(node: ast.Call, names: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(message, hint)`` when ``random_int``'s literal bounds can never draw."""
    low, high = (_literal(arg, names) for arg in node.args)
    known = [value for value in (low, high) if value is not _UNKNOWN]
    for value in known:  # one literal bound can already be of the wrong kind
        problem = check_random_int_bounds(value, value)
        if problem is not None:
            return problem, "write random_int(low, high) with integers"
    if len(known) == 2:
        problem = check_random_int_bounds(low, high)
        if problem is not None:
            return problem, f"swap them: random_int({high}, {low})"
    return None
